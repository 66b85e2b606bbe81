#!/usr/bin/env bash
# make test's two pytest runs (the Makefile's test target, after lint), side by side:
#   1. the whole suite on PostgreSQL and Redis, on TEST_WORKERS pytest-xdist workers;
#   2. the embedded mode's own SQL again on SQLite (EMBEDDED_TESTS, exchange.settings.test_sqlite),
#      in one process beside run 1: run 1's workers leave a core idle while they wait (servers
#      starting, soak runs, a worker-crash test waiting for a redelivery), and run 2 fills it.
# Each run has resources of its own: run 2 takes the Redis databases from EMBEDDED_REDIS_DB down
# (run 1 takes them from TEST_REDIS_DB down, four per worker) and its own names for the databases
# its modules create (the *_DATABASE_NAME overrides of exchange/settings/testnames.py); ports are free
# ones. Run 2's output is printed after run 1's (it is in var/test-embedded.log); the exit status is
# non-zero if either failed.
set -uo pipefail

: "${PY:?}" "${TEST_WORKERS:?}" "${TEST_REDIS_DB:?}" "${EMBEDDED_REDIS_DB:?}" "${EMBEDDED_TESTS:?}"
set -a
# shellcheck disable=SC1091
source var/services.env
set +a
server=${REDIS_URL%/*}
log=var/test-embedded.log

(
	export REDIS_URL="$server/$EMBEDDED_REDIS_DB" DJANGO_SETTINGS_MODULE=exchange.settings.test_sqlite
	export FULLSTACK_DATABASE_NAME=exchange_fullstack_embedded CRASH_DATABASE_NAME=exchange_crash_embedded
	export POOL_DATABASE_NAME=exchange_pool_embedded
	unset TEST_REDIS_DBS
	# shellcheck disable=SC2086 # EMBEDDED_TESTS is a list of paths
	exec "$PY" -m pytest -q -p no:cacheprovider $EMBEDDED_TESTS
) >"$log" 2>&1 &
embedded=$!

# --no-loadscope-reorder: the modules are handed out in the order tests/conftest.py sorts them (its
# RUN_FIRST, the longest first), not xdist's default (most tests first, which left the one-test soak
# modules, minutes long, to the end).
# shellcheck disable=SC2086 # PYTEST_ARGS is a list of arguments
REDIS_URL="$server/$TEST_REDIS_DB" DJANGO_SETTINGS_MODULE=exchange.settings.test \
	"$PY" -m pytest -n "$TEST_WORKERS" --dist loadfile --no-loadscope-reorder ${PYTEST_ARGS:-}
suite=$?

echo "== the embedded mode's own SQL on SQLite (ran beside the suite above; $log):"
wait "$embedded"
sqlite=$?
cat "$log"
echo "== make test: the suite exited $suite, the SQLite run $sqlite"
[ "$suite" -eq 0 ] && [ "$sqlite" -eq 0 ]
