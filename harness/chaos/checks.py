"""The chaos run's final checks: the ledger, every transfer once, every withdrawal and collection
final and settled once, every websocket's events exactly once and in order."""

from __future__ import annotations

import itertools
from collections import Counter
from decimal import Decimal

from harness.chaos.records import FINAL_COLLECTION, LISTENERS, Check, Segment, tally
from harness.private import Book
from harness.services import manage


def account_positions(book: Book, account_id: int) -> list[dict]:
    """Each posting that touched the account, in sequence order: its first and last sequence and the
    outboundAccountPosition it must produce (u, and free/locked of each row)."""
    rows = book.rows(
        "SELECT c.seq, c.posting_id, a.code, c.free_after, c.locked_after, c.created_at"
        " FROM accounts_balancechange c JOIN accounts_asset a ON a.id = c.asset_id"
        " WHERE c.account_id = %s ORDER BY c.seq",
        [account_id],
    )
    positions: list[dict] = []
    for seq, posting, code, free, locked, created in rows:
        if positions and positions[-1]["posting"] == posting:
            group = positions[-1]
        else:
            group = {"posting": posting, "first": seq, "rows": []}
            positions.append(group)
        group["last"] = seq
        group["rows"].append((code, Decimal(free), Decimal(locked)))
        group["u"] = int(created.timestamp() * 1000)
    for group in positions:
        group["key"] = (group["u"], tuple(group["rows"]))
    return positions


def judge_segment(positions: list[dict], segment: Segment) -> None:
    """What one connection received against the feed: exactly the postings after its starting
    point (somewhere in [seq_lo, seq_hi]) up to the end, or, for one the server closed, a gapless
    run of them from that point."""
    keys = [p["key"] for p in positions]
    got = segment.feed.received
    first_after_lo = next((i for i, p in enumerate(positions) if p["first"] > segment.seq_lo), len(positions))
    first_after_hi = next((i for i, p in enumerate(positions) if p["first"] > segment.seq_hi), len(positions))
    final = segment.closed is None
    for start in range(first_after_lo, first_after_hi + 1):
        expected = keys[start:] if final else keys[start : start + len(got)]
        if got == expected:
            if not final:
                segment.verdict = f"{len(got)} positions, a gapless run of the feed until the close"
            elif got:
                segment.verdict = (
                    f"{len(got)} positions, exactly the {len(got)} postings since it connected, in order, "
                    "the last with the database's balance"
                )
            else:
                segment.verdict = "no posting touched the peer since it connected, and it received nothing"
            return
    index: dict[tuple, int] = {}
    for i, key in enumerate(keys):
        index.setdefault(key, i)
    seen = [index.get(key) for key in got]
    unknown = sum(1 for i in seen if i is None)
    known = [i for i in seen if i is not None]
    duplicates = len(known) - len(set(known))
    disorder = sum(1 for a, b in itertools.pairwise(known) if b <= a)
    begin = min(first_after_hi, known[0]) if known else first_after_hi
    end = len(keys) if final else (max(known) + 1 if known else begin)
    missing = sorted(set(range(begin, end)) - set(known))
    segment.ok = False
    segment.verdict = (
        f"{len(got)} positions against {end - begin} postings: missing {len(missing)}"
        f"{' (seq ' + ', '.join(str(positions[i]['first']) for i in missing[:5]) + ')' if missing else ''}, "
        f"duplicates {duplicates}, out of order {disorder}, not in the feed {unknown}; "
        f"last received {'matches' if got and keys and got[-1] == keys[-1] else 'does NOT match'} the database"
    )


# --- checks -------------------------------------------------------------------------------------------


def check_transfers(chaos) -> Check:
    sent = [a for a in chaos.record.answers if a.kind == "transfer"]
    rows = chaos.stack.book.rows(
        "SELECT client_transfer_id, id FROM wallet_transfer WHERE client_transfer_id LIKE %s", [f"chaos{chaos.seed}-t%"]
    )
    in_db: dict[str, list[str]] = {}
    for ident, pk in rows:
        in_db.setdefault(ident, []).append(str(pk))
    bad: list[str] = []
    ok200 = [a for a in sent if a.status == 200]
    refused = [a for a in sent if a.status is not None and 400 <= a.status < 500]
    unknown = [a for a in sent if a.unknown]
    for a in ok200:
        if in_db.get(a.ident) != [a.ref]:
            bad.append(f"{a.ident} answered 200 (id {a.ref}) but the database has {in_db.get(a.ident)}")
    for a in refused:
        if a.ident in in_db:
            bad.append(f"{a.ident} refused {a.label} but the database has {in_db[a.ident]}")
    done = not_done = 0
    for a in unknown:
        count = len(in_db.get(a.ident, []))
        asked = chaos.record.resolved.get(a.ident)
        if asked is None:
            bad.append(f"{a.ident} ({a.label}): the query by client_transfer_id got no answer")
        elif asked != count or count > 1:
            bad.append(f"{a.ident} ({a.label}): the API finds {asked}, the database {count}")
        if count:
            done += 1
        else:
            not_done += 1
    sent_ids = {a.ident for a in sent}
    strays = [ident for ident in in_db if ident not in sent_ids]
    if strays:
        bad.append(f"transfers in the database that were never sent: {strays[:5]}")
    detail = (
        f"{len(sent)} sent: {len(ok200)} answered 200, each once in the database with the id answered; "
        f"{len(refused)} refused {tally(refused)}, none in the database; {len(unknown)} unknown outcomes "
        f"{tally(unknown)} resolved by client_transfer_id: {done} done, {not_done} not done (API and database agree)"
    )
    if bad:
        detail += (
            "\n      " + "\n      ".join(bad[:10]) + (f"\n      ... {len(bad) - 10} more" if len(bad) > 10 else "")
        )
    return Check("transfers", not bad, detail)


def check_withdrawals(chaos) -> Check:
    sent = [a for a in chaos.record.answers if a.kind == "withdrawal"]
    rows = chaos.stack.book.rows(
        "SELECT withdraw_order_id, id, stage, attempts FROM wallet_withdrawal WHERE withdraw_order_id LIKE %s",
        [f"cw{chaos.seed}-%"],
    )
    by_ident = {ident: (str(pk), stage, attempts) for ident, pk, stage, attempts in rows}
    references: dict[str, list[str]] = {}
    book = chaos.stack.book
    for (reference,) in book.rows("SELECT reference FROM accounts_posting WHERE reference LIKE 'withdrawal:%'"):
        references.setdefault(reference.split(":")[1], []).append(reference.split(":")[2])
    broadcasts = dict(
        chaos.stack.book.rows(
            "SELECT client_reference, count(*) FROM wallet_simtransaction WHERE client_reference LIKE 'withdrawal:%'"
            " GROUP BY client_reference"
        )
    )
    bad: list[str] = []
    for a in sent:
        if a.status == 200 and (a.ident not in by_ident or by_ident[a.ident][0] != a.ref):
            bad.append(f"{a.ident} answered 200 (id {a.ref}) but the database has {by_ident.get(a.ident)}")
        if a.status is not None and 400 <= a.status < 500 and a.ident in by_ident:
            bad.append(f"{a.ident} refused {a.label} but exists: {by_ident[a.ident]}")
    stages = Counter(stage for _, stage, _ in by_ident.values())
    retried = sum(1 for _, _, attempts in by_ident.values() if attempts > 1)
    for ident, (pk, stage, _) in by_ident.items():
        legs = sorted(references.get(pk, []))
        want = {"SUCCEEDED": ["hold", "settle"], "FAILED": ["hold", "release"]}.get(stage)
        if want is None:
            bad.append(f"withdrawal {pk} ({ident}) still {stage}")
        elif legs != sorted(want):
            bad.append(f"withdrawal {pk} ({ident}) {stage} with postings {legs}")
        count = broadcasts.get(f"withdrawal:{pk}", 0)
        if count > 1 or (stage == "SUCCEEDED" and count != 1):
            bad.append(f"withdrawal {pk} ({ident}) {stage} broadcast {count} times")
    unknown = [a for a in sent if a.unknown]
    unknown_done = sum(1 for a in unknown if a.ident in by_ident)
    detail = (
        f"{len(sent)} applied: {sum(1 for a in sent if a.status == 200)} accepted, "
        f"{sum(1 for a in sent if a.status is not None and 400 <= a.status < 500)} refused, {len(unknown)} unknown "
        f"({unknown_done} done); in the database {len(by_ident)}: {dict(stages)}, {retried} run more than once; "
        "each with its hold and one settle (or release) posting, at most one broadcast"
    )
    if bad:
        detail += "\n      " + "\n      ".join(bad[:10])
    return Check("withdrawals", not bad, detail)


def check_collections(chaos) -> Check:
    sent = [a for a in chaos.record.answers if a.kind == "collection"]
    moved = [a for a in chaos.record.answers if a.kind == "universal"]
    rows = chaos.stack.book.rows(
        "SELECT client_request_id, id, status, attempts FROM subaccounts_fundcollection"
        " WHERE client_request_id LIKE %s",
        [f"chaos{chaos.seed}-c%"],
    )
    by_ident = {ident: (pk, status, attempts) for ident, pk, status, attempts in rows}
    book = chaos.stack.book
    subs = book.one("SELECT count(*) FROM accounts_user WHERE master_id = %s", [chaos.load.ids["master"]])[0]
    outcomes: dict[int, list[tuple]] = {}
    for collection, sub, status, posting in chaos.stack.book.rows(
        "SELECT collection_id, sub_id, status, posting_id FROM subaccounts_fundcollectionoutcome"
    ):
        outcomes.setdefault(collection, []).append((sub, status, posting))
    postings: dict[int, list[str]] = {}
    for (reference,) in book.rows("SELECT reference FROM accounts_posting WHERE reference LIKE 'fund-collect:%'"):
        _, collection, sub = reference.split(":")
        postings.setdefault(int(collection), []).append(sub)
    bad: list[str] = []
    for a in sent:
        if a.status == 200 and a.ident not in by_ident:
            bad.append(f"{a.ident} answered 200 but is not in the database")
        if a.status is not None and 400 <= a.status < 500 and a.ident in by_ident:
            bad.append(f"{a.ident} refused {a.label} but exists")
    collected = 0
    for ident, (pk, status, _) in by_ident.items():
        if status not in FINAL_COLLECTION:
            bad.append(f"collection {pk} ({ident}) still {status}")
            continue
        mine = outcomes.get(pk, [])
        per_sub = Counter(sub for sub, _, _ in mine)
        if len(per_sub) != subs or max(per_sub.values(), default=0) > 1:
            bad.append(f"collection {pk} ({ident}) has outcomes {sorted(per_sub.items())} for {subs} sub-accounts")
        posted = Counter(postings.get(pk, []))
        want = Counter(str(sub) for sub, outcome, _ in mine if outcome == "COLLECTED")
        if posted != want:
            bad.append(f"collection {pk} ({ident}): postings {dict(posted)} against COLLECTED outcomes {dict(want)}")
        collected += sum(want.values())
    universal_rows = dict(
        chaos.stack.book.rows(
            "SELECT client_tran_id, count(*) FROM subaccounts_subaccounttransfer WHERE client_tran_id LIKE %s"
            " GROUP BY client_tran_id",
            [f"chaos{chaos.seed}-u%"],
        )
    )
    for a in moved:
        count = universal_rows.get(a.ident, 0)
        if (a.status == 200 and count != 1) or (a.status is not None and 400 <= a.status < 500 and count) or count > 1:
            bad.append(f"universal transfer {a.ident} answered {a.label}, {count} in the database")
    statuses = Counter(status for _, status, _ in by_ident.values())
    detail = (
        f"{len(sent)} collect calls {tally(sent)}; in the database {len(by_ident)}: {dict(statuses)}, "
        f"{sum(1 for _, _, n in by_ident.values() if n > 1)} run more than once; {collected} sub-accounts collected, "
        f"one posting each; universal transfers {tally(moved)}, each 200 once in the database"
    )
    if bad:
        detail += "\n      " + "\n      ".join(bad[:10])
    return Check("collections", not bad, detail)


def check_websockets(chaos) -> Check:
    for segment in chaos.record.segments:
        chaos.judge_segment(segment)
    final = [s for s in chaos.record.segments if s.closed is None]
    closed = [s for s in chaos.record.segments if s.closed is not None]
    lines = []
    for s in chaos.record.segments:
        life = f"{chaos.record.rel(s.opened)} .. {chaos.record.rel(s.closed) if s.closed else 'the end'}"
        why = f", closed by the server ({s.closed_with})" if s.closed else ""
        lines.append(f"slot {s.slot} {life}{why}: {'ok' if s.ok else 'BROKEN'}: {s.verdict}")
    detail = (
        f"{len(chaos.record.segments)} connections on {LISTENERS} slots: {len(final)} stayed to the end, "
        f"{len(closed)} closed by the server {dict(Counter(s.closed_with for s in closed))} and replaced; "
        f"listenKey requests {tally([a for a in chaos.record.answers if a.kind == 'listenkey'])}, handshakes refused "
        f"{dict(chaos.record.handshake_refusals) or 'none'}\n      " + "\n      ".join(lines)
    )
    return Check("websockets", all(s.ok for s in chaos.record.segments) and len(final) == LISTENERS, detail)


def check_ledger(chaos) -> Check:
    done = manage(chaos.stack.env, "ledger_check")
    text = (done.stdout + done.stderr).strip()
    return Check("ledger_check", done.returncode == 0, text.splitlines()[-1] if text else f"exit {done.returncode}")
