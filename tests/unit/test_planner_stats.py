"""agentloop.core.planner_stats: a hot table that outgrew its statistics is analyzed, and a
statement prepared while it was small is planned again for its size."""

import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentloop.core import planner_stats
from conversations.models import Channel, Contact

TABLE = Contact._meta.db_table


def _plan(cursor):
    cursor.execute("EXPLAIN EXECUTE by_ids(ARRAY[1, 2, 3]::bigint[])")
    return " ".join(line for (line,) in cursor.fetchall())


def _grown_within(seconds):
    """planner_stats.grown([TABLE]) once the server's activity statistics show the rows
    just inserted (a backend reports them after its transaction, within a second)."""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    while (found := planner_stats.grown([TABLE])) == [] and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="PostgreSQL's planner statistics")
def test_a_table_that_outgrew_its_statistics_is_analyzed_and_its_prepared_plans_made_again(transactional_db):
    channel = Channel.objects.create(slug="stats", kind="api")
    Contact.objects.bulk_create(Contact(channel=channel, platform_id=f"p{i}") for i in range(20))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {TABLE}")  # counted while small, as a young table's first analysis
        # What a connection's fifth run of a statement does (prepare_threshold), its plan
        # the generic one, as PostgreSQL keeps it when it costs no more than a custom one.
        cursor.execute("SET plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE by_ids(bigint[]) AS SELECT id FROM {TABLE} WHERE id = ANY($1)")
        assert "Seq Scan" in _plan(cursor)
    assert planner_stats.refresh([TABLE]) == []  # not grown: nothing analyzed

    Contact.objects.bulk_create(Contact(channel=channel, platform_id=f"q{i}") for i in range(3000))
    assert _grown_within(10) == [TABLE]
    assert planner_stats.refresh([TABLE]) == [TABLE]
    with connection.cursor() as cursor:
        assert "Index" in _plan(cursor)  # planned again, for 3,020 rows
        cursor.execute(f"SELECT reltuples FROM pg_class WHERE relname = '{TABLE}'")
        assert cursor.fetchone()[0] == 3020
        cursor.execute("DEALLOCATE by_ids")
        cursor.execute("RESET plan_cache_mode")
    assert planner_stats.refresh([TABLE]) == []  # counted now: not again


@pytest.mark.skipif("connection.vendor == 'postgresql'", reason="SQLite's side: nothing to do")
def test_on_sqlite_nothing_is_analyzed(transactional_db):
    with CaptureQueriesContext(connection) as queries:
        assert planner_stats.refresh([TABLE]) == []
    assert queries.captured_queries == []
