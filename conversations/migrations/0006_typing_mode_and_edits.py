from django.db import migrations, models


def typing_mode_from_flag(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    # A channel that had typing switched off keeps it off; the others get the new default.
    Channel = apps.get_model("conversations", "Channel")
    Channel.objects.using(db).filter(typing_enabled=False).update(typing_mode="never")


class Migration(migrations.Migration):

    dependencies = [
        ('conversations', '0005_buffer_overflow_noticed'),
    ]

    operations = [
        migrations.AddField(
            model_name='channel',
            name='edits',
            field=models.CharField(choices=[('apply', 'Apply: the corrected text counts'), ('ignore', 'Ignore edits')], default='apply', max_length=16),
        ),
        migrations.AddField(
            model_name='channel',
            name='typing_mode',
            field=models.CharField(choices=[('instant', 'Instant: from the first message of a burst, through the window and the turn'), ('turn', 'Turn: only while the agent runs'), ('never', 'Never')], default='instant', max_length=16),
        ),
        migrations.RunPython(typing_mode_from_flag, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name='channel',
            name='typing_enabled',
        ),
    ]
