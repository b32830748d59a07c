"""The django-q2 safety nets are scheduled by migrations; their functions exist."""

import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection
from django.utils.module_loading import import_string
from django_q.models import Schedule

pytestmark = pytest.mark.django_db

MIGRATIONS = ["conversations.migrations.0002_recovery_sweep_schedule", "tools.migrations.0002_guard_sweep_schedule",
              "delivery.migrations.0003_ledger_schedules", "conversations.migrations.0013_retention_sweep_schedule"]


def test_every_safety_net_is_scheduled_and_callable():
    Schedule.objects.all().delete()  # a transactional test before may have flushed them
    for name in MIGRATIONS:
        migration = importlib.import_module(name)
        # What the function reads of the schema editor Django passes it: the database migrated.
        (getattr(migration, "create_schedule", None) or migration.create)(apps, SimpleNamespace(connection=connection))
    schedules = {s.func: s for s in Schedule.objects.all()}
    assert set(schedules) == {"conversations.engine.recovery_sweep", "tools.guard.sweep",
                              "delivery.ledger.safety_sweep", "conversations.retention.sweep"}
    assert all(s.repeats == -1 for s in schedules.values())
    # The retention sweep prunes the ledger too: the ledger's own daily prune is retired.
    assert schedules["conversations.retention.sweep"].minutes == 10
    assert schedules["delivery.ledger.safety_sweep"].minutes == 1
    for func in schedules:
        assert callable(import_string(func))
