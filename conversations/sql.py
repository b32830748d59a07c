"""conversations' hand-written SQL, in one place: the statements on the hot path of an
inbound message (its admission) where the ORM's compile cost more than the database
did, and the batch statements only SQL can say (a JSON recordset joined, a lock in the
batch's order). Each says beside it why it is hand-written.

One style: tables through `table(Model)` (quoted as the backend quotes), columns by
their bare names (lower-case, needing no quotes on either database), every value a
parameter. The generic statements (one row inserted, a compare-and-swap on one row's
state) are `agentloop.rows.insert` and `update_in_state`. The service modules
(`conversations.ingest`, `edits`) keep the rules; here are only the statements.
"""

import functools

from django.db import connection

from agentloop.rows import in_params, in_sql, records, recordset, table, update_in_state
from conversations.models import BufferState, Contact, Conversation, InboundMessage, MessageBuffer, Turn, TurnState

# --- admission: the conversation and its state ----------------------------------------

# Columns read from the conversation row, in this order, then the state columns.
CONVERSATION_COLUMNS = ("id", "contact_id", "chat_id", "sender_id", "is_group", "context_reset_at")


@functools.lru_cache(maxsize=2)  # one conversation by its key; a batch's by their ids
def _conversation_with_state_sql(where="c.channel_id = %s AND c.chat_id = %s AND c.sender_id = %s"):
    """One statement for the hot path of every inbound message: the conversation, its
    open buffer, whether a turn runs (and its channel's id, for a batch's). Written as
    SQL because the ORM spent longer compiling the equivalent annotated query (1.3 ms)
    than the rest of the request."""
    return (
        f"SELECT {', '.join('c.' + c for c in CONVERSATION_COLUMNS)}, "
        f"b.id, b.first_message_at, b.message_count, "
        f"(SELECT t.id FROM {table(Turn)} t WHERE t.conversation_id = c.id AND t.state = %s LIMIT 1), "
        f"c.channel_id "
        f"FROM {table(Conversation)} c LEFT JOIN {table(MessageBuffer)} b ON b.conversation_id = c.id "
        f"AND b.state = %s "
        f"WHERE {where}"
    )


def conversation_with_state(channel_id, chat_id, sender_id):
    """The row of one conversation by its key (CONVERSATION_COLUMNS, then its open
    buffer's id, first message time and count, its running turn's id, its channel's id),
    or None."""
    with connection.cursor() as cursor:
        cursor.execute(_conversation_with_state_sql(),
                       [TurnState.RUNNING, BufferState.OPEN, channel_id, chat_id, sender_id])
        return cursor.fetchone()


def lock_and_read_conversations(keys) -> list:
    """PostgreSQL, a batch's admission: the conversations of these (channel id, chat,
    sender) keys, locked in the keys' order (FOR NO KEY UPDATE, as one admission locks
    its own: see ingest's `_conversation_with_state`) by one statement with the keys as
    one JSON parameter, then read with their state by one more (rows as
    `conversation_with_state`'s). Locked first, read after: a read that waited for the
    lock would otherwise see the buffers as they were before the holder committed."""
    source = recordset("k", [("channel_id", "bigint"), ("chat_id", "text"), ("sender_id", "text"), ("n", "int")])
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id FROM {table(Conversation)} c JOIN {source} ON c.channel_id = k.channel_id "
            f"AND c.chat_id = k.chat_id AND c.sender_id = k.sender_id ORDER BY k.n FOR NO KEY UPDATE OF c",
            [records(("channel_id", "chat_id", "sender_id", "n"), [(*key, n) for n, key in enumerate(keys)])])
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return []
        cursor.execute(_conversation_with_state_sql(in_sql("c.id", len(ids))),
                       [TurnState.RUNNING, BufferState.OPEN, *in_params(ids)])
        return cursor.fetchall()


def contact_ids(keys) -> list:
    """PostgreSQL: (id, channel id, platform id) of the contacts with these (channel id,
    platform id) keys, the keys as one JSON parameter (a batch's senders seen before)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, c.channel_id, c.platform_id FROM {table(Contact)} c "
            f"JOIN {recordset('k', [('channel_id', 'bigint'), ('platform_id', 'text')])} "
            f"ON c.channel_id = k.channel_id AND c.platform_id = k.platform_id",
            [records(("channel_id", "platform_id"), keys)])
        return cursor.fetchall()


# --- admission: the buffer --------------------------------------------------------------


def set_buffer(message_id, buffer_id) -> None:
    """The message joins the buffer (plain SQL: the ORM's update cost more than the statement)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table(InboundMessage)} SET buffer_id = %s WHERE id = %s", [buffer_id, message_id])


def update_open_buffer(buffer_id, fields) -> bool:
    """The buffer's `fields` set only while it is open (a compare-and-swap against the
    flusher's claim; plain SQL, see `agentloop.rows.update_in_state`)."""
    return update_in_state(MessageBuffer, buffer_id, fields, BufferState.OPEN)
