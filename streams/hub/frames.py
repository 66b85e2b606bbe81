"""A posting's consecutive rows of one account and its frames: the events as JSON text, built once
per view for every connection (the fan-out's one serialisation)."""

from __future__ import annotations

import json
import time

from streams.events import build_events


class Posting:
    """One posting's consecutive rows of one account, and its frames: the events as JSON text, built
    once per view (None: the account's own; an e-mail: its whitelisted master's) for everybody."""

    __slots__ = ("_frames", "at", "built_ms", "first", "last", "rows")

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.first = rows[0]["seq"]
        self.last = rows[-1]["seq"]
        self.at = time.monotonic()
        self.built_ms = int(time.time() * 1000)
        self._frames: dict[str | None, list[str]] = {}

    def frames(self, email: str | None) -> list[str]:
        frames = self._frames.get(email)
        if frames is None:
            events = build_events(self.rows, email=email, now_ms=self.built_ms)
            frames = self._frames[email] = [json.dumps(event) for event in events]
        return frames


def postings_of(rows: list[dict]) -> list[Posting]:
    postings, start = [], 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end]["posting"] != rows[start]["posting"]:
            postings.append(Posting(rows[start:end]))
            start = end
    return postings
