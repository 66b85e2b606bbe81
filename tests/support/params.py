"""Plausible values for the API's parameter names, so that generated or replayed requests reach past
the parameter checks (tests/fuzz/test_schema_fuzz.py, tests/security/test_secrets_in_logs.py)."""

from __future__ import annotations


def plausible_params(*, sub_email: str, sub_api_key: str, peer_email: str, to_email: str, new_sub_email: str) -> dict:
    """The BTC wallet (the demo master's BTC whitelist address), a PHP transfer of 1 to the peer, a
    BTC -> PHP quote, the sub-account `sub_email` and its key opened to any IP."""
    return {
        "email": sub_email,
        "fromEmail": sub_email,
        "toEmail": to_email,
        "accountName": new_sub_email,
        "asset": "BTC",
        "coin": "BTC",
        "network": "BTC",
        "currency": "BTC",
        "tokenId": "BTC",
        "account": "PHP",
        "amount": "1",
        "target_address": peer_email,
        "address": "bc1qdemo0master0whitelist0address0000000",
        "sourceCurrency": "BTC",
        "targetCurrency": "PHP",
        "sourceAmount": "0.001",
        "apikey": sub_api_key,
        "ipAddress": "203.0.113.9",
        "ipRestriction": "2",
    }
