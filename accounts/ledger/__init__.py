"""The ledger: every balance change of every app goes through `post()` (docs/architecture.md section 3).

`from accounts import ledger; ledger.post(legs=..., kind=..., reference=...)`. Names are loaded on
first use because accounts.models imports this package's models while the app registry loads.
"""

from importlib import import_module

_EXPORTS = {
    "BalanceAfter": "posting",
    "Leg": "posting",
    "LinkedRow": "posting",
    "PostingResult": "posting",
    "after_commit_listeners": "posting",
    "asset_id": "posting",
    "hold": "posting",
    "move": "posting",
    "post": "posting",
    "release": "posting",
    "settle": "posting",
    "role_account_ids": "system",
    "shard_account_id": "system",
    "system_account_id": "system",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(import_module(f"accounts.ledger.{module}"), name)
