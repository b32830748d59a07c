"""django-q2 schedule for the retention sweep (conversations.retention.sweep), every 10
minutes; it prunes the ledger too, so the ledger's own daily prune is retired."""

from django.db import migrations

NAME = "agentloop-retention-sweep"
LEDGER_PRUNE = "agentloop-ledger-prune"


def create(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.using(db).update_or_create(name=NAME, defaults={
        "func": "conversations.retention.sweep", "schedule_type": "I", "minutes": 10, "repeats": -1})
    Schedule.objects.using(db).filter(name=LEDGER_PRUNE).delete()


def delete(apps, schema_editor):
    db = schema_editor.connection.alias  # the database being migrated (migrate --database)
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.using(db).filter(name=NAME).delete()
    Schedule.objects.using(db).update_or_create(name=LEDGER_PRUNE, defaults={
        "func": "delivery.ledger.prune", "schedule_type": "D", "repeats": -1})


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0012_streaming"),
        ("delivery", "0003_ledger_schedules"),
    ]

    operations = [migrations.RunPython(create, delete)]
