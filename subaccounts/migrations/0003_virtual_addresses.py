"""Virtual sub-accounts created before their own address space (issue 25, finding 4) move into it.

A virtual sub-account used to take the e-mail its master sent as its address, squatting whoever
owns that e-mail. Each such sub-account now gets the address subaccounts/addresses.py gives a new
one (`name_domain@m<master>.<VIRTUAL_SUB_ACCOUNT_DOMAIN>`); its master keeps calling it by the old
e-mail, which every sub-account endpoint still accepts as its name. An address that would be too
long for the column keeps the old e-mail (P2P from outside the family is refused for it anyway)."""

from django.conf import settings
from django.db import migrations

EMAIL_LENGTH = 254


def move_into_the_virtual_space(apps, schema_editor):
    User = apps.get_model("accounts", "User")
    reserved = settings.VIRTUAL_SUB_ACCOUNT_DOMAIN
    for user in User.objects.filter(is_virtual=True, master__isnull=False).only("pk", "email", "master_id"):
        email = user.email.strip().lower()
        domain = email.rpartition("@")[2]
        if domain == reserved or domain.endswith("." + reserved):
            continue
        local = email.rpartition("@")[0]
        address = f"{local}_{domain}@m{user.master_id}.{reserved}"
        if len(address) > EMAIL_LENGTH or User.objects.filter(email__iexact=address).exists():
            continue
        User.objects.filter(pk=user.pk).update(email=address)


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0014_adjustment_four_eyes"),
        ("subaccounts", "0002_fund_collection"),
    ]

    operations = [migrations.RunPython(move_into_the_virtual_space, migrations.RunPython.noop)]
