"""The keyring's revocation log (accounts/keyring.py): a revocation reaches another process's cache
within API_KEY_REVOCATION_SECONDS even when the pub/sub message is lost, and a process that cannot
read the log stops trusting its cache. Real Redis and real transactions (the log is written after
commit). The several-process measurement is tests/security/test_revocation_bound.py."""

import sys
import time

import pytest
from django.test import override_settings

import accounts.keyring as keyring_module
from accounts import services
from accounts.keyring import LOG_KEYS, KeyringCache, keyrings
from tests.support.keyring import record_evictions, warm
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def committed(monkeypatch) -> list[float]:
    """When this process's key changes committed: the start of each after-commit eviction, which
    appends the change to the revocation log (and publishes it)."""
    times: list[float] = []
    evict_everywhere = keyrings._evict_everywhere

    def timed(user_id: int) -> None:
        times.append(time.monotonic())
        evict_everywhere(user_id)

    monkeypatch.setattr(keyrings, "_evict_everywhere", timed)
    return times


def _seconds_to_evict(evictions: list[tuple[float, int]], account: int, since: float) -> float:
    """Seconds from `since` to the first eviction of `account` after it (waits for one)."""
    wait_until(lambda: any(at >= since and user == account for at, user in evictions), what="the eviction")
    return next(at for at, user in evictions if at >= since and user == account) - since


def _wait_for_a_read_after(cache: KeyringCache, moment: float) -> None:
    """Until `cache` completed a read of the revocation log that started after `moment`."""
    bound = keyring_module.settings.API_KEY_REVOCATION_SECONDS
    wait_until(lambda: cache._trust_until > moment + bound, what="a read of the log after the change")


@pytest.fixture
def publish_lost(monkeypatch):
    """Every pub/sub eviction message of this test is lost (the revoking side never sends it)."""
    monkeypatch.setattr(keyring_module._redis(), "publish", lambda *args, **kwargs: 0)


def test_a_disabled_key_is_refused_by_another_process_when_the_message_is_lost(
    make_user, make_key, publish_lost, committed, capsys
):
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()  # its own listener and log reader, as in another worker
    warm(other_process, api_key.key)
    evictions = record_evictions(other_process)
    earlier = len(committed)

    services.api_key_set_status(api_key=api_key, enabled=False)  # commits; the message is lost

    # Measured from the commit to the other process's eviction (when it happened, not when this
    # thread got round to looking), and the key is then refused there.
    seconds = _seconds_to_evict(evictions, api_key.user_id, committed[earlier])
    assert not other_process.lookup(api_key.key)[1].is_enabled
    with capsys.disabled():
        sys.stdout.write(f"\n  disabled key, pub/sub lost: another process evicted it after {seconds * 1000:.0f} ms\n")
    assert seconds < 1.0


def test_without_the_log_a_lost_message_would_leave_the_key_cached(make_user, make_key, publish_lost, monkeypatch):
    """The control: the same loss with the log's append switched off leaves the other process
    trusting its cache (until API_KEY_CACHE_SECONDS), which is what the log is for."""
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()
    warm(other_process, api_key.key)
    monkeypatch.setattr(keyring_module, "_LOG_APPEND", "return 0")
    services.api_key_set_status(api_key=api_key, enabled=False)
    _wait_for_a_read_after(other_process, time.monotonic())
    assert other_process.cached(api_key.key)


def test_a_process_that_cannot_read_the_log_stops_trusting_its_cache(make_user, make_key, monkeypatch):
    """E.g. Redis unreachable from this process, or the reader thread starved: a revocation could be
    missed, so keys come from the database until the log is read again."""
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()
    warm(other_process, api_key.key)
    real_client = keyring_module._log_client

    def unreachable():
        raise ConnectionError("Redis unreachable")

    monkeypatch.setattr(keyring_module, "_log_client", unreachable)
    cut_off = time.monotonic()
    wait_until(lambda: not other_process.cached(api_key.key), what="the cache to stop being trusted")
    # Trusted at most API_KEY_REVOCATION_SECONDS after the last read, which started before the cut.
    assert other_process._trust_until <= cut_off + keyring_module.settings.API_KEY_REVOCATION_SECONDS
    assert other_process.lookup(api_key.key)[1].is_enabled  # still served, from the database
    monkeypatch.setattr(keyring_module, "_log_client", real_client)
    warm(other_process, api_key.key)  # trusted again once the log is read


def test_without_redis_a_process_trusts_its_cache_once_it_read_the_databases_log(make_user, make_key):
    """No Redis (embedded): the log is the database's (issue 34, finding 4), read the same way;
    tests/accounts/test_keyring_database_log.py covers it."""
    api_key, _ = make_key(make_user())
    with override_settings(REDIS_URL=""):
        cache = KeyringCache()
        cache.lookup(api_key.key)
        assert cache.cached(api_key.key)
        assert cache._log_position[0] == keyring_module.DATABASE_LOG_ID


def test_a_new_log_after_redis_lost_its_data_clears_the_cache(make_user, make_key):
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()
    warm(other_process, api_key.key)
    keyring_module._log_client().delete(*LOG_KEYS)  # Redis restarted empty
    services.api_key_set_status(api_key=api_key, enabled=True)  # a new log (sequence 1)
    other_process.sync()
    assert not other_process._keyrings


def test_a_reader_further_behind_than_the_log_is_long_starts_clean(make_user, make_key, monkeypatch):
    api_key, _ = make_key(make_user())
    other_process = KeyringCache()
    warm(other_process, api_key.key)
    log_id, sequence = other_process._log_position
    keyring_module._log_client().set(LOG_KEYS[0], sequence + keyring_module.LOG_LENGTH + 5)
    other_process.sync()
    assert not other_process._keyrings
    assert other_process._log_position == (log_id, sequence + keyring_module.LOG_LENGTH + 5)


def _created_with_key(user, key: str):
    """A key made by api_key_create whose text is `key` (it draws the secret, then the key)."""
    tokens = iter(["s" * 64, key])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(services, "_random_token", lambda length: next(tokens))
        return services.api_key_create(user=user, name="new").api_key


def _remember_unknown(cache: KeyringCache, key: str) -> None:
    # the reader's first read starts clean
    wait_until(lambda: cache.lookup(key) is None and cache.cached(key), what="the unknown key to be remembered")


def test_a_key_created_elsewhere_is_found_within_the_bound_when_the_message_is_lost(
    make_user, publish_lost, committed, capsys
):
    """Issue 25, finding 5: another process remembers an unknown key (so it does not ask the
    database again for it), and the key's creation must still reach it within
    API_KEY_REVOCATION_SECONDS, as a revocation would, with the pub/sub message lost."""
    key = "N" * 64
    user = make_user()  # before the other process starts: its first read starts clean after it
    other_process = KeyringCache()
    _remember_unknown(other_process, key)
    evictions = record_evictions(other_process)  # an eviction forgets every remembered unknown key
    earlier = len(committed)

    created = _created_with_key(user, key)

    seconds = _seconds_to_evict(evictions, user.pk, committed[earlier])
    with capsys.disabled():
        sys.stdout.write(
            f"\n  new key, pub/sub lost: another process forgot it was unknown after {seconds * 1000:.0f} ms\n"
        )
    assert other_process.lookup(key)[1].key == created.key
    assert seconds < 1.0, "the other process kept the key unknown past the bound"


def test_without_the_log_a_lost_message_would_leave_a_new_key_unknown(make_user, publish_lost, monkeypatch):
    """The control: an unknown key is really remembered (no look-up per request), and it is the
    revocation log that ends the memory when the message is lost."""
    key = "M" * 64
    other_process = KeyringCache()
    _remember_unknown(other_process, key)
    monkeypatch.setattr(keyring_module, "_LOG_APPEND", "return 0")
    _created_with_key(make_user(), key)
    _wait_for_a_read_after(other_process, time.monotonic())
    assert other_process.lookup(key) is None
