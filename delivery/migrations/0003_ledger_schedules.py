"""django-q2 schedules for the ledger: every minute a safety sweep (stale rows abandoned,
due rows delivered even if no worker loop runs), every day the pruning of finished rows
older than 7 days."""

from django.db import migrations

SCHEDULES = {
    "agentloop-ledger-safety-sweep": {"func": "delivery.ledger.safety_sweep", "schedule_type": "I", "minutes": 1},
    "agentloop-ledger-prune": {"func": "delivery.ledger.prune", "schedule_type": "D"},
}


def create(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Schedule = apps.get_model("django_q", "Schedule")
    for name, fields in SCHEDULES.items():
        Schedule.objects.using(db).update_or_create(name=name, defaults={**fields, "repeats": -1})


def delete(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    apps.get_model("django_q", "Schedule").objects.using(db).filter(name__in=list(SCHEDULES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("delivery", "0002_ledger"),
        ("django_q", "0019_alter_task_options_alter_ormq_key_alter_ormq_lock_and_more"),
    ]

    operations = [migrations.RunPython(create, delete)]
