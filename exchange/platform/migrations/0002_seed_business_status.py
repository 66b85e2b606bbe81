from django.db import migrations


def seed(apps, schema_editor):
    BusinessStatus = apps.get_model("exchange", "BusinessStatus")
    for business_type in ("SPOT", "CONVERT"):
        BusinessStatus.objects.get_or_create(business_type=business_type, defaults={"is_on": True})


class Migration(migrations.Migration):
    dependencies = [("exchange", "0001_initial")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
