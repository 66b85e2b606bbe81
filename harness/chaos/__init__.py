"""Faults under load against the full stack (issue 16, item 4): the stack `make run` starts
(harness: nginx in front of granian and Daphne, a Celery worker and beat) on a PRIVATE
PostgreSQL cluster and a PRIVATE Redis, driven through nginx's one port while Redis is restarted,
PostgreSQL is restarted and the Celery worker is SIGKILLed (its pool children, and once the whole
worker), one after the other in a seeded order.

    .venv/bin/python -m harness.chaos [--seed N] [--keep]     # prints a report; exit 1 on a broken rule

tests/stack/test_faults.py runs the same driver (`run()`) and asserts on its result. Modules: records
(what the clients saw, the faults, the checks' results), load (the clients), faults (the faults),
driver (the run's timeline: `Chaos`, composed of the stack it is given, the record, the load and the
faults), checks (the final checks), report, run (`run()` and the command line). The private services
and the stack (`PrivateStack`) are harness/private.py's; the lab's fault runs give `Chaos` the lab's
stack instead (harness/lab/bank.py).

1. Services of its own, so that restarting them disturbs nobody: `initdb` into a temporary directory
   as the `postgres` OS user (`runuser -u postgres --`; the newest /usr/lib/postgresql/<v>/bin), on a
   free port with its unix socket in that directory, max_connections 100; `redis-server` on a free
   port WITH persistence (appendonly yes, appendfsync everysec, no RDB snapshots, noeviction), its
   files in that directory. Persistence is chosen because a production Redis that holds the Celery
   broker's queues and the listenKeys runs with AOF, and a restart then keeps what it held: queued
   and unacknowledged task messages, listenKeys and their TTLs, channel-layer groups, and the replay
   memory (the signatures seen, and the memory epoch, docs/security.md). SHUTDOWN writes the AOF
   before Redis exits, so nothing acknowledged is lost. (Without persistence the queues would be
   lost, the beat's sweeps would have to rescue every withdrawal and collection and every listenKey
   would die.) Either way signed writes meet two seconds of -1021 once Redis is back: the service
   sees another server process and starts its replay memory again (a crash could have lost its
   last second).
   Then `manage.py migrate` and `manage.py demo --json` with DJANGO_SETTINGS_MODULE=exchange.settings.base.
2. The stack as `make run` starts it: `Layout.from_env` on a free block of ports and a temporary run
   directory, `prepare()`, `Supervisor(...).start()` (supervisord, which starts again a program that exits),
   with the rate limits out of the way and WITHDRAWAL_RETRY_AFTER_SECONDS and
   FUND_COLLECTION_RETRY_AFTER_SECONDS at 5, so that the beat's sweeps (every 30 s) finish the work
   of a killed worker. Its output goes to <run dir>/stack.log.
3. Load through nginx for the whole run: CLIENTS signed keep-alive clients sending USDT transfers
   between the demo master and peer (each request with a unique client_transfer_id and a unique
   amount), 3 websockets on the peer's listenKey, and a withdrawal every second plus a universal
   transfer to a sub-account and a fund collection every third second; every answer is recorded,
   and every request whose outcome the client cannot know (connection broken, 5xx, no answer).
4. The faults, each with load running: Redis shut down, away a few seconds, started again on its
   AOF; PostgreSQL stopped (`pg_ctl stop -m fast`), away a few seconds, started again; the worker's
   pool children SIGKILLed while withdrawals and a collection are in flight (the worker forks new
   ones and the messages are handed to them); the whole worker SIGKILLed likewise (supervisord
   starts it again; the beat's sweeps hand the unacknowledged work to it).
5. The rules (any broken one fails the run):
   - during and after every fault the service answers 200 or 503 with -1001, never a 500 (-1000) or
     another 5xx, and no request goes unanswered for HUNG_SECONDS; after the fault the clients get
     a 200 again within RECOVERY_SECONDS;
   - at the end, load stopped: `manage.py ledger_check` passes; every transfer answered 200 exists
     exactly once with the id answered; every refused one (4xx) does not exist; every unknown
     outcome is resolved by querying (GET .../transfers?client_transfer_id=, and the database) as
     done or not done, never twice;
   - every withdrawal and collection reached a final state and settled exactly once: a withdrawal's
     postings are `withdrawal:<id>:hold` and one of `:settle`/`:release` matching its stage, with at
     most one broadcast; a collection has one outcome per sub-account and one posting per collected
     sub-account (`fund-collect:<id>:<sub>`);
   - every websocket that stayed connected received exactly one outboundAccountPosition per posting
     that touched the peer while it listened (the change feed, accounts_balancechange, from the
     peer's sequence when it connected), in order, the last with the database's balance. A
     connection the server closed reconnects with a listenKey asked for again and starts counting
     afresh; what it received before the close must be a gapless run of the feed. Reported.
"""
