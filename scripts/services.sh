#!/usr/bin/env bash
# Make sure the Debian packages the tests need are installed (scripts/packages/test.txt), and the
# PostgreSQL and Redis that tests and benchmarks use are running. Installs the packages when missing
# (needs root), starts the servers, creates the `exchange` role and database. Idempotent; prints the
# URLs to use (and nothing else on stdout).
set -euo pipefail

PG_USER=exchange
PG_PASSWORD=exchange
PG_DB=exchange
REDIS_PORT=${REDIS_PORT:-6379}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# The Debian packages of the test run (scripts/packages/test.txt: PostgreSQL, Redis, nginx, chromium,
# haproxy), installed when missing, their own services kept from starting (scripts/install-packages.sh);
# this script starts PostgreSQL and Redis below.
"$(dirname "$0")/install-packages.sh" "$(dirname "$0")/packages/test.txt" >&2

# PostgreSQL: the first cluster of the newest installed version.
version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
cluster=$(pg_lsclusters -h 2>/dev/null | awk -v v="$version" '$1 == v {print $2; exit}')
if [ -z "$cluster" ]; then
  cluster=main
  as_root pg_createcluster "$version" "$cluster" >/dev/null
fi
if ! pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $4}' | grep -q online; then
  as_root pg_ctlcluster "$version" "$cluster" start >&2
fi
port=$(pg_lsclusters -h | awk -v v="$version" -v c="$cluster" '$1 == v && $2 == c {print $3}')
for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.2; done
psql_admin() { as_root runuser -u postgres -- psql -p "$port" -v ON_ERROR_STOP=1 -qtA "$@"; }
# Each transaction's commit time (pg_xact_commit_timestamp): bench/fullstack measures events from the
# posting's commit, not from before its lock wait. Needs a restart, once.
if [ "$(psql_admin -c "SHOW track_commit_timestamp")" != "on" ]; then
  psql_admin -c "ALTER SYSTEM SET track_commit_timestamp = on"
  as_root pg_ctlcluster "$version" "$cluster" restart >&2
  for _ in $(seq 1 50); do pg_isready -q -h 127.0.0.1 -p "$port" && break; sleep 0.2; done
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER'")" != "1" ]; then
  psql_admin -c "CREATE ROLE $PG_USER LOGIN CREATEDB PASSWORD '$PG_PASSWORD'"
fi
# The tests of reads on a replica copy this server with pg_basebackup as this role (tests/support/replica.py);
# Debian's pg_hba.conf already lets local replication connections in with a password.
if [ "$(psql_admin -c "SELECT rolreplication FROM pg_roles WHERE rolname = '$PG_USER'")" != "t" ]; then
  psql_admin -c "ALTER ROLE $PG_USER REPLICATION"
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'")" != "1" ]; then
  psql_admin -c "CREATE DATABASE $PG_DB OWNER $PG_USER"
fi

# Redis: answer on the port, or start one without persistence, with 64 databases (each pytest-xdist
# worker takes four: exchange/settings/testnames.py).
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  redis-server --daemonize yes --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --databases 64 >/dev/null
  for _ in $(seq 1 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

echo "DATABASE_URL=postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$port/$PG_DB"
echo "REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
