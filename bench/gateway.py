"""Signed GET /openapi/v1/api-keys per second against unsigned GET /openapi/v1/ping per second,
through the stack exactly as `make run` starts it with DATABASE_URL and REDIS_URL (nginx in front
of granian and Daphne, Celery worker and beat; bench/make_run), rate limits raised, in one run.

headline: signed_rps / ping_rps (target >= 0.7).
"""

import hashlib
import hmac
import os
import sys
import time

from bench import _bench
from harness.make_run import make_run, stack_label
from harness.services import demo_keys

SECONDS = int(os.environ.get("BENCH_SECONDS", "8"))
ROUNDS = 2


def signed_paths(api_key: str, secret: str, count: int = 2000) -> list[str]:
    base = int(time.time() * 1000)
    paths = []
    for i in range(count):
        query = f"recvWindow=60000&timestamp={base + i % 500 - 500}"
        signature = hmac.new(secret.encode(), query.encode(), hashlib.sha256).hexdigest()
        paths.append(f"/openapi/v1/api-keys?{query}&signature={signature}")
    return paths


def main() -> None:
    env = _bench.bench_env(
        "exchange_bench_gateway", 14, IP_WEIGHT_LIMIT_PER_MINUTE="1000000000", UID_WEIGHT_LIMIT_PER_MINUTE="1000000000"
    )
    env.pop("RATE_LIMIT_STORAGE_URL", None)  # the limits and the broker follow the bench's Redis db
    env.pop("CELERY_BROKER_URL", None)
    ping, signed = [], []
    with make_run(env) as running:
        world = demo_keys(env)
        api_key, secret = world["master"]["api_key"], world["master"]["secret_key"]
        port = running.port
        _bench.wrk(port, ["/openapi/v1/ping"], seconds=2)  # warm up
        _bench.wrk(port, signed_paths(api_key, secret), api_key=api_key, seconds=2)
        for _ in range(ROUNDS):
            ping.append(_bench.wrk(port, ["/openapi/v1/ping"], seconds=SECONDS))
            signed.append(_bench.wrk(port, signed_paths(api_key, secret), api_key=api_key, seconds=SECONDS))
        label = stack_label(running)
    errors = sum(r["non200"] for r in ping + signed)
    ping_rps = sum(r["rps"] for r in ping) / len(ping)
    signed_rps = sum(r["rps"] for r in signed) / len(signed)
    print(f"server: {label}")
    print(f"ping_rps: {ping_rps:.0f}")
    print(f"ping_p50_ms: {ping[-1]['p50_ms']:.2f}")
    print(f"ping_p99_ms: {ping[-1]['p99_ms']:.2f}")
    print(f"signed_api_keys_rps: {signed_rps:.0f}")
    print(f"signed_p50_ms: {signed[-1]['p50_ms']:.2f}")
    print(f"signed_p99_ms: {signed[-1]['p99_ms']:.2f}")
    print(f"non_200_responses: {errors}")
    print(f"headline: {signed_rps / ping_rps:.2f}")
    if errors:
        sys.exit("some requests failed; the figures are not valid")


if __name__ == "__main__":
    main()
