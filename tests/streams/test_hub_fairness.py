"""The hub's fairness mechanics (streams/hub/fairness.py): behind, it cuts off the account whose
fan-out costs it the most, once per STREAM_MAX_LAG_SECONDS, and nobody else. (The timing claim, on a
real Daphne and Redis: test_fairness.py.)"""

from __future__ import annotations

import time

from django.test import override_settings

from streams.hub import Hub, Listener


def listener(cut: list) -> Listener:
    entry = Listener(push=lambda frames: None, key_closed=lambda key, message: None, failed=lambda: None)
    entry.too_slow = lambda: cut.append(entry)
    return entry


def hub_with(audiences: dict[int, int]) -> tuple[Hub, dict[int, list[Listener]], list[Listener]]:
    hub = Hub(layer=None, loop=None)
    cut: list[Listener] = []
    listeners = {account: [listener(cut) for _ in range(n)] for account, n in audiences.items()}
    for account, entries in listeners.items():
        hub.own_listeners[account] = set(entries)
    return hub, listeners, cut


def message(behind: float, account: int = 2) -> dict:
    return {"type": "ledger.changes", "account": account, "rows": [], "sent": time.time() - behind}


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_on_time_nobody_is_cut_off():
    hub, _, cut = hub_with({1: 50, 2: 1})
    hub._charge(1, 5000)
    hub._charge(2, 2)
    hub._check_behind(message(0.5))
    hub._check_behind({"type": "ledger.changes", "account": 2, "rows": []})  # an older relay: no "sent"
    assert cut == []
    assert hub.sheds == 0


def test_behind_the_biggest_fan_out_is_cut_off_once_per_lag_bound():
    hub, listeners, cut = hub_with({1: 50, 2: 1, 3: 5})
    hub._charge(1, 5000)
    hub._charge(2, 2)
    hub._charge(3, 100)
    with override_settings(STREAM_MAX_LAG_SECONDS=1.0):
        hub._check_behind(message(1.5))
        assert cut == []  # one late message: perhaps one pause's backlog
        hub.behind_since -= 0.6
        hub._check_behind(message(1.5))  # late for half the bound: behind
        assert set(cut) == set(listeners[1])
        assert hub.sheds == 1
        hub._check_behind(message(1.5))  # still behind (the backlog drains): not again so soon
        assert hub.sheds == 1
        hub.shed_at -= 1.1
        for entry in listeners[1]:
            entry.gone = True  # they closed
        hub._check_behind(message(1.5))  # still behind a second later: the next biggest
        assert set(cut) == set(listeners[1]) | set(listeners[3])
        assert hub.sheds == 2
    assert not set(cut) & set(listeners[2])


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_cost_counts_the_last_one_to_two_seconds(monkeypatch):
    hub, listeners, cut = hub_with({1: 50, 2: 10})
    clock = [1000.0]
    monkeypatch.setattr("streams.hub.fairness.time.monotonic", lambda: clock[0])
    hub.cost_since = clock[0]
    hub._charge(1, 5000)  # long ago
    clock[0] += 2.5
    hub._charge(2, 20)
    clock[0] += 1.2
    hub._charge(2, 20)
    hub._check_behind(message(2.0))
    clock[0] += 0.6
    hub._check_behind(message(2.0))
    assert set(cut) == set(listeners[2])


@override_settings(STREAM_MAX_LAG_SECONDS=1.0)
def test_a_message_on_time_ends_being_behind():
    hub, _, cut = hub_with({1: 50})
    hub._charge(1, 5000)
    hub._check_behind(message(1.5))
    hub._check_behind(message(0.1))
    assert hub.behind_since is None
    hub._check_behind(message(1.5))
    assert cut == []
