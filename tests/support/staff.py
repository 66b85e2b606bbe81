"""Staff members and their logged-in admin clients, for the admin tests."""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.test import Client

from accounts.models import User


def logged_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def staff_in(make_user, group_name: str) -> User:
    """A staff member (made with the `make_user` fixture) in one of the roles of exchange/roles.py."""
    user = make_user(is_staff=True)
    user.groups.add(Group.objects.get(name=group_name))
    return user
