"""Slack channels follow the common `group_replies` rule: their own `channel_messages`
setting (mentions/all) goes, mapped onto the channel's field (all → always, mentions or
unset → mention, what it meant before). Without this, a Slack channel saved later would
be refused for an unknown setting."""

from django.db import migrations, models

TO_GROUP_REPLIES = {"all": "always", "mentions": "mention"}
TO_CHANNEL_MESSAGES = {"always": "all"}


def forwards(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Channel = apps.get_model("conversations", "Channel")
    for channel in Channel.objects.using(db).filter(kind="slack"):
        values = dict(channel.platform_settings or {})
        old = values.pop("channel_messages", "mentions")
        channel.platform_settings = values
        channel.group_replies = TO_GROUP_REPLIES.get(old, "mention")
        channel.save(using=db, update_fields=["platform_settings", "group_replies"])


def backwards(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Channel = apps.get_model("conversations", "Channel")
    for channel in Channel.objects.using(db).filter(kind="slack"):
        values = dict(channel.platform_settings or {})
        values["channel_messages"] = TO_CHANNEL_MESSAGES.get(channel.group_replies, "mentions")
        channel.platform_settings = values
        channel.save(using=db, update_fields=["platform_settings"])


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0017_choices_of_groups_and_handoff"),
    ]

    operations = [
        migrations.AlterField(
            model_name='channel',
            name='group_replies',
            field=models.CharField(choices=[('always', 'Always: every message in a group'), ('mention', 'Mention: only messages that mention the bot or reply to it'), ('never', 'Never: groups are read, never answered')], default='mention', help_text='In group chats (Telegram groups, Slack channels): which messages the agent answers. The others are stored and given to the next turn addressed to it as context, never answered (docs/buffer.md#groups).', max_length=16),
        ),
        migrations.RunPython(forwards, backwards),
    ]
