"""The looks for rows in an open state stay index probes when the database has
statistics (agentloop.core.rows.rare). SQLite's statistics (ANALYZE, or `PRAGMA
optimize`) say only how many rows a value matches on average: on a ledger of finished
rows `state = 'pending'` reads as the whole table, and the planner walked it — in
creation order for the claim's look, by channel for the abandon sweep, and the buffers
in id order for the typing look (tests.bench.grown's file: 340, 420 and 50 ms a look,
from three threads of the worker; issue 30's flush lateness on the grown database).
Each statement is run for its answer on both databases; on SQLite its plan, after an
ANALYZE of tables that hold many finished rows and one open one, is read too."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations.models import BufferState, MessageBuffer
from conversations.sql import turns as turn_sql
from delivery.ledger import claiming, sweeps
from delivery.models import OutboundKind, OutboundMessage, OutboundState

pytestmark = pytest.mark.django_db

FINISHED = 300


def analyzed(*models):
    """SQLite's statistics of these tables (in the test's transaction, rolled back after it)."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            for model in models:
                cursor.execute(f"ANALYZE {model._meta.db_table}")


def plans(captured, table) -> list[str]:
    """The SQLite plan of each captured SELECT of `table`."""
    reads = [q["sql"] for q in captured if q["sql"].startswith("SELECT") and f'"{table}"' in q["sql"]]
    assert reads, f"no read of {table} captured"
    with connection.cursor() as cursor:
        return [" / ".join(row[3] for row in cursor.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()) for sql in reads]


@pytest.fixture
def ledger(make_channel, make_conversation):
    """FINISHED delivered rows, one pending and one abandoned-worthy (pending, two days old)."""
    conversation = make_conversation(make_channel())
    OutboundMessage.objects.bulk_create([
        OutboundMessage(conversation=conversation, channel=conversation.channel, chat_id="ana", kind=OutboundKind.REPLY,
                        text=f"r{i}", state=OutboundState.DELIVERED) for i in range(FINISHED)])
    fresh = OutboundMessage.objects.create(conversation=conversation, channel=conversation.channel, chat_id="ana",
                                           kind=OutboundKind.REPLY, text="ahora", state=OutboundState.PENDING)
    stale = OutboundMessage.objects.create(conversation=conversation, channel=conversation.channel, chat_id="ana",
                                           kind=OutboundKind.REPLY, text="antes", state=OutboundState.PENDING)
    OutboundMessage.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(days=2))
    analyzed(OutboundMessage)
    return fresh, stale


def walks(plan, table) -> bool:
    """A full pass over the table: SQLite's SCAN (of the table or along one of its indexes)."""
    return f"SCAN {table}" in plan or plan.startswith("SCAN b")


def test_the_claims_look_finds_the_open_rows_by_their_state(ledger):
    fresh, _ = ledger
    with CaptureQueriesContext(connection) as captured:
        assert claiming.claimable_ids(limit=32) == [fresh.pk]  # the stale one is past its freshness
    if connection.vendor == "sqlite":
        for plan in plans(captured, "delivery_outboundmessage"):
            assert not walks(plan, "delivery_outboundmessage"), plan
            assert "USING INDEX outbound_" in plan and "(state=" in plan, plan


def test_the_abandon_sweep_finds_the_stale_rows_by_their_state(ledger):
    fresh, stale = ledger
    with CaptureQueriesContext(connection) as captured:
        assert sweeps.abandon_stale() == 1
    assert OutboundMessage.objects.get(pk=stale.pk).state == OutboundState.ABANDONED
    assert OutboundMessage.objects.get(pk=fresh.pk).state == OutboundState.PENDING
    if connection.vendor == "sqlite":
        first, *_ = plans(captured, "delivery_outboundmessage")
        assert not walks(first, "delivery_outboundmessage") and "(state=" in first, first


def test_the_typing_look_finds_the_open_buffers_by_their_state(make_channel, make_conversation):
    channel = make_channel()
    quiet = [make_conversation(channel, f"q{i}") for i in range(3)]
    now = timezone.now()
    MessageBuffer.objects.bulk_create([
        MessageBuffer(conversation=quiet[i % 3], state=BufferState.FLUSHED, first_message_at=now, last_message_at=now,
                      flush_at=now, flushed_at=now) for i in range(FINISHED)])
    typing = make_conversation(channel, "ana")
    open_ = MessageBuffer.objects.create(conversation=typing, first_message_at=now, last_message_at=now,
                                         flush_at=now + timedelta(seconds=2))
    analyzed(MessageBuffer)
    with CaptureQueriesContext(connection) as captured:
        found = turn_sql.open_windows([channel.pk], 0, 1, 50)
    assert [(conversation, buffer) for conversation, buffer, *_ in found] == [(typing.pk, open_.pk)]
    if connection.vendor == "sqlite":
        plan, = plans(captured, "conversations_messagebuffer")
        assert not walks(plan, "conversations_messagebuffer"), plan
        assert "(state=" in plan, plan
