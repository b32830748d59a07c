"""No foreign key of ours keeps an index of its own when a unique constraint or a
composite index already starts with its column (issue 30). Such an index is one more
write per row, and it is narrower than the one it shadows: on a PostgreSQL database
without statistics yet (a new install, its first minute) the planner costed the two
alike for admission's lookup by (channel, chat, sender) and took the channel's index,
reading every conversation of the channel for each new chat — 3.7 ms and 378 buffers a
batch at 8,000 conversations (`tests.bench.cpu` with pg_stat_statements and auto_explain).

Read from the models, so the rule holds for a table before it exists; the last test
reads the migrated schema itself."""

from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.db import connection, models


def our_apps():
    """The installed apps whose code is this project's (not Django's, not a library's)."""
    base = Path(settings.BASE_DIR)
    return [config for config in apps.get_app_configs()
            if Path(config.path).is_relative_to(base) and ".venv" not in Path(config.path).parts]


def leading_columns(model) -> list[tuple[str, ...]]:
    """The column lists of `model`'s unique constraints and indexes that hold on every row
    (a partial one covers only some rows, so it replaces nothing)."""
    found = []
    for constraint in model._meta.constraints:
        if isinstance(constraint, models.UniqueConstraint) and constraint.condition is None and constraint.fields:
            found.append(tuple(model._meta.get_field(name).column for name in constraint.fields))
    for index in model._meta.indexes:
        if index.condition is None and index.fields:
            found.append(tuple(model._meta.get_field(name.lstrip("-")).column for name in index.fields))
    for together in model._meta.unique_together:
        found.append(tuple(model._meta.get_field(name).column for name in together))
    return found


def redundant_foreign_key_indexes() -> list[str]:
    redundant = []
    for app in our_apps():
        for model in app.get_models():
            wider = [columns for columns in leading_columns(model) if len(columns) > 1]
            for field in model._meta.local_fields:
                if isinstance(field, models.ForeignKey) and field.db_index and not field.unique:
                    if any(columns[0] == field.column for columns in wider):
                        redundant.append(f"{model._meta.label}.{field.name}")
    return redundant


def test_no_foreign_key_keeps_an_index_a_wider_one_starts_with():
    assert redundant_foreign_key_indexes() == []


def test_the_rule_sees_a_redundant_index():
    """The check itself: a model whose foreign key leads its unique constraint is caught."""

    class Probe(models.Model):
        channel = models.ForeignKey("conversations.Channel", on_delete=models.CASCADE)
        name = models.CharField(max_length=10)

        class Meta:
            app_label = "conversations"
            constraints = [models.UniqueConstraint(fields=["channel", "name"], name="probe_once")]

    try:
        assert "conversations.Probe" in [label.rsplit(".", 1)[0] for label in redundant_foreign_key_indexes()]
    finally:
        del apps.get_app_config("conversations").models["probe"]
        apps.clear_cache()


@pytest.mark.django_db
def test_the_migrated_schema_has_no_index_on_a_leading_foreign_key_alone():
    """The migrations dropped them (by name: AlterField's own SQL took a partial unique
    index on the same column along on PostgreSQL), and kept the partial ones."""
    with connection.cursor() as cursor:
        conversation = connection.introspection.get_constraints(cursor, "conversations_conversation")
        turn = connection.introspection.get_constraints(cursor, "conversations_turn")
    assert [name for name, c in conversation.items() if c["index"] and c["columns"] == ["channel_id"]] == []
    assert "one_running_turn_per_conversation" in turn
    assert [name for name, c in turn.items()
            if c["index"] and not c["unique"] and c["columns"] == ["conversation_id"]] == []
