"""Staff members and their logged-in admin clients, for the admin tests.

Roles are the groups of exchange/backoffice/roles.py: SUPPORT (read-only), TREASURY (money operations),
ADMINISTRATOR (everything operators do). `staff_member(role)` makes one with the test password
(tests.support.factories.TEST_PASSWORD), for a browser login."""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.test import Client

from accounts.models import User
from exchange.backoffice.roles import ADMINISTRATOR, SUPPORT, TREASURY
from tests.support.factories import TEST_PASSWORD, UserFactory

ROLES = (SUPPORT, TREASURY, ADMINISTRATOR)
__all__ = ["ADMINISTRATOR", "ROLES", "SUPPORT", "TEST_PASSWORD", "TREASURY", "logged_in", "staff_in", "staff_member"]


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff_in(make_user, group_name: str) -> User:
    """A staff member (made with the `make_user` fixture) in one of the roles of exchange/backoffice/roles.py."""
    user = make_user(is_staff=True)
    user.groups.add(Group.objects.get(name=group_name))
    return user


def staff_member(role: str, *, email: str | None = None) -> User:
    """A staff member in `role`, password TEST_PASSWORD (needs the database)."""
    extra = {"email": email} if email else {}
    user = UserFactory(is_staff=True, **extra)
    user.groups.add(Group.objects.get(name=role))
    return user
