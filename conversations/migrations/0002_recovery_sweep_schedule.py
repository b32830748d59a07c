"""The django-q2 safety net: every minute, flush overdue buffers and recover dead
workers' turns even if no worker loop is running."""

from django.db import migrations


def create_schedule(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.using(db).update_or_create(
        name="agentloop-recovery-sweep",
        defaults={"func": "conversations.engine.recovery_sweep", "schedule_type": "I", "minutes": 1,
                  "repeats": -1},
    )


def delete_schedule(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    apps.get_model("django_q", "Schedule").objects.using(db).filter(name="agentloop-recovery-sweep").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
