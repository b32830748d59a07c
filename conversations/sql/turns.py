"""A turn's statements: its history (conversations.engine.conversation_history), a
batch of turns finished and the ready turns (conversations.turns), and the windows the
typing loops show (conversations.worker.typing)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import cast

from django.db import connection

from agentloop.core.rows import (
    columns,
    placeholders,
    postgresql,
    rare,
    records,
    recordset,
    state_literal,
    table,
)
from conversations.models import (
    BufferState,
    Channel,
    ContextNote,
    Conversation,
    ConversationState,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)
from conversations.sql.admission import Row

# A turn's end: (turn id, its final state — TurnState.DONE or FAILED —, the reply, the
# outcome), as conversations.turns.finish_many takes it.
Finished = tuple[int, str, str, str]

# --- a turn's history (conversations.engine.conversation_history) ----------------------

HISTORY_TURN_FIELDS = frozenset({"id", "created_at", "merged_input", "reply_text", "has_media", "buffer_id"})
HISTORY_NOTE_FIELDS = frozenset({"id", "created_at", "text"})


def history(conversation_id: int, before_turn_id: int, since: datetime | None,
            limit: int) -> tuple[list[Turn], list[ContextNote]]:
    """(turns, notes) of the agent's context: the conversation's finished turns before
    `before_turn_id` and its notes, since `since` (None: all), newest first, at most
    `limit` of each, as instances with HISTORY_*_FIELDS. In SQL written once: it runs
    before every model request, and the ORM's compiling was most of its cost."""
    after = [] if since is None else [Turn._meta.get_field("created_at").get_db_prep_value(since, connection)]
    with connection.cursor() as cursor:
        cursor.execute(_history_turns_sql(since is not None),
                       [conversation_id, TurnState.DONE.value, before_turn_id, *after, limit])
        turn_rows = cursor.fetchall()
        cursor.execute(_history_notes_sql(since is not None), [conversation_id, *after, limit])
        note_rows = cursor.fetchall()
    turn_columns = columns(Turn, "t", HISTORY_TURN_FIELDS)
    note_columns = columns(ContextNote, "n", HISTORY_NOTE_FIELDS)
    # Columns.build makes the model its columns were read from.
    return ([cast(Turn, turn_columns.build(row)) for row in turn_rows],
            [cast(ContextNote, note_columns.build(row)) for row in note_rows])


@functools.cache
def _history_turns_sql(since: bool) -> str:
    return (f"SELECT {columns(Turn, 't', HISTORY_TURN_FIELDS).sql} FROM {table(Turn)} t "
            f"WHERE t.conversation_id = %s AND t.state = %s AND t.id < %s "
            + ("AND t.created_at >= %s " if since else "") + "ORDER BY t.id DESC LIMIT %s")


@functools.cache
def _history_notes_sql(since: bool) -> str:
    return (f"SELECT {columns(ContextNote, 'n', HISTORY_NOTE_FIELDS).sql} FROM {table(ContextNote)} n "
            f"WHERE n.conversation_id = %s "
            + ("AND n.created_at >= %s " if since else "") + "ORDER BY n.created_at DESC LIMIT %s")


# --- turns: finishing a batch, the ready turns (conversations.turns) -------------------

# Rows per statement (7 parameters each: SQLite takes 32,766 at most).
FINISH_CHUNK = 500


def finish_turns(results: Sequence[Finished], owner: str, now: datetime) -> None:
    """The compare-and-swap of `Turn.transition` (RUNNING -> each row's state, this
    owner's only) for (id, state, reply, outcome) rows, FINISH_CHUNK at a time, in plain
    SQL: with hundreds of turns finishing together the ORM spent longer building three
    CASE expressions of hundreds of WHENs than the database spent running them (the
    worker's database thread, 500 simultaneous turns: 40% of its time). On PostgreSQL
    the rows come as one JSON parameter (UPDATE … FROM json_to_recordset): one statement
    text for any batch (agentloop/core/rows.py in_sql and recordset say why)."""
    Turn.check_transition([TurnState.RUNNING], {r[1] for r in results})  # the SQL below
    for at in range(0, len(results), FINISH_CHUNK):
        _finish_chunk(results[at:at + FINISH_CHUNK], owner, now)


def _finish_chunk(results: Sequence[Finished], owner: str, now: datetime) -> None:
    finished_at = Turn._meta.get_field("finished_at").get_db_prep_value(now, connection)
    if postgresql():
        with connection.cursor() as cursor:
            ends = records(("id", "state", "reply", "outcome"), results)
            cursor.execute(_finish_sql_postgresql(), [finished_at, ends, TurnState.RUNNING, owner])
        return
    whens = " ".join(["WHEN %s THEN %s"] * len(results))
    sql = (f"UPDATE {table(Turn)} SET "
           f"state = CASE id {whens} END, "
           f"reply_text = CASE id {whens} END, "
           f"outcome = CASE id {whens} END, "
           f"finished_at = %s "
           f"WHERE id IN ({placeholders(len(results))}) "
           f"AND state = %s AND owner = %s")
    params = [value for column in (1, 2, 3) for r in results for value in (r[0], r[column])]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, finished_at, *(r[0] for r in results), TurnState.RUNNING, owner])


@functools.cache
def _finish_sql_postgresql() -> str:
    ends = recordset("v", [("id", "bigint"), ("state", "text"), ("reply", "text"), ("outcome", "text")])
    return (f"UPDATE {table(Turn)} AS t SET state = v.state, reply_text = v.reply, outcome = v.outcome, "
            f"finished_at = %s FROM {ends} WHERE t.id = v.id AND t.state = %s AND t.owner = %s")


def ready_turns(limit: int, pull_agent: str) -> list[Row]:
    """(turn id, conversation id) of the oldest ready turns, none where a turn of the
    conversation runs nor of a channel whose agent pulls its turns (`pull_agent`), at
    most `limit`. In SQL written once: every worker asks this many times a second
    (AGENTLOOP_POLL_INTERVAL), and compiling the query was most of its cost."""
    with connection.cursor() as cursor:
        # A conversation a person holds (conversations.handoff): its ready turns wait.
        cursor.execute(_ready_sql(), [pull_agent, limit])
        return list(cursor.fetchall())


@functools.cache
def _ready_sql() -> str:
    # The states in the text (rows.state_literal says why): planned once for any state,
    # PostgreSQL walked every turn in creation order (turn_created_idx) looking for
    # ready ones, 35 ms at 80,000 turns, where the ready ones are a probe of turn_queue_idx.
    ready, running, agent = (state_literal(state) for state in (
        TurnState.READY, TurnState.RUNNING, ConversationState.AGENT))
    return (f"SELECT t.id, t.conversation_id FROM {table(Turn)} t "
            f"JOIN {table(Conversation)} c ON c.id = t.conversation_id "
            f"JOIN {table(Channel)} ch ON ch.id = c.channel_id "
            f"WHERE t.state = {ready} AND ch.agent <> %s AND c.state = {agent} AND NOT EXISTS ("
            f"SELECT 1 FROM {table(Turn)} r WHERE r.conversation_id = t.conversation_id "
            f"AND r.state = {running}) ORDER BY t.created_at, t.id LIMIT %s")


# --- typing: the windows being typed (conversations.worker.typing) ---------------------


def open_windows(channel_ids: Sequence[int], part: int, parts: int, limit: int) -> list[Row]:
    """(conversation id, buffer id, chat id, thread id, reply target, channel id, flush
    at, addressed: in a group 1 if a message of the burst is addressed to the agent, else 0;
    NULL outside groups) of the open buffers of these channels' conversations whose id falls in `part` of
    `parts`, oldest buffer first, at most `limit`: the thread and reply target are the
    buffer's last message's. Driven from the open buffers (the partial index of open
    buffers; SQLite's CROSS JOIN keeps that order), so it costs in proportion to the
    buffers open now, never to a channel's conversations."""
    params = [*channel_ids, *((parts, part) if parts > 1 else ()), limit]
    with connection.cursor() as cursor:
        cursor.execute(_open_windows_sql(len(channel_ids), parts > 1), params)
        return list(cursor.fetchall())


@functools.lru_cache(maxsize=64)  # one entry per (number of channels, partitioned)
def _open_windows_sql(channels: int, partitioned: bool) -> str:
    # The state as a literal, and rare (rows.rare): with statistics on the file SQLite
    # walked every buffer in id order for the sake of the ORDER BY.
    # The last message's two fields as subqueries of the output rows, each an index probe
    # of the buffer's messages: PostgreSQL planned the join written before (ON m.id =
    # (SELECT MAX(...))) as a hash join over the whole message table, 7-16 ms a look at a
    # few thousand messages and growing with every message ever stored.
    last = f"FROM {table(InboundMessage)} l WHERE l.buffer_id = b.id ORDER BY l.id DESC LIMIT 1"
    # In a group, whether the burst is addressed to the agent so far (a message
    # mentioning it, or one whose platform does not say): probed only for groups' rows.
    addressed = (f"CASE WHEN c.is_group THEN (SELECT MAX(CASE WHEN m.mentioned IS NULL OR m.mentioned THEN 1 "
                 f"ELSE 0 END) FROM {table(InboundMessage)} m WHERE m.buffer_id = b.id) END")
    return (
        f"SELECT b.conversation_id, b.id, c.chat_id, (SELECT l.thread_id {last}), "
        f"(SELECT l.reply_target {last}), c.channel_id, b.flush_at, {addressed} "
        f"FROM {table(MessageBuffer)} b CROSS JOIN {table(Conversation)} c "
        f"WHERE {rare(f'b.state = {state_literal(BufferState.OPEN)}')} AND c.id = b.conversation_id "
        f"AND c.channel_id IN ({placeholders(channels)}) "
        + ("AND MOD(b.conversation_id, %s) = %s " if partitioned else "")
        + "ORDER BY b.id LIMIT %s"
    )
