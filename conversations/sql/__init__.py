"""conversations' hand-written SQL, in one place: the statements on the timed paths
where the ORM's compile cost more than the database did (an inbound message's
admission, the flusher's look and claim, a batch of turns finished, the ready turns,
a turn's history, the typing windows), and the batch statements only SQL can say (a
JSON recordset joined, a lock in the batch's order). Each says beside it why it is
hand-written.

In three modules, by the path they serve: `admission`, `flushing`, `turns` (a turn's
history, a batch finished, the ready turns, the typing windows). This package is their
public API: the names in `__all__` below, which callers take from here (`from
conversations import sql`, then `sql.look(...)`), not from the submodules (tests may
reach inside them); a statement
added to a submodule for callers outside it is listed here too.

One style: tables through `table(Model)` (quoted as the backend quotes), columns by
their bare names (lower-case, needing no quotes on either database), every value a
parameter; a SELECT list of a whole model from `agentloop.core.rows.columns`. The generic
statements (one row inserted, a compare-and-swap on one row's state) are
`agentloop.core.rows.insert` and `update_in_state`. The service modules (`ingest`, `edits`,
`flushing`, `engine`, `turns`, `worker.typing`) keep the rules; here are only the statements.
(`liveness` keeps its own: they read PostgreSQL's catalogs, not our tables.)
"""

from conversations.sql.admission import (
    CONVERSATION_COLUMNS,
    ConversationKey,
    Row,
    contact_ids,
    conversation_with_state,
    lock_and_read_conversations,
    set_buffer,
    update_open_buffer,
    update_open_buffers,
)
from conversations.sql.flushing import (
    BATCH_SHAPES,
    MERGED_FIELDS,
    build_buffers,
    build_messages,
    claim_rows,
    deadline_param,
    due_buffer_ids,
    look,
    message_rows,
    next_deadline,
    open_rows,
    same_but_claimed,
)
from conversations.sql.turns import (
    FINISH_CHUNK,
    HISTORY_NOTE_FIELDS,
    HISTORY_TURN_FIELDS,
    Finished,
    finish_turns,
    history,
    open_windows,
    ready_turns,
)

__all__ = [
    "BATCH_SHAPES", "CONVERSATION_COLUMNS", "FINISH_CHUNK", "HISTORY_NOTE_FIELDS", "HISTORY_TURN_FIELDS",
    "ConversationKey", "Finished", "Row",
    "MERGED_FIELDS", "build_buffers", "build_messages", "claim_rows", "contact_ids",
    "conversation_with_state", "deadline_param", "due_buffer_ids", "finish_turns", "history",
    "lock_and_read_conversations", "look", "message_rows", "next_deadline", "open_rows",
    "open_windows", "ready_turns", "same_but_claimed", "set_buffer", "update_open_buffer", "update_open_buffers",
]
