"""Virtual sub-accounts keep the e-mail their master named them with (issue 34): the family's
endpoints answer and take that e-mail (`User.requested_email`), while the account's own address stays
in the reserved space.

- A sub-account already in the space (`name_domain@m<master>.<VIRTUAL_SUB_ACCOUNT_DOMAIN>`, made by
  the create call or moved by 0003) gets its name read back from the address: a DNS domain has no
  `_`, so the last `_` of the local part splits it.
- A virtual sub-account still holding a customer-like e-mail (0003 left those whose address would
  be too long or was taken) moves into the space now, so that it blocks nobody's registration: to
  the name's address, or else to `sub<id>@m<master>.<domain>`; the old e-mail becomes its name.
- A name the family already uses (the constraint is one per master) is left blank: that sub-account
  is shown and found by its address.
Run twice, it changes nothing more."""

from django.conf import settings
from django.db import migrations

EMAIL_LENGTH = 254


def _in_space(email: str, reserved: str) -> bool:
    domain = email.rpartition("@")[2]
    return domain == reserved or domain.endswith("." + reserved)


def name_the_virtual_sub_accounts(apps, schema_editor):
    User = apps.get_model("accounts", "User")
    reserved = settings.VIRTUAL_SUB_ACCOUNT_DOMAIN
    rows = User.objects.filter(is_virtual=True, master__isnull=False, requested_email="").order_by("id")
    for user in rows.only("pk", "email", "master_id"):
        email = user.email.strip().lower()
        local, _, domain = email.rpartition("@")
        address = email
        if _in_space(email, reserved):
            name_local, sep, name_domain = local.rpartition("_")
            own_space = domain == f"m{user.master_id}.{reserved}"
            name = f"{name_local}@{name_domain}" if sep and name_local and "." in name_domain and own_space else ""
        else:
            name = email
            address = f"{local}_{domain}@m{user.master_id}.{reserved}"
            if len(address) > EMAIL_LENGTH or User.objects.filter(email__iexact=address).exists():
                address = f"sub{user.pk}@m{user.master_id}.{reserved}"
        family = User.objects.filter(master_id=user.master_id).exclude(pk=user.pk)
        if name and family.filter(requested_email__iexact=name).exists():
            name = ""
        User.objects.filter(pk=user.pk).update(email=address, requested_email=name)


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0017_s42f_requested_email"),
        ("subaccounts", "0003_virtual_addresses"),
    ]

    operations = [migrations.RunPython(name_the_virtual_sub_accounts, migrations.RunPython.noop)]
