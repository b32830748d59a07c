"""conversations' hand-written SQL, in one place: the statements on the timed paths
where the ORM's compile cost more than the database did (an inbound message's
admission, the flusher's look and claim, a batch of turns finished, the ready turns,
a turn's history, the typing windows), and the batch statements only SQL can say (a
JSON recordset joined, a lock in the batch's order). Each says beside it why it is
hand-written.

One style: tables through `table(Model)` (quoted as the backend quotes), columns by
their bare names (lower-case, needing no quotes on either database), every value a
parameter; a SELECT list of a whole model from `agentloop.core.rows.columns`. The generic
statements (one row inserted, a compare-and-swap on one row's state) are
`agentloop.core.rows.insert` and `update_in_state`. The service modules (`ingest`, `edits`,
`engine`, `turns`, `worker.typing`) keep the rules; here are only the statements.
(`liveness` keeps its own: they read PostgreSQL's catalogs, not our tables.)
"""

import functools

from django.db import connection

from agentloop.core.rows import (
    aware,
    columns,
    in_params,
    in_sql,
    placeholders,
    postgresql,
    records,
    recordset,
    table,
    update_in_state,
)
from conversations.models import (
    BufferState,
    Channel,
    Contact,
    ContextNote,
    Conversation,
    ConversationState,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)

# --- admission: the conversation and its state ----------------------------------------

# Columns read from the conversation row, in this order, then the state columns.
CONVERSATION_COLUMNS = ("id", "contact_id", "chat_id", "sender_id", "is_group", "context_reset_at", "language",
                        "state")


@functools.lru_cache(maxsize=2)  # one conversation by its key; a batch's by their ids
def _conversation_with_state_sql(where="c.channel_id = %s AND c.chat_id = %s AND c.sender_id = %s"):
    """One statement for the hot path of every inbound message: the conversation, its
    open buffer, whether a turn runs (and its channel's id, for a batch's). Written as
    SQL because the ORM spent longer compiling the equivalent annotated query (1.3 ms)
    than the rest of the request."""
    return (
        f"SELECT {', '.join('c.' + c for c in CONVERSATION_COLUMNS)}, "
        f"b.id, b.first_message_at, b.message_count, b.last_album_id, "
        f"(SELECT t.id FROM {table(Turn)} t WHERE t.conversation_id = c.id AND t.state = %s LIMIT 1), "
        f"c.channel_id "
        f"FROM {table(Conversation)} c LEFT JOIN {table(MessageBuffer)} b ON b.conversation_id = c.id "
        f"AND b.state = %s "
        f"WHERE {where}"
    )


def conversation_with_state(channel_id, chat_id, sender_id):
    """The row of one conversation by its key (CONVERSATION_COLUMNS, then its open
    buffer's id, first message time, count and latest album, its running turn's id, its
    channel's id), or None."""
    with connection.cursor() as cursor:
        cursor.execute(_conversation_with_state_sql(),
                       [TurnState.RUNNING, BufferState.OPEN, channel_id, chat_id, sender_id])
        return cursor.fetchone()


def _key_matches(*columns):
    """`c`'s channel and `columns` equal to the key row `k`'s (SQLite: a plain join from
    the keys, each probing the table's unique index)."""
    return " AND ".join(f"c.{column} = k.{column}" for column in ("channel_id", *columns))


def _one_by_key(model, *columns, select="c.id"):
    """The row of `model` (as `c`) whose channel and `columns` are k's, for a LATERAL join
    from a batch's keys: one probe of the table's unique index per key. A plain join
    with json_to_recordset, which the planner guesses at 100 rows, scanned the whole
    table and hashed it (2 ms at 13,000 conversations, growing with the table)."""
    return f"SELECT {select} FROM {table(model)} c WHERE {_key_matches(*columns)}"


def lock_and_read_conversations(keys) -> list:
    """A batch's admission: the conversations of these (channel id, chat, sender) keys,
    read with their state (rows as `conversation_with_state`'s), the keys as one JSON
    parameter.

    PostgreSQL: locked in the keys' order (FOR NO KEY UPDATE, as one admission locks
    its own: see ingest's `_conversation_with_state`) by one statement, then read by one
    more. Locked first, read after: a read that waited for the lock would otherwise see
    the buffers as they were before the holder committed. SQLite: read by one statement,
    as the transaction holds the database's one write lock from its BEGIN."""
    source = recordset("k", [("channel_id", "bigint"), ("chat_id", "text"), ("sender_id", "text"), ("n", "int")])
    keyed = records(("channel_id", "chat_id", "sender_id", "n"), [(*key, n) for n, key in enumerate(keys)])
    if not postgresql():
        with connection.cursor() as cursor:
            cursor.execute(_conversation_with_state_sql(f"c.id IN (SELECT c.id FROM {source} JOIN {table(Conversation)} c "
                                                        f"ON {_key_matches('chat_id', 'sender_id')})"),
                           [TurnState.RUNNING, BufferState.OPEN, keyed])
            return cursor.fetchall()
    with connection.cursor() as cursor:
        # The LATERAL probe locks each row as the keys are read, in their array order (n).
        cursor.execute(
            f"SELECT c.id FROM {source} CROSS JOIN LATERAL ({_one_by_key(Conversation, 'chat_id', 'sender_id')} "
            f"FOR NO KEY UPDATE) c ORDER BY k.n",
            [keyed])
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        cursor.execute(_conversation_with_state_sql(in_sql("c.id", len(ids))),
                       [TurnState.RUNNING, BufferState.OPEN, *in_params(ids)])
        return cursor.fetchall()


def contact_ids(keys) -> list:
    """(id, channel id, platform id) of the contacts with these (channel id, platform id)
    keys, the keys as one JSON parameter (a batch's senders seen before)."""
    if not postgresql():
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT c.id, c.channel_id, c.platform_id FROM "
                f"{recordset('k', [('channel_id', 'bigint'), ('platform_id', 'text')])} "
                f"JOIN {table(Contact)} c ON {_key_matches('platform_id')}",
                [records(("channel_id", "platform_id"), keys)])
            return cursor.fetchall()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, c.channel_id, c.platform_id FROM "
            f"{recordset('k', [('channel_id', 'bigint'), ('platform_id', 'text')])} "
            f"CROSS JOIN LATERAL ({_one_by_key(Contact, 'platform_id', select='c.id, c.channel_id, c.platform_id')}) c",
            [records(("channel_id", "platform_id"), keys)])
        return cursor.fetchall()


# --- admission: the buffer --------------------------------------------------------------


def set_buffer(message_id, buffer_id) -> None:
    """The message joins the buffer (plain SQL: the ORM's update cost more than the statement)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table(InboundMessage)} SET buffer_id = %s WHERE id = %s", [buffer_id, message_id])


def update_open_buffer(buffer_id, fields) -> bool:
    """The buffer's `fields` set only while it is open (a compare-and-swap against the
    flusher's claim; plain SQL, see `agentloop.core.rows.update_in_state`)."""
    return update_in_state(MessageBuffer, buffer_id, fields, BufferState.OPEN)


# --- flushing: the flusher's look and claim (conversations.engine) ---------------------


def deadline_param(now):
    """`now` as the buffers' deadlines are stored (the database's datetime form)."""
    return MessageBuffer._meta.get_field("flush_at").get_db_prep_value(now, connection)


# The flusher asks these on every wake-up (tens a second while buffers are open):
# plain SQL, built once, where the ORM compiled each query anew every time (most of a
# wake-up's cost). The state as a literal, as the partial indexes are written.
@functools.cache
def _due_sql():
    return (f"SELECT b.id FROM {table(MessageBuffer)} b WHERE b.state = '{BufferState.OPEN.value}' "
            f"AND b.flush_at <= %s "
            f"AND NOT EXISTS (SELECT 1 FROM {table(Turn)} t WHERE t.conversation_id = b.conversation_id "
            f"AND t.state IN (%s, %s)) ORDER BY b.flush_at LIMIT %s")


@functools.cache
def _next_deadline_sql():
    return (f"SELECT MIN(flush_at) FROM {table(MessageBuffer)} WHERE state = '{BufferState.OPEN.value}' "
            f"AND flush_at > %s")


@functools.cache
def _look_sql():
    """`due_buffer_ids` and `next_deadline` in one statement: one wait for the database
    per wake-up instead of two (the idle floor every worker costs, 20 looks a second)."""
    return (f"SELECT d.id, NULL FROM ({_due_sql()}) d UNION ALL "
            f"SELECT NULL, ({_next_deadline_sql()})")


def due_buffer_ids(now, limit) -> list:
    """Open buffers due at `now` whose conversation has no turn ready or running, oldest
    deadline first."""
    with connection.cursor() as cursor:
        cursor.execute(_due_sql(), [deadline_param(now), *Turn.ACTIVE, limit])
        return [row[0] for row in cursor.fetchall()]


def next_deadline(now):
    """The nearest open buffer's deadline after `now` (aware), or None."""
    with connection.cursor() as cursor:
        cursor.execute(_next_deadline_sql(), [deadline_param(now)])
        return aware(cursor.fetchone()[0])


def look(now, limit):
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


def claim_buffers(ids, now, token) -> list:
    """The compare-and-swap OPEN → FLUSHED of `ids` still due at `now`, stamped with
    `token`; then the buffers this call won, each with its conversation, channel, the
    carried-over turn's input (and whether it had files) and whether the conversation has a turn ready or running
    (`conversation_busy`), deadline order."""
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
        found = cursor.fetchall()
    shape = _claimed_shape()
    buffers = []
    for row in found:
        buffer, conversation, channel, carried = (part.build(row[a:b]) for part, a, b in shape)
        conversation.channel = channel
        buffer.conversation = conversation
        buffer.carried_turn = carried if buffer.carried_turn_id else None
        buffer.conversation_busy = bool(row[-1])  # a turn ready or running there (engine._born_running)
        buffers.append(buffer)
    return buffers


@functools.cache
def _claimed_shape():
    """(columns, first, past-the-last) of each model in a _claimed_sql row."""
    parts = [columns(MessageBuffer, "b"), columns(Conversation, "c"), columns(Channel, "ch"),
             columns(Turn, "ct", frozenset({"id", "merged_input", "has_media"}))]
    shape, at = [], 0
    for part in parts:
        shape.append((part, at, at + part.width))
        at += part.width
    return shape


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _claim_sql(n):
    return (f"UPDATE {table(MessageBuffer)} SET state = %s, flushed_at = %s, flushed_by = %s, "
            f"flush_reason = planned_reason "
            f"WHERE {in_sql('id', n)} AND state = %s AND flush_at <= %s")


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _claimed_sql(n):
    return (f"SELECT {_claimed_select()}, {_busy_sql()} FROM {table(MessageBuffer)} b {_claimed_joins()} "
            f"WHERE {in_sql('b.id', n)} AND b.flushed_by = %s "
            f"ORDER BY b.flush_at, b.id")


@functools.cache
def _claim_and_read_sql_postgresql():
    """_claim_sql and _claimed_sql in one statement (the UPDATE's RETURNING as `b`)."""
    return (f"WITH b AS ({_claim_sql(0)} RETURNING *) SELECT {_claimed_select()}, {_busy_sql()} FROM b "
            f"{_claimed_joins()} ORDER BY b.flush_at, b.id")


def _busy_sql():
    """Whether the claimed buffer's conversation has a turn ready or running, per row."""
    return (f"EXISTS (SELECT 1 FROM {table(Turn)} t WHERE t.conversation_id = b.conversation_id "
            f"AND t.state IN (%s, %s))")


def _claimed_select():
    return ", ".join(part.sql for part, *_ in _claimed_shape())


def _claimed_joins():
    return (f"JOIN {table(Conversation)} c ON c.id = b.conversation_id "
            f"JOIN {table(Channel)} ch ON ch.id = c.channel_id "
            f"LEFT JOIN {table(Turn)} ct ON ct.id = b.carried_turn_id")


MERGED_FIELDS = frozenset({"id", "buffer_id", "text", "media_type", "album_id", "sender_name", "reply_target",
                           "thread_id", "received_at", "media_file_id", "mentioned", "traceparent"})


def messages_of(buffer_ids) -> dict:
    """{buffer id: its messages, oldest first}, with the fields a merge reads (MERGED_FIELDS)."""
    ids = list(buffer_ids)
    with connection.cursor() as cursor:
        cursor.execute(_messages_sql(len(ids)), in_params(ids))
        found = cursor.fetchall()
    shape = columns(InboundMessage, "m", MERGED_FIELDS)
    by_buffer = {}
    for row in found:
        message = shape.build(row)
        by_buffer.setdefault(message.buffer_id, []).append(message)
    return by_buffer


@functools.lru_cache(maxsize=BATCH_SHAPES)
def _messages_sql(n):
    return (f"SELECT {columns(InboundMessage, 'm', MERGED_FIELDS).sql} FROM {table(InboundMessage)} m "
            f"WHERE {in_sql('m.buffer_id', n)} ORDER BY m.received_at, m.id")


# --- a turn's history (conversations.engine.conversation_history) ----------------------

HISTORY_TURN_FIELDS = frozenset({"id", "created_at", "merged_input", "reply_text", "has_media", "buffer_id"})
HISTORY_NOTE_FIELDS = frozenset({"id", "created_at", "text"})


def history(conversation_id, before_turn_id, since, limit):
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
    return [turn_columns.build(row) for row in turn_rows], [note_columns.build(row) for row in note_rows]


@functools.cache
def _history_turns_sql(since):
    return (f"SELECT {columns(Turn, 't', HISTORY_TURN_FIELDS).sql} FROM {table(Turn)} t "
            f"WHERE t.conversation_id = %s AND t.state = %s AND t.id < %s "
            + ("AND t.created_at >= %s " if since else "") + "ORDER BY t.id DESC LIMIT %s")


@functools.cache
def _history_notes_sql(since):
    return (f"SELECT {columns(ContextNote, 'n', HISTORY_NOTE_FIELDS).sql} FROM {table(ContextNote)} n "
            f"WHERE n.conversation_id = %s "
            + ("AND n.created_at >= %s " if since else "") + "ORDER BY n.created_at DESC LIMIT %s")


# --- turns: finishing a batch, the ready turns (conversations.turns) -------------------

# Rows per statement (7 parameters each: SQLite takes 32,766 at most).
FINISH_CHUNK = 500


def finish_turns(results, owner, now) -> None:
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


def _finish_chunk(results, owner, now):
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
def _finish_sql_postgresql():
    ends = recordset("v", [("id", "bigint"), ("state", "text"), ("reply", "text"), ("outcome", "text")])
    return (f"UPDATE {table(Turn)} AS t SET state = v.state, reply_text = v.reply, outcome = v.outcome, "
            f"finished_at = %s FROM {ends} WHERE t.id = v.id AND t.state = %s AND t.owner = %s")


def ready_turns(limit, pull_agent) -> list:
    """(turn id, conversation id) of the oldest ready turns, none where a turn of the
    conversation runs nor of a channel whose agent pulls its turns (`pull_agent`), at
    most `limit`. In SQL written once: every worker asks this many times a second
    (AGENTLOOP_POLL_INTERVAL), and compiling the query was most of its cost."""
    with connection.cursor() as cursor:
        # A conversation a person holds (conversations.handoff): its ready turns wait.
        cursor.execute(_ready_sql(), [TurnState.READY.value, pull_agent, ConversationState.AGENT.value,
                                      TurnState.RUNNING.value, limit])
        return cursor.fetchall()


@functools.cache
def _ready_sql():
    return (f"SELECT t.id, t.conversation_id FROM {table(Turn)} t "
            f"JOIN {table(Conversation)} c ON c.id = t.conversation_id "
            f"JOIN {table(Channel)} ch ON ch.id = c.channel_id "
            f"WHERE t.state = %s AND ch.agent <> %s AND c.state = %s AND NOT EXISTS ("
            f"SELECT 1 FROM {table(Turn)} r WHERE r.conversation_id = t.conversation_id "
            f"AND r.state = %s) ORDER BY t.created_at, t.id LIMIT %s")


# --- typing: the windows being typed (conversations.worker.typing) ---------------------


def open_windows(channel_ids, part, parts, limit) -> list:
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
        return cursor.fetchall()


@functools.lru_cache(maxsize=64)  # one entry per (number of channels, partitioned)
def _open_windows_sql(channels, partitioned):
    # The state as a literal: SQLite uses the partial index (WHERE state = 'open') only
    # for a query whose own WHERE says so in the same words.
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
        f"WHERE b.state = '{BufferState.OPEN.value}' AND c.id = b.conversation_id "
        f"AND c.channel_id IN ({placeholders(channels)}) "
        + ("AND MOD(b.conversation_id, %s) = %s " if partitioned else "")
        + "ORDER BY b.id LIMIT %s"
    )
