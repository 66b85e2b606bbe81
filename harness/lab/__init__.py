"""The HA lab (issue 28, docs/scaling.md): on this one machine, as separate hosts each in its own
network namespace on the bridge `xlab0` (10.77.0.0/24), three etcd members and three PostgreSQL
nodes under Patroni (synchronous_mode) on db1..db3, three Redis servers (one primary, two replicas)
and three sentinels on redis1..redis3. The application runs in the machine's own namespace and
finds the primaries itself (a libpq multi-host DATABASE_URL, Redis through Sentinel).

    python -m harness.lab up       # namespaces, configuration, supervisord; waits for the primaries
    python -m harness.lab status   # who leads
    python -m harness.lab env      # the application's DATABASE_URL / REDIS_SENTINELS
    python -m harness.lab fault [NAME]  # the stack on the lab under load, a fault, the bank check
    python -m harness.lab down     # stop everything, delete the namespaces and the data
    python -m harness.lab test     # up, every fault, hostfault, simulate --lab, down; one table

Modules: topology (hosts and addresses), net (namespaces, veth pairs, the bridge, a link cut),
config (etcd's command line, patroni.yml, redis.conf, sentinel.conf), cluster (supervisord over
all of it, waiting, asking who leads), fault (the command line and the faults' helpers),
bank (the one load and bank check every fault shares), faults (pg-kill, pg-cut, pg-disk, redis-kill,
sentinel-cut), suite (`test`: all of them in turn, what `make lab-test` runs), etcd_wait (Patroni's
start: etcd's cluster version decided first), bench_accounts (the host fault run's funded accounts).
Debian's binaries (packages etcd-server, redis-sentinel, postgresql) and Patroni 3.1.2 from PyPI (its
own virtualenv, cluster.ensure_patroni) run directly under supervisord, each inside its host's
namespace (`ip netns exec`); PostgreSQL as user postgres. The application connects as its own role
`exchange` (LOGIN, CREATEDB), never as the superuser.
"""
