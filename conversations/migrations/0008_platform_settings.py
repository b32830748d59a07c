"""A platform's settings move from columns of Channel into Channel.platform_settings
(checked by the platform on save; see conversations.platforms), and Channel.send_blocked
replaces the ledger's platform rules. The values are copied both ways."""

from django.db import migrations, models

import conversations.models

TELEGRAM = {"bot_token": "bot_token", "webhook_secret": "webhook_secret", "api_base": "api_base",
            "telegram_mode": "mode"}
API = {"callback_url": "callback_url", "callback_secret": "callback_secret"}
COLUMNS = {"telegram": TELEGRAM, "api": API}


def blocked(kind, values) -> str:
    """As the platforms say on save (TelegramPlatform, ApiPlatform), for the rows copied."""
    if kind == "telegram" and not values.get("bot_token"):
        return "no bot_token set"
    if kind == "api" and values.get("callback_url") and not values.get("callback_secret"):
        return "the callback URL has no secret to sign with"
    return ""


def columns_to_settings(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Channel = apps.get_model("conversations", "Channel")
    for channel in Channel.objects.using(db):
        columns = COLUMNS.get(channel.kind, {})
        values = {key: getattr(channel, column) for column, key in columns.items() if getattr(channel, column)}
        Channel.objects.using(db).filter(pk=channel.pk).update(
            platform_settings=values, send_blocked=blocked(channel.kind, values))


def settings_to_columns(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Channel = apps.get_model("conversations", "Channel")
    for channel in Channel.objects.using(db):
        values = channel.platform_settings or {}
        columns = {column: values[key] for column, key in COLUMNS.get(channel.kind, {}).items() if values.get(key)}
        Channel.objects.using(db).filter(pk=channel.pk).update(**columns)


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0007_message_edits"),
    ]

    operations = [
        migrations.AddField(
            model_name="channel",
            name="platform_settings",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="channel",
            name="send_blocked",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
        migrations.RunPython(columns_to_settings, settings_to_columns),
        migrations.RemoveField(model_name="channel", name="api_base"),
        migrations.RemoveField(model_name="channel", name="bot_token"),
        migrations.RemoveField(model_name="channel", name="callback_secret"),
        migrations.RemoveField(model_name="channel", name="callback_url"),
        migrations.RemoveField(model_name="channel", name="telegram_mode"),
        migrations.RemoveField(model_name="channel", name="webhook_secret"),
        migrations.AlterField(
            model_name="channel",
            name="kind",
            field=models.CharField(choices=conversations.models._platform_choices, default="api", max_length=16),
        ),
        # Platform message ids longer than Telegram's (WhatsApp's wamid.… run to 60-80 characters).
        migrations.AlterField(
            model_name="inboundmessage",
            name="reply_target",
            field=models.CharField(blank=True, help_text="Platform id a reply threads to.", max_length=200),
        ),
        migrations.AlterField(
            model_name="turn",
            name="reply_target",
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
