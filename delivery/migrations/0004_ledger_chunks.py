"""A long reply's chunks on its ledger row, with how many started and how many are known
delivered. (Rows claimed by an older build have attempts and no chunk started: the claim
labels them all the same, see `delivery.ledger._started_before`.)"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("delivery", "0003_ledger_schedules")]

    operations = [
        migrations.AddField("outboundmessage", "chunks", models.JSONField(blank=True, default=list)),
        migrations.AddField("outboundmessage", "chunks_started", models.PositiveIntegerField(
            default=0, help_text="Chunks whose send has started.")),
        migrations.AddField("outboundmessage", "chunks_delivered", models.PositiveIntegerField(
            default=0, help_text="Chunks known delivered, in order.")),
    ]
