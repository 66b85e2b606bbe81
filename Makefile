# The two commands of the README: `make run` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PORT ?= 8000
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-installed
DEV_STAMP := $(VENV)/.dev-installed
TEST_REDIS_DB ?= 15
# The SQLite run beside it (scripts/test-suites.sh) takes 7-4: a Redis of 16 databases holds both.
EMBEDDED_REDIS_DB ?= 7
# `make test` runs the suite on TEST_WORKERS pytest-xdist workers (0: in one process), a test module
# per worker at a time (--dist loadfile). Each worker has its own test database (suffix _gwN), its own
# four Redis databases from REDIS_URL's number downwards (15-12, 11-8, ...) and its own names for the
# databases its modules create: exchange/settings/testnames.py, tests/README.md ("Isolation").
TEST_WORKERS ?= 2

.PHONY: run test lint bench services clean lab-test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(RUN_STAMP): requirements.txt | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(DEV_STAMP): requirements.txt requirements-dev.txt | $(PY)
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@ $(RUN_STAMP)

## make run: serve HTTP and websocket on 127.0.0.1:$(PORT) with the demo world loaded.
## Embedded (SQLite, in-memory layers, tasks in-process) unless DATABASE_URL and REDIS_URL are set,
## then the production topology (harness/, under supervisord): nginx on $(PORT) in front of granian
## (REST) and Daphne (websocket), a Celery worker and beat, PostgreSQL and Redis; nginx is installed when missing.
run: $(RUN_STAMP)
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py collectstatic --noinput -v 0
	$(PY) manage.py demo
	@if [ -n "$$DATABASE_URL" ] && [ -n "$$REDIS_URL" ]; then \
		PORT=$(PORT) exec $(PY) -m harness; \
	else \
		echo "Embedded on 127.0.0.1:$(PORT): SQLite (var/), in-memory channel layer, tasks in-process"; \
		exec $(VENV)/bin/daphne -b 127.0.0.1 -p $(PORT) --ping-interval 20 --ping-timeout 30 exchange.asgi:application; \
	fi

## make services: install the Debian packages the tests need (scripts/packages/test.txt: PostgreSQL,
## Redis, nginx, chromium, haproxy; apt-get update first, their own services kept from starting) and
## start PostgreSQL and Redis for tests and benchmarks.
services:
	@mkdir -p var
	./scripts/services.sh > var/services.env

## make test: the Debian packages of scripts/packages/test.txt (installed when missing), real PostgreSQL
## and Redis, lint, then the whole test suite on TEST_WORKERS workers (soak tests included) and, beside it
## in one more process (scripts/test-suites.sh), the tests of the
## embedded mode's own SQL (the ledger's portable write, limit counters, transfers, keyrings, conversions,
## sub-account transfers and collections) on SQLite. A skip that tests/support/skips.py does not list fails.
EMBEDDED_TESTS ?= tests/ledger/test_posting.py tests/ledger/test_counters.py tests/wallet/test_transfers.py \
	tests/wallet/test_withdraw_life.py tests/accounts/test_account_endpoints.py tests/accounts/test_keyring.py \
	tests/ledger/test_house_shards.py tests/convert/test_accept.py tests/subaccounts/test_transfers.py \
	tests/subaccounts/test_collect.py tests/subaccounts/test_untimed_refusals.py tests/subaccounts/test_requested_emails.py \
	tests/subaccounts/test_clients.py tests/backoffice/test_dashboard.py \
	tests/exchange/test_amount_bounds.py tests/wallet/test_transfer_recipients.py tests/ledger/test_check.py \
	tests/convert/test_no_arbitrage.py tests/backoffice/test_identifiers_four_eyes.py tests/accounts/test_keyring_database_log.py
test: $(DEV_STAMP) services
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	PY=$(PY) TEST_WORKERS=$(TEST_WORKERS) TEST_REDIS_DB=$(TEST_REDIS_DB) EMBEDDED_REDIS_DB=$(EMBEDDED_REDIS_DB) \
		EMBEDDED_TESTS="$(EMBEDDED_TESTS)" PYTEST_ARGS="$(PYTEST_ARGS)" ./scripts/test-suites.sh

## make lab-test: the HA lab (docs/scaling.md, needs root and network namespaces): its Debian packages
## (scripts/packages/test.txt and lab.txt) installed when missing (their own services kept from starting), then under the lab's lock
## (/tmp/exchange-lab.lock, one lab per machine) the lab up, every fault in turn (pg-kill, pg-cut,
## pg-disk, redis-kill, sentinel-cut, rolling), hostfault, a one-minute `python -m harness.simulation --lab`, the
## lab down whatever happened; one table of PASS/FAIL, windows and seconds; non-zero if any failed.
LAB_LOCK ?= /tmp/exchange-lab.lock
lab-test: $(DEV_STAMP)
	./scripts/lab-packages.sh
	flock $(LAB_LOCK) $(PY) -m harness.lab test $(LAB_TEST_ARGS)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## make bench: every benchmark under bench/ (each starts and stops what it needs; one is
## `$(PY) -m bench.NAME`).
bench: $(DEV_STAMP) services
	@set -e; for script in bench/[a-z]*.py; do \
		name=$$(basename "$$script" .py); echo "== bench.$$name"; $(PY) -m "bench.$$name"; done

clean:
	rm -rf var/static var/*.sqlite3* .pytest_cache
