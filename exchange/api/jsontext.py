"""The one parser of JSON a client sends: a JSON request body (exchange/api/params.py), a parameter
whose value is JSON (exchangeInfo's `symbols`, convert/apis.py) and a websocket message
(streams/consumers.py). Its size and its nesting depth are bounded before it is parsed.

Python's json parser recurses once per `[` or `{`; about a thousand of them (2,600 `[` in issue 34,
finding 5) raise RecursionError, which is not a ValueError, so a caller that expected "not JSON"
answered 500 and logged a traceback instead. Here the text is first measured by a linear scan (no
recursion, no regular expression that can backtrack) and refused, as a ValueError, when it is longer
than the caller allows or nested deeper than MAX_JSON_DEPTH; only then is it parsed. Every caller
turns the refusal into its own invalid-input answer (docs/api.md, "Parameters").
"""

from __future__ import annotations

import json
import re
from typing import Any

# Deeper than anything a client of this API sends (a body is an object of scalars, `symbols` an
# array of names, a websocket request an object holding a list), and far from the parser's limit.
MAX_JSON_DEPTH = 16

_SIGNIFICANT = re.compile(r'[\\"\[\]{}]')


class JsonRefused(ValueError):
    """The text is not JSON within the bounds (too long, nested too deep) or not JSON at all."""


def nesting_depth(text: str, *, stop_above: int | None = None) -> int:
    """How deep `[` and `{` nest in `text`, outside strings (an upper bound of what the parser would
    reach: unbalanced closing brackets never lower it below 0). Stops counting once past
    `stop_above`."""
    depth = deepest = 0
    in_string = False
    escaped_at = -1
    for match in _SIGNIFICANT.finditer(text):
        at = match.start()
        if at == escaped_at:
            continue
        char = match.group()
        if in_string:
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_above is not None and deepest > stop_above:
                    break
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def loads(text: str, *, max_chars: int, max_depth: int = MAX_JSON_DEPTH, **options: Any) -> Any:
    """`json.loads(text, **options)` once `text` is at most `max_chars` characters and nested at most
    `max_depth` deep; JsonRefused (a ValueError, with a message a client may read) otherwise, and
    for text that is not JSON."""
    if len(text) > max_chars:
        raise JsonRefused(f"longer than {max_chars} characters")
    if nesting_depth(text, stop_above=max_depth) > max_depth:
        raise JsonRefused(f"nested deeper than {max_depth} levels")
    try:
        return json.loads(text, **options)
    except (ValueError, RecursionError) as exc:  # RecursionError: cannot happen within the depth; fail closed
        raise JsonRefused("not JSON") from exc
