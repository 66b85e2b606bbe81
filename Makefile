# The two commands of the README: `make run` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PORT ?= 8000
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUN_STAMP := $(VENV)/.run-installed
DEV_STAMP := $(VENV)/.dev-installed
TEST_REDIS_DB ?= 15
# `make test TEST_WORKERS=2` runs the suite on 2 pytest-xdist workers; worker gwN uses the Nth Redis
# database of TEST_REDIS_DBS (exchange/settings/test.py) and its own test database (suffix _gwN).
# 0 (in one process) until the parallel run is reliable: see tests/README.md.
TEST_WORKERS ?= 0
TEST_REDIS_DBS ?= 15,14,13,12

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
## then the production topology (exchange/stack/, under supervisord): nginx on $(PORT) in front of granian
## (REST) and Daphne (websocket), a Celery worker and beat, PostgreSQL and Redis; nginx is installed when missing.
run: $(RUN_STAMP)
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py collectstatic --noinput -v 0
	$(PY) manage.py demo
	@if [ -n "$$DATABASE_URL" ] && [ -n "$$REDIS_URL" ]; then \
		PORT=$(PORT) exec $(PY) -m exchange.stack; \
	else \
		echo "Embedded on 127.0.0.1:$(PORT): SQLite (var/), in-memory channel layer, tasks in-process"; \
		exec $(VENV)/bin/daphne -b 127.0.0.1 -p $(PORT) --ping-interval 20 --ping-timeout 30 exchange.asgi:application; \
	fi

## make services: install (Debian packages) and start PostgreSQL and Redis for tests and benchmarks;
## install Debian's chromium for the browser tests (tests/backoffice, Playwright from requirements-dev.txt).
services:
	@mkdir -p var
	./scripts/services.sh > var/services.env

## make test: real PostgreSQL and Redis (and Debian's chromium for the back office's browser tests),
## lint, then the whole test suite; then the tests of the
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
	set -a && source var/services.env && REDIS_URL=$${REDIS_URL%/*}/$(TEST_REDIS_DB) && \
		TEST_REDIS_DBS=$(TEST_REDIS_DBS) DJANGO_SETTINGS_MODULE=exchange.settings.test \
		$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
	set -a && source var/services.env && REDIS_URL=$${REDIS_URL%/*}/$(TEST_REDIS_DB) && \
		TEST_REDIS_DBS=$(TEST_REDIS_DBS) DJANGO_SETTINGS_MODULE=exchange.settings.test_sqlite \
		$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(EMBEDDED_TESTS)

## make lab-test: the HA lab (docs/scaling.md, needs root and network namespaces): its Debian packages
## installed when missing (their own services kept from starting), then under the lab's lock
## (/tmp/exchange-lab.lock, one lab per machine) the lab up, every fault in turn (pg-kill, pg-cut,
## pg-disk, redis-kill, sentinel-cut, rolling), hostfault, a one-minute `manage.py simulate --lab`, the
## lab down whatever happened; one table of PASS/FAIL, windows and seconds; non-zero if any failed.
LAB_LOCK ?= /tmp/exchange-lab.lock
lab-test: $(DEV_STAMP)
	./scripts/lab-packages.sh
	flock $(LAB_LOCK) $(PY) -m exchange.stack.lab test $(LAB_TEST_ARGS)

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
