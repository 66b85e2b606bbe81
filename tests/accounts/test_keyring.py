"""The gateway's API-key cache: invalidation in this process and, through Redis, in the others."""

import pytest
from django.test import override_settings

from accounts import services
from accounts.keyring import KeyringCache, keyrings
from exchange.api.signing import sign
from tests.support.assertions import assert_error
from tests.support.client import SignedClient
from tests.support.waiting import wait_until


@pytest.mark.django_db(transaction=True)
def test_another_process_cache_is_evicted_through_redis_when_a_key_is_disabled(make_user, make_key):
    user = make_user()
    api_key, _ = make_key(user)
    other_process = KeyringCache()  # its own listener thread, as in another server worker process
    _, record = other_process.lookup(api_key.key)
    assert record.is_enabled
    # The listener subscribes, and the log reader's first read starts it clean, right after they start.
    wait_until(lambda: other_process._subscribed.is_set() and other_process._synced.is_set(), what="listening")
    other_process.lookup(api_key.key)
    assert other_process.cached(api_key.key)

    services.api_key_set_status(api_key=api_key, enabled=False)  # commits; publishes the eviction

    wait_until(lambda: not other_process.cached(api_key.key), what="the other process to drop the old key")
    _, record = other_process.lookup(api_key.key)
    assert not record.is_enabled


@pytest.mark.django_db
def test_disabling_a_key_is_refused_on_the_very_next_request(master, make_key):
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    assert client.get("/openapi/v1/api-keys").status_code == 200
    assert keyrings.cached(api_key.key)
    services.api_key_set_status(api_key=api_key, enabled=False)
    assert_error(client.get("/openapi/v1/api-keys"), -2015, 401)


@pytest.mark.django_db
def test_a_new_key_appears_in_the_list_at_once(master, make_key):
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    assert len(client.get("/openapi/v1/api-keys").json()) == 1
    make_key(master, name="second")
    assert [k["apiName"] for k in client.get("/openapi/v1/api-keys").json()] == ["test", "second"]


@pytest.mark.django_db
def test_entries_expire_after_the_configured_seconds(master, make_key):
    api_key, _ = make_key(master)
    with override_settings(API_KEY_CACHE_SECONDS=0):
        cache = KeyringCache()
        cache.lookup(api_key.key)
        assert not cache.cached(api_key.key)
    cache = KeyringCache()
    cache.lookup(api_key.key)
    assert cache.cached(api_key.key)


@pytest.mark.django_db
def test_a_load_overlapping_an_eviction_is_not_cached(master, make_key, monkeypatch):
    """A load that read the rows before a change committed must not outlive the change's eviction."""
    api_key, _ = make_key(master)
    cache = KeyringCache()
    import accounts.keyring as keyring_module

    real_load = keyring_module._load

    def load_then_evicted(user_id):
        ring = real_load(user_id)
        cache.evict(user_id)  # the invalidation message arrives while the old rows are in hand
        return ring

    monkeypatch.setattr(keyring_module, "_load", load_then_evicted)
    assert cache.lookup(api_key.key) is not None  # served for this request
    monkeypatch.setattr(keyring_module, "_load", real_load)
    assert not cache.cached(api_key.key)


@pytest.mark.django_db
def test_a_cached_key_keeps_its_secret_only_as_a_keyed_hmac_never_in_its_repr(master, make_key):
    api_key, secret = make_key(master)
    client = SignedClient(api_key.key, secret)
    assert client.get("/openapi/v1/api-keys").status_code == 200
    ring, record = keyrings.lookup(api_key.key)
    assert secret not in repr(record)
    assert secret not in repr(ring)
    assert secret not in str(vars(record))  # the secret itself is not an attribute
    mac = record.signer.copy()
    mac.update(b"timestamp=1")
    assert mac.hexdigest() == sign(secret, "timestamp=1")
    # A wrong signature is still refused with the cached signer.
    bad = SignedClient(api_key.key, secret[::-1])
    assert_error(bad.get("/openapi/v1/api-keys"), -1022, 401)


@pytest.mark.django_db
def test_a_key_whose_secret_cannot_be_decrypted_fails_alone(master, make_key):
    """E.g. its encryption key was dropped from API_SECRET_ENCRYPTION_KEYS: that key's requests are
    refused as badly signed, the account's other keys keep working."""
    from accounts.models import ApiKey

    good, good_secret = make_key(master)
    bad, bad_secret = make_key(master, name="old")
    ApiKey.objects.filter(pk=bad.pk).update(secret_ciphertext="gAAAAAB-not-a-fernet-token")  # no signal
    keyrings.clear()
    assert SignedClient(good.key, good_secret).get("/openapi/v1/api-keys").status_code == 200
    assert_error(SignedClient(bad.key, bad_secret).get("/openapi/v1/api-keys"), -1022, 401)


@pytest.mark.django_db
def test_a_loaded_keyring_holds_the_account_and_every_key_as_stored(master, make_key):
    """PostgreSQL loads a keyring with one prepared statement, SQLite through the ORM: either way
    the account's values and each key's fields are those the ORM reads (types and IP lists decoded,
    keys in creation order), and an account without keys has an empty keyring."""
    from accounts.keyring import _USER_FIELDS, _load
    from accounts.models import ApiKey, User

    first, first_secret = make_key(master, types=["Read only"], name="reader")
    second, _ = make_key(master, ip_list=["10.0.0.1", "10.0.0.0/24"], ip_restrict=True, name="ops")
    ring = _load(master.pk)
    assert ring.user_values == User.objects.filter(pk=master.pk).values_list(*_USER_FIELDS).get()
    assert ring.account().email == master.email
    stored = list(ApiKey.objects.filter(user=master).order_by("id"))
    assert [record.key for record in ring.keys] == [k.key for k in stored] == [first.key, second.key]
    for record, key in zip(ring.keys, stored, strict=True):
        assert (record.name, record.secret_ciphertext, record.status, record.ip_restrict) == (
            key.name,
            key.secret_ciphertext,
            key.status,
            key.ip_restrict,
        )
        assert record.types == tuple(key.types)
        assert record.ip_list == tuple(key.ip_list)
        assert record.created_at_ms == int(key.created_at.timestamp() * 1000)
    assert ring.keys[0].types == ("Read only",)
    assert ring.keys[1].ip_list == ("10.0.0.1", "10.0.0.0/24")
    mac = ring.keys[0].signer.copy()
    mac.update(b"timestamp=1")
    assert mac.hexdigest() == sign(first_secret, "timestamp=1")

    ApiKey.objects.filter(user=master).delete()
    assert _load(master.pk).keys == ()
    assert _load(master.pk + 10_000) is None
