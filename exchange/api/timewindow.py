"""Query periods of history endpoints, from startTime/endTime in ms."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.utils import timezone

from exchange.api.errors import EndTimeBeforeStartTime, InvalidParameter, PeriodTooLong

LAST_MICROSECOND = timedelta(microseconds=999)


def from_ms(ms: int, name: str) -> datetime:
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise InvalidParameter(name) from exc


def end_from_ms(ms: int, name: str = "endTime") -> datetime:
    """An end time covers its whole millisecond (rows are stored with microseconds)."""
    return from_ms(ms, name) + LAST_MICROSECOND


def shift(moment: datetime, delta: timedelta, name: str) -> datetime:
    try:
        return moment + delta
    except OverflowError as exc:
        raise InvalidParameter(name) from exc


def window(
    start_ms: int | None,
    end_ms: int | None,
    *,
    span: timedelta,
    default_span: timedelta | None = None,
    now: datetime | None = None,
) -> tuple[datetime, datetime]:
    """[start, end]: endTime defaults to now, startTime to `default_span` (else `span`) before the
    end; the period must be shorter than `span` when both are sent."""
    now = now or timezone.now()
    end = end_from_ms(end_ms) if end_ms is not None else now
    start = from_ms(start_ms, "startTime") if start_ms is not None else shift(end, -(default_span or span), "endTime")
    if end < start:
        raise EndTimeBeforeStartTime()
    if start_ms is not None and end_ms is not None and end - start >= span:
        raise PeriodTooLong(span.days)
    return start, end
