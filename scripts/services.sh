#!/usr/bin/env bash
# Make sure the PostgreSQL and Redis that tests and benchmarks use are installed and running, and
# that Debian's chromium is there for the browser tests.
# Installs them from Debian packages when missing (needs root), starts them, creates the
# `exchange` role and database. Idempotent; prints the URLs to use.
set -euo pipefail

PG_USER=exchange
PG_PASSWORD=exchange
PG_DB=exchange
REDIS_PORT=${REDIS_PORT:-6379}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql postgresql-contrib)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing ${missing[*]} from Debian packages" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# nginx: the full stack's front (exchange/stack; the fault tests start that stack). Installed, not
# started: a policy-rc.d keeps the package from starting its own server on port 80.
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "Installing nginx-light from Debian packages" >&2
  added_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
    as_root chmod 755 /usr/sbin/policy-rc.d
    added_policy=1
  fi
  [ ${#missing[@]} -gt 0 ] || as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
  [ -z "$added_policy" ] || as_root rm -f /usr/sbin/policy-rc.d
fi

# Chromium: the browser tests of the back office (tests/backoffice) drive Debian's chromium through
# Playwright; nothing downloads a browser at run time.
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  echo "Installing chromium from Debian packages" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

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

# Redis: answer on the port, or start one without persistence.
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  redis-server --daemonize yes --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null
  for _ in $(seq 1 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

echo "DATABASE_URL=postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$port/$PG_DB"
echo "REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
