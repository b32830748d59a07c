"""The admission's statements (conversations.ingest, conversations.edits): the
conversation and its state read (and locked) by key, one or a batch; the contacts; the
buffer a message joins."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from django.db import connection
from django.db.models import Model

from agentloop.core.rows import (
    in_params,
    in_sql,
    postgresql,
    records,
    recordset,
    state_literal,
    table,
    update_in_state,
)
from conversations.models import (
    BufferState,
    Contact,
    Conversation,
    InboundMessage,
    MessageBuffer,
    Turn,
    TurnState,
)

if TYPE_CHECKING:
    from django.db.models import Field

# A row as the database driver returns it (positional columns, documented beside each
# statement).
Row = tuple[Any, ...]
# A conversation's key: (channel id, chat id, sender id).
ConversationKey = tuple[int, str, str]

# --- admission: the conversation and its state ----------------------------------------

# Columns read from the conversation row, in this order, then the state columns.
CONVERSATION_COLUMNS = ("id", "contact_id", "chat_id", "sender_id", "is_group", "context_reset_at", "language",
                        "state")


@functools.lru_cache(maxsize=2)  # one conversation by its key; a batch's by their ids
def _conversation_with_state_sql(where: str = "c.channel_id = %s AND c.chat_id = %s AND c.sender_id = %s") -> str:
    """One statement for the hot path of every inbound message: the conversation, its
    open buffer, whether a turn runs (and its channel's id, for a batch's). Written as
    SQL because the ORM spent longer compiling the equivalent annotated query (1.3 ms)
    than the rest of the request. The states in the text, as the partial indexes of the
    one open buffer and the one running turn of a conversation are written: with them as
    parameters, a conversation's buffers and turns were read by its id and filtered, all
    of them for a conversation thousands of messages long (rows.state_literal)."""
    running, open_ = state_literal(TurnState.RUNNING), state_literal(BufferState.OPEN)
    return (
        f"SELECT {', '.join('c.' + c for c in CONVERSATION_COLUMNS)}, "
        f"b.id, b.first_message_at, b.message_count, b.last_album_id, "
        f"(SELECT t.id FROM {table(Turn)} t WHERE t.conversation_id = c.id AND t.state = {running} LIMIT 1), "
        f"c.channel_id "
        f"FROM {table(Conversation)} c LEFT JOIN {table(MessageBuffer)} b ON b.conversation_id = c.id "
        f"AND b.state = {open_} "
        f"WHERE {where}"
    )


def conversation_with_state(channel_id: int, chat_id: str, sender_id: str) -> Row | None:
    """The row of one conversation by its key (CONVERSATION_COLUMNS, then its open
    buffer's id, first message time, count and latest album, its running turn's id, its
    channel's id), or None."""
    with connection.cursor() as cursor:
        cursor.execute(_conversation_with_state_sql(),
                       [channel_id, chat_id, sender_id])
        row: Row | None = cursor.fetchone()
        return row


def _key_matches(*columns: str) -> str:
    """`c`'s channel and `columns` equal to the key row `k`'s (SQLite: a plain join from
    the keys, each probing the table's unique index)."""
    return " AND ".join(f"c.{column} = k.{column}" for column in ("channel_id", *columns))


def _one_by_key(model: type[Model], *columns: str, select: str = "c.id") -> str:
    """The row of `model` (as `c`) whose channel and `columns` are k's, for a LATERAL join
    from a batch's keys: one probe of the table's unique index per key. A plain join
    with json_to_recordset, which the planner guesses at 100 rows, scanned the whole
    table and hashed it (2 ms at 13,000 conversations, growing with the table)."""
    return f"SELECT {select} FROM {table(model)} c WHERE {_key_matches(*columns)}"


def lock_and_read_conversations(keys: Iterable[ConversationKey]) -> list[Row]:
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
                           [keyed])
            return list(cursor.fetchall())
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
                       in_params(ids))
        return list(cursor.fetchall())


def contact_ids(keys: Iterable[tuple[int, str]]) -> list[Row]:
    """(id, channel id, platform id) of the contacts with these (channel id, platform id)
    keys, the keys as one JSON parameter (a batch's senders seen before)."""
    select = "c.id, c.channel_id, c.platform_id"
    if postgresql():
        join = f"CROSS JOIN LATERAL ({_one_by_key(Contact, 'platform_id', select=select)}) c"
    else:
        join = f"JOIN {table(Contact)} c ON {_key_matches('platform_id')}"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {select} FROM {recordset('k', [('channel_id', 'bigint'), ('platform_id', 'text')])} "
                       f"{join}", [records(("channel_id", "platform_id"), keys)])
        return list(cursor.fetchall())


# --- admission: the buffer --------------------------------------------------------------


def set_buffer(message_id: int, buffer_id: int) -> None:
    """The message joins the buffer (plain SQL: the ORM's update cost more than the statement)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table(InboundMessage)} SET buffer_id = %s WHERE id = %s", [buffer_id, message_id])


def update_open_buffer(buffer_id: int, fields: dict[str, Any]) -> bool:
    """The buffer's `fields` set only while it is open (a compare-and-swap against the
    flusher's claim; plain SQL, see `agentloop.core.rows.update_in_state`)."""
    return update_in_state(MessageBuffer, buffer_id, fields, BufferState.OPEN)


def update_open_buffers(fields: dict[int, dict[str, Any]]) -> set[int]:
    """`update_open_buffer` for a batch: each buffer's own fields (the same names for
    all), in one statement, their values as one JSON parameter in id order. The ids of
    the buffers that were still open."""
    if not fields:
        return set()
    names = list(next(iter(fields.values())))
    columns = [cast("Field[Any, Any]", MessageBuffer._meta.get_field(name)) for name in names]
    db_names = [cast(str, field.column) for field in columns]  # a concrete field's column is never None
    quoted = [connection.ops.quote_name(name) for name in db_names]
    source = recordset("v", [("buffer_id", "bigint"), *((name, field.db_type(connection))
                                                 for name, field in zip(quoted, columns))])
    rows = [(pk, *(field.get_db_prep_save(values[name], connection) for name, field in zip(names, columns)))
            for pk, values in sorted(fields.items())]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table(MessageBuffer)} AS b SET "
                       + ", ".join(f"{name} = v.{name}" for name in quoted)
                       # RETURNING's own column, unqualified: SQLite knows no alias there.
                       + f" FROM {source} WHERE b.id = v.buffer_id AND b.state = %s RETURNING id",
                       [records(["buffer_id", *db_names], rows), BufferState.OPEN.value])
        return {row[0] for row in cursor.fetchall()}
