"""The embedded mode's revocation log in the database (issue 34, finding 4; accounts/keyring.py):
without Redis a key change appends its account to RevocationLog in the change's transaction, and
every process's cache, which reads the log every API_KEY_REVOCATION_SECONDS / 4, evicts it within
API_KEY_REVOCATION_SECONDS. Another KeyringCache stands for another process here; the real
several-process measurement (an embedded Daphne and `manage.py apikey disable`) is
tests/security/test_embedded_revocation.py. Runs on PostgreSQL and SQLite (Makefile EMBEDDED_TESTS).
"""

import sys
import threading
import time

import pytest
from django.db import transaction
from django.test import override_settings

import accounts.keyring as keyring_module
from accounts import revocation_log, services
from accounts.keyring import KeyringCache
from accounts.models import RevocationLog, RevocationSequence
from accounts.revocation_log import DATABASE_LOG_ID
from tests.support.keyring import record_evictions, warm
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def embedded():
    with override_settings(REDIS_URL=""):  # no Redis: the database's log is the only cross-process signal
        yield


def _read_by_hand() -> KeyringCache:
    """Another process's cache whose log is read only when the test calls sync() (no reader
    thread: nothing reads between the test's steps)."""
    cache = KeyringCache()
    cache._log_reader = threading.Thread()  # never started
    cache.sync()
    return cache


def _cached(cache: KeyringCache, *keys: str) -> None:
    cache.sync()
    for key in keys:
        cache.lookup(key)
        assert cache.cached(key)


def _sequence() -> int:
    return RevocationSequence.objects.values_list("value", flat=True).first() or 0


def test_a_key_disabled_elsewhere_is_evicted_within_the_bound(make_user, make_key, capsys):
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()
    warm(other_process, api_key.key)
    assert other_process._log_position[0] == DATABASE_LOG_ID
    evictions = record_evictions(other_process)
    committed = []
    with transaction.atomic():
        transaction.on_commit(lambda: committed.append(time.monotonic()))  # the first after-commit step
        services.api_key_set_status(api_key=api_key, enabled=False)

    wait_until(lambda: any(user == api_key.user_id for _, user in evictions), what="the eviction")
    seconds = next(at for at, user in evictions if user == api_key.user_id) - committed[0]
    assert not other_process.lookup(api_key.key)[1].is_enabled
    with capsys.disabled():
        sys.stdout.write(f"\n  no Redis: another process evicted the disabled key {seconds * 1000:.0f} ms after\n")
    assert seconds < keyring_module.settings.API_KEY_REVOCATION_SECONDS


def test_without_the_entry_the_other_process_keeps_trusting_its_cache(make_user, make_key, monkeypatch):
    """The control: with the append switched off the other process never hears of the change (as
    before issue 34: trusted until API_KEY_CACHE_SECONDS)."""
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()
    warm(other_process, api_key.key)
    monkeypatch.setattr(keyring_module, "log_revocation", lambda account_id: None)
    services.api_key_set_status(api_key=api_key, enabled=False)
    moment = time.monotonic()
    bound = keyring_module.settings.API_KEY_REVOCATION_SECONDS
    wait_until(lambda: other_process._trust_until > moment + bound, what="a read of the log after the change")
    assert other_process.cached(api_key.key)


def test_the_entry_commits_with_the_change_or_not_at_all(make_user, make_key):
    api_key, _ = make_key(make_user())
    before = (_sequence(), RevocationLog.objects.count())

    def change_then_fail() -> None:
        with transaction.atomic():
            services.api_key_set_status(api_key=api_key, enabled=False)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        change_then_fail()
    assert (_sequence(), RevocationLog.objects.count()) == before
    services.api_key_set_status(api_key=api_key, enabled=False)
    assert _sequence() == before[0] + 1
    assert RevocationLog.objects.get(seq=_sequence()).account_id == api_key.user_id


def test_a_reader_further_behind_than_the_log_or_a_reset_counter_starts_clean(make_user, make_key):
    api_key, _ = make_key(make_user())
    other_process = _read_by_hand()
    _cached(other_process, api_key.key)
    _, sequence = other_process._log_position
    RevocationSequence.objects.filter(pk=1).update(value=sequence + keyring_module.LOG_LENGTH + 5)
    other_process.sync()
    assert not other_process._keyrings
    _cached(other_process, api_key.key)
    RevocationSequence.objects.filter(pk=1).update(value=0)  # a database flushed (tests) or recreated
    other_process.sync()
    assert not other_process._keyrings


def test_a_missing_entry_clears_the_cache(make_user, make_key):
    """Entries trimmed (or lost) between the reader's position and the counter: anything may have
    changed, so it forgets everything (an untouched account's keyring too) rather than skip them."""
    api_key, _ = make_key(make_user())
    untouched, _ = make_key(make_user())
    other_process = _read_by_hand()
    _cached(other_process, api_key.key, untouched.key)
    services.api_key_set_status(api_key=api_key, enabled=True)
    RevocationLog.objects.filter(seq=_sequence()).delete()
    services.api_key_set_status(api_key=api_key, enabled=True)
    other_process.sync()
    assert untouched.user_id not in other_process._keyrings


def test_entries_evict_only_their_accounts(make_user, make_key):
    """The control of the one above: with every entry there, only the changed account is evicted."""
    api_key, _ = make_key(make_user())
    untouched, _ = make_key(make_user())
    other_process = _read_by_hand()
    _cached(other_process, api_key.key, untouched.key)
    services.api_key_set_status(api_key=api_key, enabled=True)
    services.api_key_set_status(api_key=api_key, enabled=True)
    other_process.sync()
    assert api_key.user_id not in other_process._keyrings
    assert untouched.user_id in other_process._keyrings


def test_the_log_is_trimmed_to_its_length(make_user, monkeypatch):
    user = make_user()
    monkeypatch.setattr(revocation_log, "LOG_LENGTH", 3)
    monkeypatch.setattr(revocation_log, "TRIM_EVERY", 2)
    for _ in range(6):
        revocation_log.log_revocation(user.pk)
    sequence = _sequence()
    assert set(RevocationLog.objects.values_list("seq", flat=True)) <= set(range(sequence - 3, sequence + 1))
