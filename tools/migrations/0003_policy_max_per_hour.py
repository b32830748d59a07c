"""A per-scope hourly limit on tool policies, and email_send closed as an open relay:
an installation that already has its policy row (created on first use with the old
defaults) gets the new ones — approval and ten an hour per contact. Operators who
trust their users switch approval off again in the admin."""

import django.core.validators
from django.db import migrations, models


def close_the_relay(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    apps.get_model("tools", "ToolPolicy").objects.using(db).filter(name="email_send").update(
        requires_approval=True, max_per_hour=10)


class Migration(migrations.Migration):

    dependencies = [
        ('tools', '0002_guard_sweep_schedule'),
    ]

    operations = [
        migrations.AddField(
            model_name='toolpolicy',
            name='max_per_hour',
            field=models.PositiveIntegerField(blank=True, help_text='At most this many calls per scope (one contact) in any hour, proposals included; the next ones fail and the model is told why. Empty: no limit.', null=True, validators=[django.core.validators.MinValueValidator(1)]),
        ),
        migrations.RunPython(close_the_relay, migrations.RunPython.noop),
    ]
