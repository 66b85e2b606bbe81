# Partial indexes on the open withdrawals and deposits. On PostgreSQL they are built CONCURRENTLY
# (outside a transaction): a plain CREATE INDEX would block every withdrawal and deposit write for
# the whole scan of tables that only grow. SQLite (the embedded mode) builds them plainly.

from django.conf import settings
from django.db import migrations, models


class AddIndexOnline(migrations.AddIndex):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        self._change(schema_editor, to_state.apps.get_model(app_label, self.model_name), schema_editor.add_index)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        self._change(schema_editor, from_state.apps.get_model(app_label, self.model_name), schema_editor.remove_index)

    def _change(self, schema_editor, model, change):
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if schema_editor.connection.vendor == "postgresql":
            change(model, self.index, concurrently=True)
        else:
            change(model, self.index)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ('wallet', '0003_withdrawal_two_approvers'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexOnline(
            model_name='deposit',
            index=models.Index(condition=models.Q(('status__in', [0, 3])), fields=['status'], name='deposit_open'),
        ),
        AddIndexOnline(
            model_name='withdrawal',
            index=models.Index(condition=models.Q(('stage__in', ['AWAITING_APPROVAL', 'QUEUED', 'BROADCASTING'])), fields=['stage', 'updated_at'], name='withdrawal_open'),
        ),
        AddIndexOnline(
            model_name='withdrawal',
            index=models.Index(condition=models.Q(('confirmations__lt', 100), ('stage', 'SUCCEEDED')), fields=['id'], name='withdrawal_confirming'),
        ),
    ]
