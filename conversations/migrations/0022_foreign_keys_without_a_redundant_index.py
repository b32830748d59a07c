"""The foreign keys whose column leads a unique constraint or a composite index lose their
own index (issue 30): one index less to write per new contact, conversation and turn, and
no narrower index for a planner without statistics to prefer over the key's unique one
(admission's lookup read a whole channel's conversations per new chat on a new
PostgreSQL database: conversations.models.messages).

The indexes are dropped by name, not by AlterField's own SQL: on PostgreSQL that drops and
re-adds each foreign key (a scan of the table to validate it) and took the partial unique
index one_running_turn_per_conversation (on the same single column) with the turn's, and
on SQLite it rebuilds the six tables."""

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): Django's names for them, the same on SQLite and PostgreSQL.
DROPPED = [
    ("conversations_contact_channel_id_a91d73d6", "conversations_contact", "channel_id"),
    ("conversations_conversation_channel_id_c75ad9c1", "conversations_conversation", "channel_id"),
    ("conversations_mediafile_channel_id_e2764c91", "conversations_mediafile", "channel_id"),
    ("conversations_messageedit_conversation_id_1bb6431f", "conversations_messageedit", "conversation_id"),
    ("conversations_messageedit_message_id_ac97acb8", "conversations_messageedit", "message_id"),
    ("conversations_turn_conversation_id_5017480b", "conversations_turn", "conversation_id"),
]


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0021_index_of_held_conversations'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(f'DROP INDEX IF EXISTS "{index}"',
                                  reverse_sql=f'CREATE INDEX "{index}" ON "{table}" ("{column}")')
                for index, table, column in DROPPED
            ],
            state_operations=[
                migrations.AlterField(
                    model_name='contact',
                    name='channel',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='contacts', to='conversations.channel'),
                ),
                migrations.AlterField(
                    model_name='conversation',
                    name='channel',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='conversations', to='conversations.channel'),
                ),
                migrations.AlterField(
                    model_name='mediafile',
                    name='channel',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='media_files', to='conversations.channel'),
                ),
                migrations.AlterField(
                    model_name='messageedit',
                    name='conversation',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='edits', to='conversations.conversation'),
                ),
                migrations.AlterField(
                    model_name='messageedit',
                    name='message',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='edits', to='conversations.inboundmessage'),
                ),
                migrations.AlterField(
                    model_name='turn',
                    name='conversation',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='turns', to='conversations.conversation'),
                ),
            ],
        ),
    ]
