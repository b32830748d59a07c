"""The worker's write transactions are bounded (conversations.worker.dbthread.write_batch):
on SQLite, whose one write lock the web process waits for to admit a message, a flush
or a batch of finished turns takes at most SQLITE_WRITE_BATCH items per transaction,
and the rest follow in the next ones; nothing is left behind or taken twice. A worker
that fell behind (a whole batch of flushes due at once, finished turns waiting longer
than BEHIND_SECONDS) takes SQLITE_CATCH_UP_BATCH until it has caught up."""

import asyncio
from datetime import UTC, datetime

import pytest
from django.db import connection

from conversations.ingest import Inbound, admit
from conversations.models import MessageBuffer, Turn
from conversations.worker import dbthread
from conversations.worker.flusher import Flusher

T0 = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db(transaction=True)


def test_the_batch_is_smaller_on_sqlite_than_on_postgresql():
    expected = dbthread.SQLITE_WRITE_BATCH if connection.vendor == "sqlite" else 200
    assert dbthread.write_batch() == expected and dbthread.SQLITE_WRITE_BATCH < 200
    catching_up = dbthread.SQLITE_CATCH_UP_BATCH if connection.vendor == "sqlite" else 200
    assert dbthread.write_batch(behind=True) == catching_up
    assert dbthread.SQLITE_WRITE_BATCH < dbthread.SQLITE_CATCH_UP_BATCH < 200


def test_a_flusher_step_flushes_at_most_one_batch_and_the_next_steps_the_rest(make_channel):
    channel = make_channel("bounded", window_closed=0.5, window_neutral=0.5, window_open=0.5, window_greeting=0.5)
    due = dbthread.write_batch() + 5
    for n in range(due):
        admit(channel, Inbound(platform_message_id=str(n), chat_id=str(n), sender_id=str(n), text="hola y"), now=T0)
    flusher = Flusher("bounded-owner", on_flush=lambda: None, poll_interval=0.05)
    steps = []
    while MessageBuffer.objects.filter(state="open").exists():
        before = Turn.objects.count()
        flusher.step()
        steps.append(Turn.objects.count() - before)
        assert len(steps) <= 3 * due, steps  # (each step must make progress)
    assert steps[0] == dbthread.write_batch() and sum(steps) == due == Turn.objects.count()
    assert max(steps) <= dbthread.write_batch()


def test_a_flusher_that_found_a_whole_batch_due_takes_a_bigger_one_next_until_it_has_caught_up(make_channel):
    channel = make_channel("catching-up", window_closed=0.5, window_neutral=0.5, window_open=0.5,
                           window_greeting=0.5)
    small, big = dbthread.write_batch(), dbthread.write_batch(behind=True)
    due = small + big + 3
    for n in range(due):
        admit(channel, Inbound(platform_message_id=str(n), chat_id=str(n), sender_id=str(n), text="hola y"), now=T0)
    flusher = Flusher("catching-up-owner", on_flush=lambda: None, poll_interval=0.05)
    steps = []
    for _ in range(4):
        before = Turn.objects.count()
        flusher.step()
        steps.append(Turn.objects.count() - before)
    # A whole batch found due: more were waiting. The last step found fewer than it
    # could take: caught up, the next look takes the small batch again.
    assert steps == [small, big, 3, 0] and Turn.objects.count() == due
    assert not flusher.behind and not MessageBuffer.objects.filter(state="open").exists()


def test_the_batcher_splits_what_piled_up_into_bounded_batches_in_order():
    database = dbthread.DatabaseThread("batch-test")
    sizes = []

    def record(items):
        sizes.append(len(items))
        return [item * 10 for item in items]

    async def pile_up():
        batcher = dbthread.Batcher(database, record)
        return await asyncio.gather(*(batcher(n) for n in range(3 * dbthread.write_batch() + 1)))

    try:
        results = asyncio.run(pile_up())
    finally:
        database.close()
    assert results == [n * 10 for n in range(3 * dbthread.write_batch() + 1)]
    assert max(sizes) <= dbthread.write_batch() and sum(sizes) == len(results) and len(sizes) >= 4



def test_the_batcher_takes_bigger_batches_once_what_waits_is_late():
    database = dbthread.DatabaseThread("batch-late-test")
    sizes, now = [], [0.0]
    small, big = dbthread.write_batch(), dbthread.write_batch(behind=True)

    def record(items):
        sizes.append(len(items))
        now[0] += 2 * dbthread.BEHIND_SECONDS  # this batch was slow: the rest waited
        return [item * 10 for item in items]

    async def pile_up(count):
        batcher = dbthread.Batcher(database, record, clock=lambda: now[0])
        return await asyncio.gather(*(batcher(n) for n in range(count)))

    count = small + big + 1
    try:
        results = asyncio.run(pile_up(count))
    finally:
        database.close()
    assert results == [n * 10 for n in range(count)]
    # The first batch was asked for at once; everything after it had waited too long.
    assert sizes == [small, big, 1]
