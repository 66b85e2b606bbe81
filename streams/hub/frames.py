"""A posting's consecutive rows of one account and its frames: the events as JSON text, built once
per view for every connection (the fan-out's one serialisation)."""

from __future__ import annotations

import json
import time

from streams.events import build_events
from streams.wire import text_frames


class Frames(list):
    """A posting's frames for one view: the JSON texts, and (`wire`, made on first use) the same
    framed as websocket frames once for every connection that writes them to its socket."""

    __slots__ = ("_wire",)

    @property
    def wire(self) -> bytes:
        try:
            return self._wire
        except AttributeError:
            self._wire = text_frames(self)
            return self._wire


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
        self._frames: dict[str | None, Frames] = {}

    def frames(self, email: str | None) -> Frames:
        frames = self._frames.get(email)
        if frames is None:
            events = build_events(self.rows, email=email, now_ms=self.built_ms)
            frames = self._frames[email] = Frames(json.dumps(event) for event in events)
        return frames


def postings_of(rows: list[dict]) -> list[Posting]:
    postings, start = [], 0
    for end in range(1, len(rows) + 1):
        if end == len(rows) or rows[end]["posting"] != rows[start]["posting"]:
            postings.append(Posting(rows[start:end]))
            start = end
    return postings
