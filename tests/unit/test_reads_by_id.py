"""Reads of rows the caller names by id go by the primary key, never by an index on the
state those rows may be in: the finished states (done, cancelled, abandoned…) grow by
the million, and SQLite, which keeps no statistics, took the state index for a
`state IN (…)` test and walked every finished row. `turns.finish_many`'s read of the
turns it had just ended cost 291 ms a batch on a file of 385,000 turns, in the worker's
one database thread, and the sustained benchmark's replies fell behind after eight
minutes (issue 30). Checked on each database's plan; on PostgreSQL the table scan is
ruled out, as these tables are tiny here."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from conversations import turns
from conversations.models import Turn, TurnState
from conversations.worker.turn_runner import TurnRunner
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState

pytestmark = pytest.mark.django_db


def plans_of_reads(captured, table) -> list[str]:
    """The plan of each SELECT of `table` among the captured statements."""
    reads = [q["sql"] for q in captured if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]]
    assert reads, f"no read of {table} captured"
    plans = []
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
        for sql in reads:
            cursor.execute(("EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN ") + sql)
            plans.append(" ".join(str(row) for row in cursor.fetchall()))
    return plans


def by_primary_key(plan, table) -> bool:
    if connection.vendor == "postgresql":
        return f"{table}_pkey" in plan
    return "INTEGER PRIMARY KEY" in plan


BATCH = 32  # as the worker ends them; with one id SQLite looks it up whatever else the WHERE says


@pytest.fixture
def running(make_channel, make_conversation):
    """BATCH running turns of w1, one per conversation, beside finished ones."""
    channel = make_channel()
    conversations = [make_conversation(channel, f"c{i}") for i in range(BATCH)]
    Turn.objects.bulk_create([Turn(conversation=conversations[0], merged_input="x", flush_reason="window", state=state)
                              for state in (TurnState.DONE, TurnState.CANCELLED) for _ in range(20)])
    return Turn.objects.bulk_create([
        Turn(conversation=conversation, merged_input="hola", flush_reason="window", state=TurnState.RUNNING,
             owner="w1", started_at=timezone.now()) for conversation in conversations])


def test_the_turns_a_batch_just_ended_are_read_back_by_id(running):
    ends = [(turn.pk, TurnState.DONE, "¡hola!", "") for turn in running]
    with CaptureQueriesContext(connection) as captured:
        assert turns.finish_many(ends, "w1") == {turn.pk for turn in running}
    for plan in plans_of_reads(captured, "conversations_turn"):
        assert by_primary_key(plan, "conversations_turn"), plan
        assert "turn_queue_idx" not in plan


def test_turns_ended_by_another_owner_are_not_counted_as_finished_by_this_one(running):
    assert turns.finish_many([(turn.pk, TurnState.DONE, "¡hola!", "") for turn in running], "w2") == set()
    assert set(Turn.objects.filter(pk__in=[turn.pk for turn in running]).values_list("state", flat=True)) == {
        TurnState.RUNNING}


def test_the_cancelled_turns_among_a_batch_are_read_by_id(running):
    Turn.objects.filter(pk=running[0].pk).update(state=TurnState.CANCELLED, outcome="stopped by the user")
    with CaptureQueriesContext(connection) as captured:
        assert TurnRunner.cancelled_among([turn.pk for turn in running]) == [(running[0].pk, "stopped by the user")]
    # The first read looks among the running turns (a few, whatever the table's size); the
    # last one reads the batch's states.
    *_, states = plans_of_reads(captured, "conversations_turn")
    assert by_primary_key(states, "conversations_turn") and "turn_queue_idx" not in states, states


def test_an_operators_retry_reads_the_named_rows_by_id(running):
    conversation = running[0].conversation
    rows = OutboundMessage.objects.bulk_create([
        OutboundMessage(conversation=conversation, channel=conversation.channel, chat_id="c0",
                        kind=OutboundKind.REPLY, text=f"r{i}", state=state)
        for i, state in enumerate([OutboundState.ABANDONED] * BATCH + [OutboundState.DELIVERED] * BATCH)])
    named = [row.pk for row in rows[:BATCH - 1]] + [rows[-1].pk]  # the last one delivered: not retriable
    with CaptureQueriesContext(connection) as captured:
        assert ledger.retry_now(named) == BATCH - 1
    for plan in plans_of_reads(captured, "delivery_outboundmessage"):
        assert by_primary_key(plan, "delivery_outboundmessage"), plan
    assert OutboundMessage.objects.get(pk=rows[0].pk).state == OutboundState.FAILED
    assert OutboundMessage.objects.get(pk=rows[-1].pk).state == OutboundState.DELIVERED
