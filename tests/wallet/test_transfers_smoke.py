from decimal import Decimal

import pytest

from accounts.ledger.check import ledger_check
from accounts.models import Balance
from tests.support.assertions import assert_error


def _free(email, code):
    return Balance.objects.get(account__email=email, asset__code=code).free


@pytest.mark.django_db
def test_transfer_by_email_and_phone_and_query(master_client, demo, settings):
    settings.IP_WEIGHT_LIMIT_PER_MINUTE = settings.UID_WEIGHT_LIMIT_PER_MINUTE = 10_000
    before = _free("peer@demo.exchange", "PHP")
    response = master_client.post(
        "/openapi/transfer/v4/transfers",
        {
            "account": "PHP",
            "target_address": "peer@demo.exchange",
            "amount": "150.5",
            "client_transfer_id": "c1",
            "message": "lunch",
        },
    )
    assert response.status_code == 200, response.content
    transfer = response.json()["transfer"]
    assert transfer["status"] == "success"
    assert transfer["amount"] == "150.50"
    by_phone = master_client.post(
        "/openapi/transfer/v3/transfers", {"account": "PHP", "target_address": "+639170000002", "amount": "1"}
    )
    assert by_phone.status_code == 200, by_phone.content
    assert _free("peer@demo.exchange", "PHP") == before + Decimal("151.5")
    repeat = master_client.post(
        "/openapi/transfer/v4/transfers",
        {"account": "PHP", "target_address": "peer@demo.exchange", "amount": "1", "client_transfer_id": "c1"},
    )
    assert_error(repeat, -1010, 400)
    listed = master_client.get("/openapi/transfer/v3/transfers", {"recvWindow": 5000}).json()
    assert [t["type"] for t in listed["transfers"]] == [2, 2]
    one = master_client.get(f"/openapi/transfer/v3/transfers/{transfer['id']}", {"recvWindow": 5000}).json()
    assert one["transfer"]["client_transfer_id"] == "c1"
    assert ledger_check().ok
