"""Request parameters: merge, presence rules and typed parsing.

The raw query string and the raw form body are merged with the query string winning. A parameter
sent empty (`recvWindow=`) or without a value (`&startTime&`) is absent; unknown parameters are
ignored. Each endpoint declares its parameters; failures map to -1105 (missing), -1025 (invalid),
-1106 (sent when not allowed) and -1107 (conflict). Decimals are parsed from the text, never
through float, and are bounded by the amount columns (NUMERIC(36, 18)): every DECIMAL parameter is
an amount, and one the columns cannot hold is refused here, before anything is read or written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import parse_qsl

from django.conf import settings

from exchange.api import jsontext
from exchange.api.errors import (
    BadRequest,
    ConflictParameter,
    InvalidParameter,
    MissingParameter,
    ParameterInvalid,
    ParameterNotRequired,
)
from exchange.runtime.amounts import AMOUNT_PLACES, MAX_AMOUNT, decimal_places

_INT_RE = re.compile(r"-?[0-9]{1,19}")
_DECIMAL_RE = re.compile(r"[0-9]{1,30}(\.[0-9]{1,30})?")
# Control characters (C0 but tab, line feed and carriage return; DEL; C1) and lone surrogates (a JSON
# `"\ud800"`, not UTF-8 at all) have no place in any parameter; PostgreSQL refuses a NUL in text
# outright, and a surrogate cannot even be sent to it.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
# The spec's INT is 32 bits, LONG 64: a value outside is invalid (-1025) rather than a database error.
KIND_RANGES = {"INT": (-(2**31), 2**31 - 1), "LONG": (-(2**63), 2**63 - 1)}
# Paging skips at most this many rows (offset, or (page - 1) x page size): deeper pages are refused
# (-1025) rather than making the database walk past millions of rows.
MAX_SKIPPED_ROWS = 10_000_000

FORM_CONTENT_TYPES = ("", "application/x-www-form-urlencoded", "text/plain")
MAX_FIELDS = 500


def split_pairs(text: str) -> list[tuple[str, str]]:
    """Decode `a=1&b=&c` into pairs (keeping blanks, so that callers can drop them)."""
    if not text:
        return []
    try:
        return parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FIELDS)
    except ValueError as exc:
        raise BadRequest(msg=f"Too many parameters (at most {MAX_FIELDS}).") from exc


def merge_params(
    query: str,
    body: str,
    body_pairs: Iterable[tuple[str, str]] | None = None,
    query_pairs: Iterable[tuple[str, str]] | None = None,
) -> dict[str, str]:
    """Query string wins over body; within one source the first occurrence wins; blanks are absent.
    Pairs already split from the texts (`split_pairs`) may be passed instead of parsing them again."""
    merged: dict[str, str] = {}
    for pairs in (
        query_pairs if query_pairs is not None else split_pairs(query),
        body_pairs if body_pairs is not None else split_pairs(body),
    ):
        for key, value in pairs:
            if value != "" and key not in merged:
                merged[key] = value
    return merged


def is_json(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def body_pairs_from(content_type: str, body: bytes) -> tuple[str, list[tuple[str, str]]]:
    """Decode a request body into (text, pairs). Form bodies are the norm; a JSON object of scalars
    is accepted for convenience. Anything else with content is refused with -1010."""
    if not body:
        return "", []
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(msg="Malformed request body: not UTF-8.") from exc
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type in FORM_CONTENT_TYPES:
        return text, split_pairs(text)
    if media_type == "application/json":
        try:
            # Numbers stay text: an amount must never pass through float. Size and depth are
            # bounded before parsing (exchange/api/jsontext.py).
            data = jsontext.loads(text, max_chars=settings.API_MAX_BODY_BYTES, parse_float=str, parse_int=str)
        except jsontext.JsonRefused as exc:
            raise BadRequest(msg=f"Malformed JSON body: {exc}.") from exc
        if not isinstance(data, dict) or any(isinstance(v, dict | list) for v in data.values()):
            raise BadRequest(msg="A JSON body must be an object of scalar values.")
        return text, [(str(k), _json_scalar(v)) for k, v in data.items()]
    raise BadRequest(msg=f"Unsupported content type '{media_type}'; send application/x-www-form-urlencoded.")


def _json_scalar(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# --- typed parsing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One declared parameter. `kind` is one of STRING, INT, LONG, DECIMAL, BOOL, ENUM."""

    name: str
    kind: str = "STRING"
    required: bool = False
    default: Any = None
    min: int | Decimal | None = None
    max: int | Decimal | None = None
    max_length: int | None = None
    choices: tuple[str, ...] | None = None
    description: str = ""
    validator: Callable[[Any], bool] | None = field(default=None, compare=False)

    def parse_missing(self) -> Any:
        if self.required:
            raise MissingParameter(self.name)
        return self.default

    def parse(self, raw: str) -> Any:
        value = _PARSERS[self.kind](self, raw)
        if self.min is not None and value < self.min:
            raise InvalidParameter(self.name)
        if self.max is not None and value > self.max:
            raise InvalidParameter(self.name)
        if self.validator is not None and not self.validator(value):
            raise InvalidParameter(self.name)
        return value


def _parse_string(param: Param, raw: str) -> str:
    if param.max_length is not None and len(raw) > param.max_length:
        raise InvalidParameter(param.name)
    if _CONTROL_RE.search(raw):
        raise ParameterInvalid(param.name, "control characters are not allowed")
    return raw


def _parse_int(param: Param, raw: str) -> int:
    if not _INT_RE.fullmatch(raw):
        raise InvalidParameter(param.name)
    value = int(raw)
    low, high = KIND_RANGES[param.kind]
    if not low <= value <= high:
        raise InvalidParameter(param.name)
    return value


def ascii_int_list(name: str, text: str) -> list[int]:
    """A comma-separated list of integers in ASCII digits (`int()` alone also takes full-width digits and `1_0`)."""
    parts = [part.strip() for part in text.split(",") if part.strip() != ""]
    if not parts or any(not _INT_RE.fullmatch(part) for part in parts):
        raise InvalidParameter(name)
    return [int(part) for part in parts]


def check_skip(name: str, skipped_rows: int) -> None:
    """Refuse paging deeper than MAX_SKIPPED_ROWS (-1025 on the paging parameter `name`)."""
    if skipped_rows > MAX_SKIPPED_ROWS:
        raise ParameterInvalid(name, f"at most {MAX_SKIPPED_ROWS} rows can be skipped; narrow the query")


def _parse_decimal(param: Param, raw: str) -> Decimal:
    if not _DECIMAL_RE.fullmatch(raw):
        raise InvalidParameter(param.name)
    try:
        value = Decimal(raw)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid text
        raise InvalidParameter(param.name) from exc
    # What the amount columns hold: beyond it PostgreSQL refuses the row (a 500) and SQLite stores
    # it; fractional digits past the columns' would be rounded away silently (trailing zeros are fine).
    if value > MAX_AMOUNT:
        raise ParameterInvalid(param.name, f"at most {MAX_AMOUNT}")
    if decimal_places(value) > AMOUNT_PLACES:
        raise ParameterInvalid(param.name, f"at most {AMOUNT_PLACES} decimal places")
    return value


def _parse_bool(param: Param, raw: str) -> bool:
    lowered = raw.lower()
    if lowered not in ("true", "false"):
        raise InvalidParameter(param.name)
    return lowered == "true"


def _parse_enum(param: Param, raw: str) -> str:
    if param.choices is None or raw not in param.choices:
        raise InvalidParameter(param.name)
    return raw


_PARSERS: dict[str, Callable[[Param, str], Any]] = {
    "STRING": _parse_string,
    "INT": _parse_int,
    "LONG": _parse_int,
    "DECIMAL": _parse_decimal,
    "BOOL": _parse_bool,
    "ENUM": _parse_enum,
}


@dataclass(frozen=True)
class ParamSpec:
    """An endpoint's parameters and the rules between them."""

    params: tuple[Param, ...] = ()
    conflicts: tuple[tuple[str, str], ...] = ()  # not both (-1107)
    requires: tuple[tuple[str, str], ...] = ()  # (a, b): a only together with b (-1106)

    def parse(self, raw: dict[str, str]) -> dict[str, Any]:
        for first, second in self.conflicts:
            if first in raw and second in raw:
                raise ConflictParameter(f"{first}, {second}")
        for dependent, needed in self.requires:
            if dependent in raw and needed not in raw:
                raise ParameterNotRequired(dependent)
        values: dict[str, Any] = {}
        for param in self.params:
            text = raw.get(param.name)
            if text is None:
                values[param.name] = param.parse_missing()
            else:
                values[param.name] = param.parse(text)
        return values


TIMESTAMP = Param("timestamp", "LONG", required=True, min=0, description="Request creation time, ms.")
RECV_WINDOW = Param(
    "recvWindow", "LONG", default=5000, min=1, max=60000, description="Validity window in ms (default 5000, max 60000)."
)
