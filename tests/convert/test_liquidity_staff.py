"""The convert liquidity top-up moves the house's money, so its service checks the staff member's
permission and writes the audit row itself (issue 36, item 3): called directly, as a management
command or a future API would, by someone without the Treasury's "add manual adjustment" it is
refused (a PermissionDenied), nothing is posted and nothing recorded; by someone with it, one
posting and one audit row, also for the same form sent twice."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied

from accounts.ledger.models import Posting
from convert import services
from exchange.backoffice.models import StaffAction
from exchange.backoffice.services import ReasonRequired
from tests.convert.helpers import free, shards
from tests.support.assertions import assert_ledger_balanced
from tests.support.factories import UserFactory
from tests.support.staff import ADMINISTRATOR, SUPPORT, TREASURY, staff_member


def _house(code: str) -> Decimal:
    return sum((free(s, code) for s in shards()), Decimal(0))


def test_a_top_up_without_the_permission_is_refused_and_nothing_moves(convert_world):
    retired = staff_member(TREASURY)
    retired.is_active = False
    retired.save(update_fields=["is_active"])
    before = _house("BTC")
    for someone in (staff_member(SUPPORT), UserFactory(), retired):
        with pytest.raises(PermissionDenied, match="may not top up"):
            services.liquidity_top_up(asset_code="BTC", amount=Decimal(5), actor=someone, reason="weekend buffer")
    with pytest.raises(ReasonRequired):
        services.liquidity_top_up(asset_code="BTC", amount=Decimal(5), actor=staff_member(TREASURY), reason=" ")
    assert _house("BTC") == before
    assert not Posting.objects.filter(reference__startswith="convert-liquidity:").exists()
    assert not StaffAction.objects.exists()


@pytest.mark.parametrize("role", [TREASURY, ADMINISTRATOR])
def test_the_top_up_service_writes_its_own_audit_row_once_per_form(convert_world, role):
    treasurer = staff_member(role)
    before = _house("BTC")
    for _ in range(2):  # the same form sent twice
        posting_id = services.liquidity_top_up(
            asset_code="BTC", amount=Decimal("10.5"), actor=treasurer, reason="weekend buffer", request_id="form-1"
        )
    assert _house("BTC") == before + Decimal("10.5")
    row = StaffAction.objects.get(action="liquidity.top_up")
    assert (row.actor, row.object_type, row.object_id) == (treasurer, "accounts.posting", str(posting_id))
    assert (row.reason, row.after) == ("weekend buffer", {"asset": "BTC", "amount": "10.5", "posting": posting_id})
    assert_ledger_balanced()
