"""The foreign keys whose column leads a unique constraint or a composite index lose their
own index, dropped by name (conversations 0022 says why, and why not by AlterField's SQL)."""

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): Django's names for them, the same on SQLite and PostgreSQL.
DROPPED = [
    ("tools_calendarevent_calendar_id_17fa8304", "tools_calendarevent", "calendar_id"),
    ("tools_mcptool_server_id_856c67fa", "tools_mcptool", "server_id"),
]


class Migration(migrations.Migration):

    dependencies = [
        ('tools', '0007_indexes_for_a_grown_database'),
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
                    model_name='calendarevent',
                    name='calendar',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='events', to='tools.calendar'),
                ),
                migrations.AlterField(
                    model_name='mcptool',
                    name='server',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='tools', to='tools.mcpserver'),
                ),
            ],
        ),
    ]
