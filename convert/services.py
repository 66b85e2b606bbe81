"""Convert writes: quotes, accepting them, and the house's liquidity.

A quote is a firm price for QUOTE_TTL_SECONDS. Accepting it is one CONVERT posting: the customer's
source amount to the house's convert liquidity, the house's target amount to the customer (and the
fee, if the pair has one, to the fees account), written together with the order row in the
posting's own statement; the order's unique quote makes a quote accepted once, however many
accepts race. A refused accept is kept as a FAILED order with its reason.

Rounding always favours the house: a quote for a source amount rounds the target down (to the
pair's precision); a quote for a target amount rounds the source up (to the source asset's
precision) and the fee up.

The liquidity is split over shards (accounts/ledger/system.py): customer N's conversions use shard
N % shards, so conversions of different customers do not queue on one ledger lock. When that
shard cannot pay the target, the richest shard is tried once (or, when no single shard holds it, the
richest few together in one posting); when the house cannot pay, the accept fails with "failed to
fetch liquidity" and nothing moves.
"""

from __future__ import annotations

import logging
import math
import secrets
from datetime import timedelta
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from accounts import ledger, policy
from accounts.ledger.errors import AccountMayNotSend, InsufficientBalance
from accounts.ledger.models import Balance, BusinessType, Posting
from accounts.ledger.posting import fetch_prepared
from accounts.models import SystemRole, User
from convert import errors, prices
from convert.models import AssetPrice, Order, OrderStatus, Pair, Quote
from convert.prices import customer_price
from exchange.api.errors import Disconnected
from exchange.api.ratelimit import STORAGE_ERRORS, STORAGE_OUTAGE, counters
from exchange.backoffice.changes import apply_fields
from exchange.backoffice.services import require_permission, require_reason, staff_action
from exchange.platform.selectors import business_is_on

logger = logging.getLogger(__name__)

BPS = Decimal(10000)
PRICE_PLACES = Decimal("1e-18")


def _places(places: int) -> Decimal:
    return Decimal(1).scaleb(-places)


def _down(value: Decimal, places: int) -> Decimal:
    return value.quantize(_places(places), rounding=ROUND_FLOOR)


def _up(value: Decimal, places: int) -> Decimal:
    return value.quantize(_places(places), rounding=ROUND_CEILING)


def _fits(value: Decimal, places: int) -> bool:
    return value == value.quantize(_places(places))


def _require_business_on() -> None:
    if not business_is_on("CONVERT"):
        raise errors.ConvertSuspended()


def _require_may_convert(user: User) -> None:
    if not policy.may_send(user):
        raise errors.AccountUnavailable()


def pair_find(source_code: str, target_code: str, enabled: prices.EnabledPairs) -> Pair:
    """The enabled pair in that direction (prices.enabled_pairs: cached per process, with its assets
    and market, and what the arbitrage guard needs)."""
    pair = enabled.by_direction.get((source_code, target_code))
    if pair is None:
        raise errors.PairNotSupported(source_code, target_code)
    return pair


def _throttle(user: User, pair: Pair) -> None:
    """At most one quote per CONVERT_QUOTE_INTERVAL_MS per account and pair (the spec's minimum
    refresh interval). Counted in the rate-limit storage; when it is down, quoting is refused."""
    interval_ms = settings.CONVERT_QUOTE_INTERVAL_MS
    if interval_ms <= 0:
        return
    try:
        count = counters().incr(f"convert-quote/{user.pk}/{pair.pk}", max(1, -(-interval_ms // 1000)))
    except STORAGE_ERRORS as exc:
        STORAGE_OUTAGE.failed(exc)
        raise Disconnected() from exc
    if count > 1:
        raise errors.QuoteTooSoon(interval_ms)


def quote_amounts(
    pair: Pair, price: Decimal, *, source_amount: Decimal | None, target_amount: Decimal | None
) -> tuple[Decimal, Decimal, Decimal]:
    """(source, target, fee) of a quote at the customer's `price`, rounded in the house's favour,
    checked against the pair's bounds and precision."""
    source_places = pair.source.transfer_precision
    fee_rate = Decimal(pair.fee_bps) / BPS
    with localcontext(prec=60):
        if source_amount is not None:
            if source_amount <= 0:
                raise errors.AmountRefused("sourceAmount must be positive")
            if not _fits(source_amount, source_places):
                raise errors.AmountRefused(f"sourceAmount has more than {source_places} decimal places")
            gross = _down(source_amount * price, pair.precision)
            fee = _up(gross * fee_rate, pair.precision)
            source, target = source_amount, gross - fee
        else:
            if target_amount <= 0:
                raise errors.AmountRefused("targetAmount must be positive")
            if not _fits(target_amount, pair.precision):
                raise errors.AmountRefused(f"targetAmount has more than {pair.precision} decimal places")
            gross = _up(target_amount / (1 - fee_rate), pair.precision)
            fee = gross - target_amount
            source, target = _up(gross / price, source_places), target_amount
    if source < pair.min_source_amount:
        raise errors.AmountRefused(f"sourceAmount is below the minimum {pair.min_source_amount.normalize():f}")
    if source > pair.max_source_amount:
        raise errors.AmountRefused(f"sourceAmount is above the maximum {pair.max_source_amount.normalize():f}")
    if target <= 0:
        raise errors.AmountRefused("the amount is too small to convert")
    return source, target, fee


def quote_create(
    *,
    user: User,
    source_code: str,
    target_code: str,
    source_amount: Decimal | None = None,
    target_amount: Decimal | None = None,
) -> Quote:
    if (source_amount is None) == (target_amount is None):
        raise errors.OneAmountRequired()
    _require_business_on()
    _require_may_convert(user)
    enabled = prices.enabled_pairs()
    pair = pair_find(source_code, target_code, enabled)
    market = prices.current_price(pair, enabled.pairs)
    price = customer_price(market.price, pair.market.spread_bps)
    if price <= 0:
        raise errors.LiquidityUnavailable()
    source, target, fee = quote_amounts(pair, price, source_amount=source_amount, target_amount=target_amount)
    _throttle(user, pair)
    now = timezone.now()
    quote = Quote(
        quote_id=secrets.token_hex(16),
        user=user,
        pair=pair,
        source_amount=source,
        target_amount=target,
        fee=fee,
        price=price,
        market_price=_down(market.price, 18),
        created_at=now,
        expires_at=now + timedelta(seconds=settings.QUOTE_TTL_SECONDS),
    )
    if connection.vendor != "postgresql":  # SQLite (the embedded mode)
        quote.save(force_insert=True)
        return quote
    # One prepared statement (the ORM's INSERT cost ~0.2 ms more CPU per quote).
    quote.pk = fetch_prepared(_QUOTE_INSERT, [getattr(quote, name) for name in _QUOTE_INSERTED])[0][0]
    quote._state.adding, quote._state.db = False, "default"
    return quote


_QUOTE_INSERTED = tuple(f.attname for f in Quote._meta.concrete_fields if not f.primary_key)
_QUOTE_INSERT = (
    f"INSERT INTO {Quote._meta.db_table} ("  # noqa: S608 - constant text: the model's own columns
    + ", ".join(connection.ops.quote_name(Quote._meta.get_field(name).column) for name in _QUOTE_INSERTED)
    + ") VALUES ("
    + ", ".join(["%s"] * len(_QUOTE_INSERTED))
    + ") RETURNING id"
)


def seconds_left(quote: Quote) -> int:
    """Whole seconds until the quote expires, rounded up (a fresh quote says QUOTE_TTL_SECONDS)."""
    left = (quote.expires_at - timezone.now()).total_seconds()
    return max(0, math.ceil(left))


def _record_failure(quote: Quote, error: errors.ConvertError) -> Order | None:
    """Keep a refused accept as a FAILED order (support sees it); the quote is then spent. If a
    concurrent accept recorded the quote's order first, nothing is written."""
    try:
        with transaction.atomic():
            return Order.objects.create(
                quote=quote,
                user_id=quote.user_id,
                pair_id=quote.pair_id,
                source_amount=quote.source_amount,
                target_amount=quote.target_amount,
                fee=quote.fee,
                price=quote.price,
                status=OrderStatus.FAILED,
                error_code=str(error.convert_status),
                error_message=error.msg[:255],
                created_at=timezone.now(),
            )
    except IntegrityError:
        return None


def _fail(quote: Quote, error: errors.ConvertError):
    if _record_failure(quote, error) is None:
        raise errors.QuoteAlreadyUsed() from error
    raise error


_QUOTE_FIELDS = tuple(f.attname for f in Quote._meta.concrete_fields)
# PostgreSQL: the caller's quote and whether it has an order, in one prepared statement (through
# the ORM, with the pair joined and a separate exists(), it cost ~2 ms of CPU of the accept's ~4).
_QUOTE_STATEMENT = (
    "SELECT "  # noqa: S608 - constant text: the model's own column names
    + ", ".join(f"q.{connection.ops.quote_name(Quote._meta.get_field(name).column)}" for name in _QUOTE_FIELDS)
    + ", o.id IS NOT NULL FROM convert_quote q LEFT JOIN convert_order o ON o.quote_id = q.id"
    " WHERE q.quote_id = %s AND q.user_id = %s"
)


def _quote_of(user: User, quote_id: str) -> tuple[Quote, bool] | None:
    """The caller's quote and whether it was accepted (or refused) already; None: no such quote."""
    if connection.vendor == "postgresql":
        rows = fetch_prepared(_QUOTE_STATEMENT, [quote_id, user.pk])
        if not rows:
            return None
        *values, used = rows[0]
        return Quote.from_db("default", _QUOTE_FIELDS, values), used
    # SQLite (the embedded mode): the ORM converts its values
    quote = (
        Quote.objects.annotate(used=Exists(Order.objects.filter(quote=OuterRef("pk"))))
        .filter(quote_id=quote_id, user=user)
        .first()
    )
    return (quote, quote.used) if quote is not None else None


def _pair_of(quote: Quote) -> Pair:
    """The quote's pair from the process's enabled pairs; a pair not there is read (it may have been
    disabled, or enabled a moment ago in another process) and refused unless enabled."""
    pair = prices.enabled_pairs().by_id.get(quote.pair_id)
    if pair is None:
        pair = Pair.objects.select_related("source", "target", "market").get(pk=quote.pair_id)
        if not pair.enabled:
            raise errors.LiquidityUnavailable()
    return pair


def quote_accept(*, user: User, quote_id: str) -> Order:
    found = _quote_of(user, quote_id)
    if found is None:
        raise errors.QuoteNotFound()
    quote, used = found
    if used:
        raise errors.QuoteAlreadyUsed()
    if timezone.now() >= quote.expires_at:
        _fail(quote, errors.QuoteExpired())
    try:
        _require_business_on()
        _require_may_convert(user)
        pair = quote.pair = _pair_of(quote)
        market = prices.current_price(pair)  # stale, missing or arbitrage: LiquidityUnavailable
        tolerance = Decimal(settings.CONVERT_LAST_LOOK_TOLERANCE_BPS) / BPS
        now_price = customer_price(market.price, pair.market.spread_bps)
        if now_price < quote.price * (1 - tolerance):  # the market moved against the house
            raise errors.PriceChanged()
        if quote.price > market.price:  # the house would pay more than the market's price now
            raise errors.PriceChanged()
    except errors.ConvertError as error:
        _fail(quote, error)
    return _settle(quote, user)


def _settle(quote: Quote, user: User) -> Order:
    pair = quote.pair
    needed = quote.target_amount + quote.fee
    shard = ledger.shard_account_id(SystemRole.CONVERT_LIQUIDITY, user.pk)
    try:
        return _post(quote, user, [(shard, needed)])
    except InsufficientBalance:
        pass
    if _free(user.pk, pair.source.code) < quote.source_amount:
        _fail(quote, errors.ConvertInsufficientBalance())
    payers = _payers(pair.target.code, needed)
    if payers is not None and payers != [(shard, needed)]:
        try:
            return _post(quote, user, payers)
        except InsufficientBalance:
            if _free(user.pk, pair.source.code) < quote.source_amount:
                _fail(quote, errors.ConvertInsufficientBalance())
    logger.warning("Convert liquidity short: %s %s for quote %s", quote.target_amount, pair.target.code, quote.quote_id)
    _fail(quote, errors.LiquidityUnavailable())


def _post(quote: Quote, user: User, payers: list[tuple[int, Decimal]]) -> Order:
    """One CONVERT posting: the source to the first payer shard; the payers' parts (target plus fee)
    to the customer's target and the fee to the fees account."""
    pair = quote.pair
    target = pair.target.code
    legs = ledger.move(user.pk, payers[0][0], pair.source.code, quote.source_amount)
    legs += [ledger.Leg(shard, target, -part) for shard, part in payers]
    legs.append(ledger.Leg(user.pk, target, quote.target_amount))
    if quote.fee > 0:
        legs.append(ledger.Leg(ledger.shard_account_id(SystemRole.FEES, user.pk), target, quote.fee))
    values = {
        "quote_id": quote.pk,
        "user_id": user.pk,
        "pair_id": pair.pk,
        "source_amount": quote.source_amount,
        "target_amount": quote.target_amount,
        "fee": quote.fee,
        "price": quote.price,
        "status": OrderStatus.SUCCESS.value,
        "error_code": "",
        "error_message": "",
    }
    try:
        result = ledger.post(
            senders=(user.pk,),
            legs=legs,
            kind=BusinessType.CONVERT,
            reference=f"convert:{quote.quote_id}",
            memo=f"{pair.source.code}->{pair.target.code} quote {quote.quote_id}",
            row=ledger.LinkedRow(Order, values),
        )
    except IntegrityError as exc:  # the quote's order (or posting reference) exists: accepted concurrently
        raise errors.QuoteAlreadyUsed() from exc
    except AccountMayNotSend:  # frozen since the checks above, as the ledger saw under the lock
        _fail(quote, errors.AccountUnavailable())
    stored = {"id": result.row_id, "posting_id": result.posting_id, "created_at": result.created_at, **values}
    fields = Order._meta.concrete_fields
    order = Order.from_db("default", [f.attname for f in fields], [stored.get(f.attname) for f in fields])
    return order


def _free(account_id: int, asset_code: str) -> Decimal:
    row = Balance.objects.filter(account_id=account_id, asset__code=asset_code).values_list("free", flat=True).first()
    return row if row is not None else Decimal(0)


def _payers(asset_code: str, needed: Decimal) -> list[tuple[int, Decimal]] | None:
    """The shards that pay `needed`: the richest alone when it can, else the richest few together
    (one posting locks them all, in the ledger's order); None when the house cannot pay."""
    shards = ledger.role_account_ids(SystemRole.CONVERT_LIQUIDITY)
    rows = (
        Balance.objects.filter(account_id__in=shards, asset__code=asset_code, free__gt=0)
        .order_by("-free", "account_id")
        .values_list("account_id", "free")
    )
    payers, left = [], needed
    for account_id, available in rows:
        part = min(available, left)
        payers.append((account_id, part))
        left -= part
        if left <= 0:
            return payers
    return None


TOP_UP_PERMISSION = "accounts.add_manualadjustment"  # the Treasury's, as for proposing an adjustment


def liquidity_top_up(
    *, asset_code: str, amount: Decimal, actor: User, reason: str | None, request_id: str | None = None
) -> int:
    """Operators add `amount` of an asset to the house's convert liquidity, from equity, spread
    evenly over the shards: one posting (the actor, and the reason in its memo), by a staff member
    with TOP_UP_PERMISSION, audited ("liquidity.top_up") in the same transaction. Refused before
    anything moves without a reason (ReasonRequired), without the permission (StaffNotPermitted, a
    PermissionDenied) and for an amount not above zero (ValueError). With the admin form's
    `request_id` a double submit posts once (the posting's unique reference) and is audited once.
    Returns the posting's id."""
    reason = require_reason(reason)
    require_permission(actor, TOP_UP_PERMISSION, "You may not top up the convert liquidity.")
    if amount <= 0:
        raise ValueError("A top-up must be positive.")
    reference = f"convert-liquidity:{request_id or secrets.token_hex(12)}"
    posted = Posting.objects.filter(reference=reference).values_list("pk", flat=True).first()
    if posted is not None:  # the same form submitted again, after the first committed
        return posted
    shards = ledger.role_account_ids(SystemRole.CONVERT_LIQUIDITY)
    with localcontext(prec=60):
        share = _down(amount / len(shards), 18)
    legs = []
    equity = ledger.system_account_id(SystemRole.EQUITY)
    for i, shard in enumerate(shards):
        part = share if i else amount - share * (len(shards) - 1)
        if part > 0:
            legs += ledger.move(equity, shard, asset_code, part)
    with staff_action(actor=actor, action="liquidity.top_up", reason=reason) as draft:
        try:
            result = ledger.post(
                legs=legs,
                kind=BusinessType.OTHERS,
                reference=reference,
                memo=f"convert liquidity top-up by {actor.email}: {reason}"[:255],
                actor_id=actor.pk,
            )
            posting_id = result.posting_id
        except IntegrityError:  # the same form submitted at the same time: posted once
            posting_id = Posting.objects.get(reference=reference).pk
        draft.target = Posting.objects.get(pk=posting_id)
        draft.after = {"asset": asset_code, "amount": amount, "posting": posting_id}
    logger.info("Convert liquidity +%s %s by %s: %s", amount, asset_code, actor.email, reason)
    return posting_id


def asset_price_apply(row: AssetPrice, changes: dict) -> AssetPrice:
    """Apply a staff change of an asset's price settings (exchange/backoffice/changes.py calls it with the
    locked row, once approved where it must be): a new anchor moves the price there at once and
    confirms it; the price source then walks it around."""
    if "anchor_price" in changes:
        changes = {**changes, "price": changes["anchor_price"], "price_updated_at": timezone.now()}
    return apply_fields(row, changes)
