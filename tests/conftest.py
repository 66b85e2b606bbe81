"""Fixtures shared by every test: thin wrappers around tests/support (factories, the signed
client); helpers are imported from tests/support, never from a conftest module."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import warnings
from io import StringIO

import pytest
from asgiref.sync import SyncToAsync
from celery import _state as celery_state
from channels.layers import channel_layers
from django.core.management import call_command
from django.db import connections
from django.db.backends.signals import connection_created
from django.dispatch import receiver

# The ASGI application's module calls django.setup() again when first imported, which reconfigures
# logging and drops the root's handlers, caplog's included: a test that opened the first websocket
# of its process saw an empty caplog (tests/streams/test_hub.py's slow-consumer test, run alone).
import exchange.asgi  # noqa: F401
from accounts.keyring import keyrings
from accounts.ledger.posting import forget_asset_ids
from accounts.ledger.system import forget_cached_ids
from exchange.api import ratelimit
from exchange.runtime.ttlcache import clear_all
from exchange.settings import testnames
from streams import relay
from tests.support import flush, loop_teardown, skips, stack
from tests.support.client import SignedClient
from tests.support.factories import ApiKeyFactory, UserFactory
from tests.support.streams import forget_listen_keys

flush.install()  # a transactional test's flush truncates only what holds rows
loop_teardown.install()  # each async test's loop ends within seconds, or the test errors with the stuck tasks


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    stack.fail_without_services(item)  # before the test's fixtures start any process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip not listed in tests/support/skips.py fails the test: it proved nothing."""
    outcome = yield
    skips.fail_if_unexpected(outcome.get_result(), connections["default"].vendor)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """... and a module skipped as a whole (pytest.skip(allow_module_level=True)) fails the run too."""
    outcome = yield
    skips.fail_if_unexpected(outcome.get_result(), connections["default"].vendor)


# Isolation: under pytest-xdist (`make test` runs `-n 2 --dist loadfile`) every private resource is
# named per worker: the test database (pytest-django's _gwN suffix), the Redis databases
# (exchange/settings/testnames.py), the databases of the modules that start processes
# (tests/support/stack.py), ports (free ones, from the kernel) and run folders (tmp_path). No module
# has to run alone; --dist loadfile keeps a module's tests (and its module-scoped stack) on one worker.
#
# The longest modules are handed out first (xdist gives each worker two modules to start with, then
# the next one in collection order as it finishes): started last, the simulation alone would keep one
# worker busy for minutes after the other ran out of work. Ordered so the first four alternate
# between the workers; measured with `make test PYTEST_ARGS=--durations=30`.
RUN_FIRST = (
    "tests/stack/test_simulation.py",
    "tests/streams/test_full_stack.py",
    "tests/stack/test_faults.py",
    "tests/subaccounts/test_collect.py",
    "tests/convert/test_simulation.py",
    "tests/streams/test_fairness.py",
    "tests/security/test_revocation_bound.py",
    "tests/ledger/test_concurrency.py",
    "tests/streams/test_revocation_full_stack.py",
    "tests/stack/test_limits.py",
    "tests/wallet/test_worker_crash.py",
    "tests/stack/test_readme_commands.py",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    rank = {path: index for index, path in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(RUN_FIRST)))  # stable


@receiver(connection_created)
def _name_the_connection(sender, connection, **kwargs):
    """Each test connection says which thread of which test opened it (pg_stat_activity's
    application_name): a connection left open names its owner (django_db_setup below)."""
    if connection.vendor == "postgresql":
        test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
        name = f"{threading.current_thread().name[:24]} {test[-38:]}"
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('application_name', %s, false)", [name])


def pytest_configure(config):
    """Under xdist the controller gives its workers its own run id (`--testrunuid`, which the workers
    see as PYTEST_XDIST_TESTRUNUID): the demo template the workers build is marked with it, and the
    controller, which drops the template at the end, recognises it as its run's."""
    if not testnames.worker() and hasattr(config.option, "testrunuid") and config.option.testrunuid is None:
        config.option.testrunuid = stack.RUN_ID


def pytest_sessionfinish(session):
    if not testnames.worker():  # the xdist controller, or the only process: every worker is done
        stack.drop_demo_template()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database; before it is dropped, every other session on it is named
    (tests/README.md) and ended, so that the drop does not fail ("being accessed by other users").
    Causes found: an async test's sync_to_async thread (closed after each test, below) and the
    browser tests' database calls while Playwright's loop runs (closed by tests/backoffice/conftest.py's
    `browser`); a clean run names none."""
    yield
    with django_db_blocker.unblock():
        # A session just closed ends on the server a moment later (as DROP DATABASE, wait up to 5 s).
        deadline = time.monotonic() + 5
        while (left := stack.other_connections(connections["default"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            stack.end_other_connections(connections["default"])
            warnings.warn(f"connections to the test database left open at the end of the run: {left}", stacklevel=1)


def pytest_terminal_summary(terminalreporter):
    if loop_teardown.SLOW_TEARDOWNS:
        terminalreporter.write_line(
            f"{len(loop_teardown.SLOW_TEARDOWNS)} event loop(s) needed more than one round of cancellation at "
            f"teardown (at most {max(loop_teardown.SLOW_TEARDOWNS)})"
        )


_DB_BLOCKER = pytest.StashKey()


@pytest.fixture(autouse=True)
def _fresh_rate_limits(request, django_db_blocker):
    """Each test starts with empty counters and no bans in the (real, Redis) limit storage (which
    has then seen no signature: its replay memory is complete, see ratelimit.Counters.reset)."""
    ratelimit.counters().reset()
    keyrings.clear()
    forget_asset_ids()  # the database is rolled back between tests; ids are not reused
    forget_cached_ids()
    clear_all()  # cached reference data of rolled-back tests
    forget_listen_keys()  # account ids restart in a new test database: old keys would point at them
    # Celery's process-wide "inside a worker: never wait on a result" flag: code an earlier test ran
    # in this process can leave it set (seen once the simulation ran first on a worker: a later
    # `ledger_check_task.delay().get()` raised "Never call result.get() within a task!"). The cause:
    # an eager apply_async (CELERY_TASK_ALWAYS_EAGER) sets the flag for its duration and puts back
    # what it found (celery.result.denied_join_result), and the flag is one global, not per thread;
    # two threads applying eagerly at once can leave it set for good. Each test starts as a plain process.
    celery_state._set_task_join_will_block(False)
    # A new channel layer per test: each test runs in its own event loop, and a Redis layer that
    # outlived a test whose receives were cancelled (the streams hub lets go of its receive without
    # waiting) may keep that loop's receive state; in whole-suite runs a later test's loop then
    # waited for ever at teardown (never alone). Production has one layer per process and loop.
    channel_layers.backends.clear()
    request.node.stash[_DB_BLOCKER] = django_db_blocker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """What the test posted is published now, not into the next test: account ids restart in each
    test database, so a late publish would reach the next test's streams as its own account's (seen
    in whole-suite runs: a sub-account transfer of an earlier test in a later test's stream). After
    every fixture's teardown, the test database's included: the publisher marks rows published on a
    connection of its own, which SQLite's lock held by a test's open transaction kept waiting until
    the drain gave up (5 s after each such test of the embedded run). The publisher may still use
    the database meanwhile (pytest-django blocks it between tests)."""
    yield
    blocker = item.stash.get(_DB_BLOCKER, None)
    with blocker.unblock() if blocker is not None else contextlib.nullcontext():
        relay.drain(5)
        _close_sync_thread_connections()
    ratelimit.storage().reset()


def _close_sync_thread_connections() -> None:
    """An async test's `sync_to_async(...)` (thread_sensitive, no outer async_to_sync) runs in
    asgiref's one process-wide thread, whose database connection no request end ever closes: it
    stayed open from test to test and, at the end of the run, kept pytest-django from dropping the
    test database ("being accessed by other users"). Closed after each test, in that thread."""
    executor = SyncToAsync.single_thread_executor
    if executor._threads:  # only when an async test has started it
        executor.submit(connections.close_all).result(timeout=30)


@pytest.fixture
def make_user(db):
    """`make_user(email=None, phone=None, master=None, **fields)`: UserFactory."""

    def make(email: str | None = None, phone: str | None = None, master=None, **extra):
        if email is not None:
            extra["email"] = email
        return UserFactory(phone=phone, master=master, **extra)

    return make


@pytest.fixture
def make_key(db):
    """`make_key(user, types=None, ip_list=None, ip_restrict=None, name="test")`: `(ApiKey, secret)`."""

    def make(user, *, types=None, ip_list=None, ip_restrict=None, name="test"):
        return ApiKeyFactory(user=user, name=name, types=types, ip_list=ip_list, ip_restrict=ip_restrict)

    return make


@pytest.fixture
def demo(db):
    """The whole demo world (`manage.py demo`): assets, networks, funded accounts, the master's
    whitelist. For tests about the demo world; others build what they need with tests/support."""
    out = StringIO()
    call_command("demo", "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def master(make_user):
    return make_user(email="master@test.example", phone="+639170000001")


@pytest.fixture
def master_key(master, make_key):
    return make_key(master, name="master")


@pytest.fixture
def signed_client(master_key):
    return SignedClient.of(master_key)
