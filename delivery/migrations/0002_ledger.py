"""The outbox becomes the delivery ledger: new states, the bot/chat kept on the row,
the claim token, flood and marker bookkeeping, unreachable chats."""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

STATES = {"sending": "attempting", "sent": "delivered", "failed": "abandoned"}


def forward(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Row = apps.get_model("delivery", "OutboundMessage")
    for old, new in STATES.items():
        Row.objects.using(db).filter(state=old).update(state=new)
    for row in Row.objects.using(db).select_related("conversation").filter(channel__isnull=True).iterator():
        Row.objects.using(db).filter(pk=row.pk).update(channel_id=row.conversation.channel_id, chat_id=row.conversation.chat_id)


def backward(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Row = apps.get_model("delivery", "OutboundMessage")
    for old, new in STATES.items():
        Row.objects.using(db).filter(state=new).update(state=old)


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0004_contextnote"),
        ("delivery", "0001_initial"),
    ]

    operations = [
        migrations.RenameField("outboundmessage", "sent_at", "delivered_at"),
        migrations.AddField("outboundmessage", "channel", models.ForeignKey(
            null=True, on_delete=django.db.models.deletion.CASCADE, related_name="outbound",
            to="conversations.channel")),
        migrations.AddField("outboundmessage", "chat_id", models.CharField(default="", max_length=100),
                            preserve_default=False),
        migrations.AddField("outboundmessage", "claim_token", models.CharField(blank=True, max_length=64)),
        migrations.AddField("outboundmessage", "flood_waits", models.PositiveIntegerField(
            default=0, help_text="Attempts refused by flood control.")),
        migrations.AddField("outboundmessage", "extra_resends", models.PositiveIntegerField(
            default=0, help_text="Granted by an operator's retry.")),
        migrations.AddField("outboundmessage", "needs_marker", models.BooleanField(
            default=False, help_text="The current attempt carries the recovery prefix.")),
        migrations.AddField("outboundmessage", "last_outcome", models.CharField(blank=True, choices=[
            ("delivered", "Delivered"), ("flood", "Flood control (retry after)"), ("temporary", "Temporary failure"),
            ("permanent", "Permanent failure"), ("ambiguous", "Ambiguous (may have arrived)")], max_length=16)),
        migrations.AddField("outboundmessage", "claimed_at", models.DateTimeField(blank=True, null=True)),
        migrations.AddField("outboundmessage", "retried_at", models.DateTimeField(
            blank=True, null=True, help_text="An operator's retry (freshness restarts).")),
        migrations.AlterField("outboundmessage", "attempts", models.PositiveIntegerField(
            default=0, help_text="Sends started (claims).")),
        migrations.AlterField("outboundmessage", "next_attempt_at", models.DateTimeField(
            blank=True, default=django.utils.timezone.now, null=True,
            help_text="Empty: the last budgeted attempt, kept for the next worker start.")),
        migrations.AlterField("outboundmessage", "state", models.CharField(choices=[
            ("pending", "Pending (never tried)"), ("attempting", "Attempting (claimed, sending)"),
            ("delivered", "Delivered"), ("failed", "Failed (will retry)"), ("unreachable", "Unreachable (permanent)"),
            ("abandoned", "Abandoned")], default="pending", max_length=16)),
        migrations.RunPython(forward, backward),
        migrations.AlterField("outboundmessage", "channel", models.ForeignKey(
            on_delete=django.db.models.deletion.CASCADE, related_name="outbound", to="conversations.channel")),
        migrations.AlterModelOptions("outboundmessage", {"verbose_name": "ledger row"}),
        migrations.AddIndex("outboundmessage", models.Index(fields=["state", "owner"], name="outbound_owner_idx")),
        migrations.AddIndex("outboundmessage", models.Index(fields=["claim_token"], name="outbound_claim_idx")),
        migrations.AddIndex("outboundmessage", models.Index(fields=["state", "claimed_at"],
                                                            name="outbound_claimed_idx")),
        migrations.CreateModel(
            name="UnreachableChat",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("chat_id", models.CharField(max_length=100)),
                ("error", models.CharField(max_length=300)),
                ("since", models.DateTimeField(default=django.utils.timezone.now)),
                ("last_failure_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("failures", models.PositiveIntegerField(default=1)),
                ("channel", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                              related_name="unreachable_chats", to="conversations.channel")),
            ],
            options={"constraints": [models.UniqueConstraint(fields=("channel", "chat_id"),
                                                             name="unreachable_chat_unique")]},
        ),
    ]
