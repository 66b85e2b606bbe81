"""Template filters of the back office pages (exchange/dashboard)."""

from __future__ import annotations

from decimal import Decimal

from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()


@register.filter
def amount(value) -> str:
    """A Decimal as plain text without the database's trailing zeros (1.500000000000000000 -> 1.5,
    1E+6 -> 1000000): exact, never through float, never in exponent form."""
    if value is None or value == "":
        return ""
    number = value if isinstance(value, Decimal) else Decimal(str(value))
    text = format(number, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


@register.simple_tag
def activity_table_body(rows: list[dict]):
    """The activity table's rows (up to 30 days x 4 categories x every asset), built in one pass:
    as template nodes they were a third of the dashboard's render time."""
    if not rows:
        nothing = "No deposits, withdrawals, transfers or conversions in the last 30 days."
        return format_html('<tr><td colspan="5">{}</td></tr>', nothing)
    return format_html_join(
        "\n",
        '<tr data-day="{0}" data-category="{1}" data-asset="{2}"><td>{0}</td><td>{1}</td><td>{2}</td>'
        '<td class="num" data-field="count">{3}</td><td class="num" data-field="volume">{4}</td></tr>',
        ((row["day"].isoformat(), row["category"], row["asset"], row["count"], amount(row["volume"])) for row in rows),
    )
