"""A seeded simulation of the whole exchange in the spirit of TigerBeetle's VOPR and Jepsen's bank
test (issue 18, item 6): `python -m harness.simulation --seed N --minutes M` (harness/simulation/run.py, `main`).

1. The world: harness/private.py's private PostgreSQL cluster and private Redis (AOF), migrated, with
   `manage.py demo --customers K`: K customers, each a master with one sub-account, keys for both,
   funding and a withdrawal whitelist. The stack exactly as `make run` starts it (harness:
   nginx, granian, Daphne, Celery worker and beat), through nginx's one port; the simulated chain's
   blocks every second.
2. The schedule: from the seed alone (`schedule()`; the same seed gives the same schedule, its digest
   is printed): operations at Poisson-distributed times, each with its customer, counterparty, asset
   and amount - deposits (the customer asks for its deposit address, and the simulated chain's
   outside world sends coins there), withdrawals (the worker broadcasts and settles them), transfers
   between customers, conversions (quote, accept), universal transfers master <-> sub-account,
   sub-to-master transfers signed by the sub-account, fund collections, key changes (the master
   restricts its sub-account's key to a foreign IP and lifts it again; meanwhile the sub-account's
   requests must be refused), a quote accepted after its expiry, a client id sent again, and a
   signed request replayed byte for byte - and infrastructure faults at random times: the Celery
   worker SIGKILLed (whole, or its pool children), Redis restarted, PostgreSQL restarted, and every
   database connection in a transaction terminated (pg_terminate_backend: dropped mid-transaction).
3. Every customer keeps a websocket on its listenKey for the whole run (again after the server
   closes one). The cycle customer (the demo's master) converts round cycles of currencies
   (issue 25, finding 1): the seed's plan over the supported pairs, each leg's source amount what
   the previous leg delivered; a witness (the demo's peer) quotes every direction of a completed
   cycle right after its last leg.
4. The end checks, load stopped and the work in flight settled:
   - `manage.py ledger_check` passes;
   - every account's balance (free + locked, from the API) equals its starting balance plus the sum of
     what the simulator saw acknowledged: deposits the service reports credited, transfers, conversions,
     sub-account transfers and collections answered 200, withdrawals by their final state. An unknown
     outcome (no answer, a 5xx) is resolved as the client would: by asking the service with the
     client id. Nothing locked is left over;
   - no answer broke a rule: never a 5xx but 503 -1001, never a request hung; a client id sent again,
     a replayed signature, an expired quote and a restricted key were all refused;
   - every websocket that stayed connected received every committed change of its account exactly
     once and in order, the last with the database's balance (one the server closed: a gapless run);
   - the house's convert P&L: no successful order lost at its own quote's market price;
   - no completed cycle ended richer than the market moved while it went round (check_cycles).

Modules: plan (the schedule from the seed), moves (a client id's life), flows (the operations),
faults (the faults and the customers' websockets), cycles (the cycle customer), settle (the work in
flight settled, unknown outcomes resolved), checks (the end checks), world (the record and the
customers' signed calls), driver (the run's timeline: `Simulation`, composed of one object of each of
these, each given the stack, the customers and the record it uses), run (`run()`, the report, the
command line), lab (`--lab`: on the HA lab, with its stack and its faults).
"""
