"""Issue 25, finding 8: docs/security.md said 20 websocket connections per listenKey while the code
allowed 64. The documents that state the bound must state the code's value, and the test that
shows the refusal (tests/streams/test_bounds.py, `test_default_cap_per_listen_key`: 64 open, the
65th refused 4003) must run with the value the service is configured with."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings

from streams import consumers

ROOT = Path(__file__).resolve().parents[2]


def _statements(pattern: str) -> list[tuple[str, int]]:
    """(document, number) for every match of `pattern` (the number in whichever of its groups
    matched) in README.md and docs/."""
    found = []
    for document in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = " ".join(document.read_text().split())  # a statement may be wrapped over lines
        for match in re.finditer(pattern, text):
            found.append((document.name, int(next(group for group in match.groups() if group))))
    return found


def test_the_per_listen_key_bound_the_tests_use_is_the_configured_one():
    assert settings.STREAM_MAX_CONNECTIONS_PER_KEY == consumers.MAX_CONNECTIONS_PER_KEY == 64


def test_every_document_states_the_configured_connections_per_listen_key():
    statements = _statements(
        r"(?i)connections per listenKey \((\d+)"  # security.md, M4
        r"|more than (\d+) connections on one listenKey"  # security.md, threat model
        r"|`STREAM_MAX_CONNECTIONS_PER_KEY` \| (\d+) \|"  # streams.md, settings table
        r"|`STREAM_MAX_CONNECTIONS_PER_KEY` / `STREAM_MAX_CONNECTIONS_PER_IP` \| `(\d+)`"  # configuration.md
    )
    assert {document for document, _ in statements} >= {"security.md", "streams.md", "configuration.md"}
    expected = settings.STREAM_MAX_CONNECTIONS_PER_KEY
    wrong = [(document, number) for document, number in statements if number != expected]
    assert not wrong, f"documents stating another bound than {expected}: {wrong}"
