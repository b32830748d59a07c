"""Admitting one inbound message: durable dedup, then the buffer (or a control command,
or the channel's double-texting strategy when a turn is running).

Everything for one message happens in one transaction, with the conversation row
locked, so concurrent messages of a conversation are applied one after the other
(PostgreSQL: SELECT … FOR UPDATE; SQLite: BEGIN IMMEDIATE serialises writers).

The package, by what it does: `values` (Inbound, Arrival, Admission), `refusal`,
`admission` (one by one), `batch` (admit_many, PostgreSQL's batch statements),
`double_texting`; its hand-written statements are in `conversations.sql`, the generic
ones (`insert`, `update_in_state`) in `agentloop.core.rows`.
"""

from conversations.ingest.admission import OVERFLOW_NOTICE, RETRYABLE, admit, latest, open_conversation
from conversations.ingest.batch import BatchFailed, admit_many
from conversations.ingest.double_texting import REJECT_NOTICE
from conversations.ingest.refusal import printable, record_refusal, refusal
from conversations.ingest.values import MAX_TEXT_CHARS, Admission, Arrival, Inbound, MediaRef, Unstorable

__all__ = [
    "MAX_TEXT_CHARS", "OVERFLOW_NOTICE", "REJECT_NOTICE", "RETRYABLE", "Admission", "Arrival", "BatchFailed", "Inbound",
    "MediaRef", "Unstorable", "admit", "admit_many", "latest", "open_conversation", "printable", "record_refusal", "refusal",
]
