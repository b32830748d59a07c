"""The foreign keys whose column leads a unique constraint or a composite index lose their
own index, dropped by name (conversations 0022 says why, and why not by AlterField's SQL)."""

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): Django's names for them, the same on SQLite and PostgreSQL.
DROPPED = [
    ("delivery_unreachablechat_channel_id_768997e4", "delivery_unreachablechat", "channel_id"),
]


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0022_foreign_keys_without_a_redundant_index'),
        ('delivery', '0013_indexes_for_a_grown_database'),
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
                    model_name='unreachablechat',
                    name='channel',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='unreachable_chats', to='conversations.channel'),
                ),
            ],
        ),
    ]
