"""What the sub-account tests share (kept with them: they are the only users): the endpoints and a
family of accounts built through the project's own services."""

from __future__ import annotations

from dataclasses import dataclass

from tests.support.factories import Customer, customer

LIST = "/openapi/v1/sub-account/list"
CREATE = "/openapi/v1/sub-account/create"
ASSET = "/openapi/v1/sub-account/asset"
UNIVERSAL = "/openapi/v1/sub-account/transfer/universal-transfer"
SUB_TO_MASTER = "/openapi/v1/sub-account/transfer/sub-to-master"
UNIVERSAL_HISTORY = "/openapi/v1/sub-account/transfer/universal-transfer-history"
SUB_HISTORY = "/openapi/v1/sub-account/transfer/sub-history"


@dataclass
class Family:
    master: Customer
    sub1: Customer
    sub2: Customer


def family_of(name: str, *, master_funding: dict, sub_funding: dict) -> Family:
    """A master and two virtual sub-accounts (sub1 funded with `sub_funding`), each with a key of
    every functional type."""
    master = customer(email=f"{name}-master@test.example", funding=master_funding)
    sub1 = customer(email=f"{name}-sub1@test.example", master=master.user, is_virtual=True, funding=sub_funding)
    sub2 = customer(email=f"{name}-sub2@test.example", master=master.user, is_virtual=True)
    return Family(master, sub1, sub2)


def ok(response) -> dict:
    assert response.status_code == 200, (response.status_code, response.content)
    return response.json()
