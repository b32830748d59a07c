"""The flusher's statements (conversations.flushing): its look (the due buffers and the
next deadline in one statement) and its claim (a batch of buffers taken, their turns
made, their messages read)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from django.db import connection

from agentloop.core.rows import (
    Columns,
    aware,
    columns,
    in_params,
    in_sql,
    postgresql,
    state_literal,
    table,
)
from conversations.models import (
    BufferState,
    Channel,
    Conversation,
    InboundMessage,
    MessageBuffer,
    Turn,
)
from conversations.sql.admission import Row

# A model's columns in a claimed row: (its Columns, first index, past-the-last index).
ShapePart = tuple[Columns, int, int]

# --- flushing: the flusher's look and claim (conversations.flushing) -------------------


def deadline_param(now: datetime) -> Any:
    """`now` as the buffers' deadlines are stored (the database's datetime form)."""
    return MessageBuffer._meta.get_field("flush_at").get_db_prep_value(now, connection)


# The flusher asks these on every wake-up (tens a second while buffers are open):
# plain SQL, built once, where the ORM compiled each query anew every time (most of a
# wake-up's cost). The state as a literal (rows.state_literal), as the partial indexes are written.
@functools.cache
def _due_sql() -> str:
    return (f"SELECT b.id FROM {table(MessageBuffer)} b WHERE b.state = {state_literal(BufferState.OPEN)} "
            f"AND b.flush_at <= %s "
            f"AND NOT EXISTS (SELECT 1 FROM {table(Turn)} t WHERE t.conversation_id = b.conversation_id "
            f"AND t.state IN (%s, %s)) ORDER BY b.flush_at LIMIT %s")


@functools.cache
def _next_deadline_sql() -> str:
    return (f"SELECT MIN(flush_at) FROM {table(MessageBuffer)} WHERE state = {state_literal(BufferState.OPEN)} "
            f"AND flush_at > %s")


@functools.cache
def _look_sql() -> str:
    """`due_buffer_ids` and `next_deadline` in one statement: one wait for the database
    per wake-up instead of two (the idle floor every worker costs, 20 looks a second)."""
    return (f"SELECT d.id, NULL FROM ({_due_sql()}) d UNION ALL "
            f"SELECT NULL, ({_next_deadline_sql()})")


def due_buffer_ids(now: datetime, limit: int) -> list[int]:
    """Open buffers due at `now` whose conversation has no turn ready or running, oldest
    deadline first."""
    with connection.cursor() as cursor:
        cursor.execute(_due_sql(), [deadline_param(now), *Turn.ACTIVE, limit])
        return [row[0] for row in cursor.fetchall()]


def next_deadline(now: datetime) -> datetime | None:
    """The nearest open buffer's deadline after `now` (aware), or None."""
    with connection.cursor() as cursor:
        cursor.execute(_next_deadline_sql(), [deadline_param(now)])
        return aware(cursor.fetchone()[0])


def look(now: datetime, limit: int) -> tuple[list[int], datetime | None]:
    """(due_buffer_ids, next_deadline) in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(_look_sql(), [deadline_param(now), *Turn.ACTIVE, limit, deadline_param(now)])
        found = cursor.fetchall()
    due = [buffer_id for buffer_id, _ in found if buffer_id is not None]
    deadline = next((value for buffer_id, value in found if buffer_id is None), None)
    return due, aware(deadline)


# The claim's statements, in SQL written once per batch size (agentloop/core/rows.py says
# why): the flusher runs them on every deadline, timed to the millisecond. Bounded: a
# caller may pass any number of ids, the flusher at most its batch (200).
BATCH_SHAPES = 256


def claim_rows(ids: Sequence[int], now: datetime, token: str) -> list[Row]:
    """The compare-and-swap OPEN → FLUSHED of `ids` still due at `now`, stamped with
    `token`; then the rows of the buffers this call won (`build_buffers` makes them
    objects), deadline order: each buffer with its conversation, channel, the
    carried-over turn's input (and whether it had files) and whether the conversation
    has a turn ready or running."""
    MessageBuffer.check_transition([BufferState.OPEN], [BufferState.FLUSHED])
    at = deadline_param(now)
    claim = [BufferState.FLUSHED.value, at, token, *in_params(ids), BufferState.OPEN.value, at]
    with connection.cursor() as cursor:
        if postgresql():
            # One round trip for the claim and what it won: the flusher's timed step was
            # six waits for the server, each one more chance to queue behind other work.
            cursor.execute(_claim_and_read_sql_postgresql(), [*claim, *Turn.ACTIVE])
        else:
            cursor.execute(_claim_sql(len(ids)), claim)
            if not cursor.rowcount:
                return []
            cursor.execute(_claimed_sql(len(ids)), [*Turn.ACTIVE, *in_params(ids), token])
        return list(cursor.fetchall())


def open_rows(ids: Sequence[int], now: datetime) -> list[Row]:
    """The rows `claim_rows` would win for `ids` at `now`, read without claiming: the
    buffers still open and due, in the same columns and order (the flush's preparation,
    flushing._prepare)."""
    with connection.cursor() as cursor:
        cursor.execute(_open_sql(len(ids)), [*Turn.ACTIVE, *in_params(ids), deadline_param(now)])
        return list(cursor.fetchall())


def same_but_claimed(open_found: Sequence[Row], claimed: Sequence[Row]) -> bool:
    """Whether the rows `claim_rows` won are the rows `open_rows` read before, column
    for column but the four the claim itself writes (state, flushed_at, flushed_by,
    flush_reason)."""
    unclaimed = _unclaimed_columns()
    return len(open_found) == len(claimed) and all(
        unclaimed(before) == unclaimed(after) for before, after in zip(open_found, claimed))


@functools.cache
def _unclaimed_columns() -> Callable[[Row], Any]:
    written = {"state", "flushed_at", "flushed_by", "flush_reason"}
    buffers, first, past = _claimed_shape()[0]
    width = _claimed_shape()[-1][2] + 1  # + conversation_busy
    return operator.itemgetter(*[i for i in range(width)
                                 if not first <= i < past or buffers.names[i - first] not in written])


def build_buffers(found: Iterable[Row]) -> list[MessageBuffer]:
    """Buffers from `claim_rows`' (or `open_rows`') rows, each with its conversation,
    channel (one object per channel of the batch), carried-over turn and
    `conversation_busy` (a turn ready or running there: flushing._born_running)."""
    (buffers_part, b0, b1), (conversations_part, c0, c1), (channels_part, h0, h1), (carried_part, t0, t1) = (
        _claimed_shape())
    channels: dict[Row, Channel] = {}
    buffers = []
    for row in found:
        # Columns.build makes the model its columns were read from.
        buffer = cast(MessageBuffer, buffers_part.build(row[b0:b1]))
        conversation = cast(Conversation, conversations_part.build(row[c0:c1]))
        channel_row = row[h0:h1]
        channel = channels.get(channel_row)
        if channel is None:
            channel = channels[channel_row] = cast(Channel, channels_part.build(channel_row))
        conversation.channel = channel
        buffer.conversation = conversation
        buffer.carried_turn = cast(Turn, carried_part.build(row[t0:t1])) if buffer.carried_turn_id else None
        buffer.conversation_busy = bool(row[-1])
        buffers.append(buffer)
    return buffers


@functools.cache
def _claimed_shape() -> list[ShapePart]:
    """(columns, first, past-the-last) of each model in a _claimed_sql row."""
    parts = [columns(MessageBuffer, "b"), columns(Conversation, "c"), columns(Channel, "ch"),
             columns(Turn, "ct", frozenset({"id", "merged_input", "has_media"}))]
    shape: list[ShapePart] = []
    at = 0
    for part in parts:
        shape.append((part, at, at + part.width))
        at += part.width
    return shape


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _claim_sql(n: int) -> str:
    return (f"UPDATE {table(MessageBuffer)} SET state = %s, flushed_at = %s, flushed_by = %s, "
            f"flush_reason = planned_reason "
            f"WHERE {in_sql('id', n)} AND state = %s AND flush_at <= %s")


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _claimed_sql(n: int) -> str:
    return (f"SELECT {_claimed_select()}, {_busy_sql()} FROM {table(MessageBuffer)} b {_claimed_joins()} "
            f"WHERE {in_sql('b.id', n)} AND b.flushed_by = %s "
            f"ORDER BY b.flush_at, b.id")


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _open_sql(n: int) -> str:
    return (f"SELECT {_claimed_select()}, {_busy_sql()} FROM {table(MessageBuffer)} b {_claimed_joins()} "
            f"WHERE {in_sql('b.id', n)} AND b.state = {state_literal(BufferState.OPEN)} AND b.flush_at <= %s "
            f"ORDER BY b.flush_at, b.id")


@functools.cache
def _claim_and_read_sql_postgresql() -> str:
    """_claim_sql and _claimed_sql in one statement (the UPDATE's RETURNING as `b`)."""
    return (f"WITH b AS ({_claim_sql(0)} RETURNING *) SELECT {_claimed_select()}, {_busy_sql()} FROM b "
            f"{_claimed_joins()} ORDER BY b.flush_at, b.id")


def _busy_sql() -> str:
    """Whether the claimed buffer's conversation has a turn ready or running, per row."""
    return (f"EXISTS (SELECT 1 FROM {table(Turn)} t WHERE t.conversation_id = b.conversation_id "
            f"AND t.state IN (%s, %s))")


def _claimed_select() -> str:
    return ", ".join(part.sql for part, *_ in _claimed_shape())


def _claimed_joins() -> str:
    return (f"JOIN {table(Conversation)} c ON c.id = b.conversation_id "
            f"JOIN {table(Channel)} ch ON ch.id = c.channel_id "
            f"LEFT JOIN {table(Turn)} ct ON ct.id = b.carried_turn_id")


MERGED_FIELDS = frozenset({"id", "buffer_id", "text", "media_type", "album_id", "sender_name", "reply_target",
                           "thread_id", "received_at", "media_file_id", "mentioned", "traceparent"})


def message_rows(buffer_ids: Iterable[int]) -> list[Row]:
    """The messages of these buffers, oldest first, as rows of the fields a merge reads
    (MERGED_FIELDS): `build_messages` makes them objects."""
    ids = list(buffer_ids)
    with connection.cursor() as cursor:
        cursor.execute(_messages_sql(len(ids)), in_params(ids))
        return list(cursor.fetchall())


def build_messages(found: Iterable[Row]) -> dict[int | None, list[InboundMessage]]:
    """{buffer id: its messages, oldest first} from `message_rows`' rows."""
    shape = columns(InboundMessage, "m", MERGED_FIELDS)
    by_buffer: dict[int | None, list[InboundMessage]] = {}  # (buffer_id is a nullable column)
    for row in found:
        message = cast(InboundMessage, shape.build(row))  # Columns.build makes its model
        by_buffer.setdefault(message.buffer_id, []).append(message)
    return by_buffer


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _messages_sql(n: int) -> str:
    return (f"SELECT {columns(InboundMessage, 'm', MERGED_FIELDS).sql} FROM {table(InboundMessage)} m "
            f"WHERE {in_sql('m.buffer_id', n)} ORDER BY m.received_at, m.id")
