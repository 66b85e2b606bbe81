"""The request gateway: parameters, signed-request authentication, permissions, rate limits and
the `{"code", "msg"}` error envelope. Every endpoint goes through `GatewayApi` (views.py)."""
