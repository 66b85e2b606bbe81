"""The convert envelope: `{"status": int, "error": str, "data": ...}`, plus `total` for the order history.

Convert endpoints answer in it (spec, "Convert envelope"): status 0 and error "OK" when the request
was processed, a non-zero status and the reason otherwise. A convert API renders its result with
`success()`; its failures are `ConvertError`s (exchange/api/errors.py; the app's classes in
convert/errors.py), which the one exception handler renders with `failure()`. A request refused
before the convert logic runs (signature, key, parameters, limits) gets the `{code, msg}` envelope
like every endpoint. docs/api.md ("Errors") says why a failure in this envelope is HTTP 200.
"""

from __future__ import annotations

STATUS_OK = 0
STATUS_FAILED = 10000003  # the spec's one failure status: the error text says which failure
OK = "OK"


def success(data, *, total: int | None = None) -> dict:
    """A processed convert request: `data` is the quote, the order, the pairs or the history page
    (`total`: the number of orders in the whole history, for the order history only)."""
    body = {"status": STATUS_OK, "error": OK, "data": data}
    if total is not None:
        body["total"] = total
    return body


def failure(status: int, error: str) -> dict:
    return {"status": status, "error": error, "data": None}
