"""The django-q2 safety net for the guard: every minute, claims left in flight by a dead
process become uncertain (and are reconciled where the tool can look itself up), and
proposals past their time expire — even if no worker loop is running."""

from django.db import migrations


def create_schedule(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.using(db).update_or_create(
        name="agentloop-guard-sweep",
        defaults={"func": "tools.guard.sweep", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def delete_schedule(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    apps.get_model("django_q", "Schedule").objects.using(db).filter(name="agentloop-guard-sweep").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("tools", "0001_initial"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create_schedule, delete_schedule)]
