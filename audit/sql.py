"""audit's hand-written SQL, in one place (one statement): the audit rows of a batch of
events. Tables through `table(Model)`, columns by their bare names, values as
parameters, as in the other apps' `sql` modules."""

from collections.abc import Sequence
from typing import Any

from django.db import connection

from agentloop.core.rows import records, recordset, table
from audit.models import AuditEvent

COLUMNS = "kind, at, actor, channel_slug, conversation_id, target, summary, extra"


def insert_events(at: str | None, rows: Sequence[Sequence[Any]]) -> None:
    """Insert audit rows, each (kind, at, actor, channel slug, conversation id, target,
    summary, extra as JSON text); `at` the batch's time, as the database takes it. Plain
    SQL: a mass recovery writes thousands, and the ORM's per-field assembly of a bulk
    INSERT cost more than the INSERT."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The rows as one JSON parameter: one statement, not one per event (a recovery
            # of 500 rows was 500 INSERTs, half of the delivered mark's time).
            names = ("kind", "at", "actor", "slug", "conversation_id", "target", "summary", "extra")
            source = recordset("v", [("kind", "text"), ("actor", "text"), ("slug", "text"),
                                     ("conversation_id", "bigint"), ("target", "text"), ("summary", "text"),
                                     ("extra", "text")])
            cursor.execute(
                f"INSERT INTO {table(AuditEvent)} ({COLUMNS}) SELECT v.kind, %s, v.actor, v.slug, v.conversation_id, "
                f"v.target, v.summary, v.extra::jsonb FROM {source}", [at, records(names, rows)])
        else:
            cursor.executemany(f"INSERT INTO {table(AuditEvent)} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                               rows)
