"""Replies written down: the pending rows, their chunks, and the ledger's bounds."""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from agentloop.core.rows import create_many
from delivery import attachments, chunks
from delivery.hooks import transport_for
from delivery.models import OutboundMessage

RECOVERY_PREFIX = "♻️ Recovered reply — this may repeat a message you already received.\n\n"
PREFIX_UNITS = chunks.units(RECOVERY_PREFIX)
MAX_RESENDS = 3
BACKOFF = (timedelta(seconds=30), timedelta(minutes=2))  # resends 1 and 2; resend 3 waits for a start
FRESHNESS = timedelta(hours=24)
NOT_SENT_MAX_WAIT = 60.0
PACED_RETRY = 0.25  # seconds the safety sweep waits when what is due has no send slot yet
LATE_RESLOTS = 2  # fresh slots a late paced send may take before it goes anyway  # seconds: a send that never left is tried again at most this late
PRUNE_AFTER = timedelta(days=7)


def enabled() -> bool:
    return settings.AGENTLOOP_DELIVERY_LEDGER


def attempt_timeout() -> timedelta:
    """An `attempting` row held longer than any send can take is orphaned, whoever holds it."""
    return timedelta(seconds=settings.AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT)


@dataclass(frozen=True)
class Reply:
    conversation: object
    text: str
    kind: str
    turn: object = None
    reply_target: str = ""
    thread_id: str = ""
    files: tuple = ()  # delivery.attachments.OutboundFile, stored: sent after the text
    preview_message_id: str = ""  # a streamed reply's preview message: its first chunk edits it
    dedup_key: str | None = None  # a scheduled message's tick: unique in the ledger


def _row(reply: Reply) -> OutboundMessage:
    conversation = reply.conversation
    return OutboundMessage(conversation=conversation, channel=conversation.channel,
                           chat_id=conversation.chat_id, turn=reply.turn, kind=reply.kind, text=reply.text,
                           chunks=chunks_for(conversation.channel, reply.text, reply.files),
                           reply_target=reply.reply_target, thread_id=reply.thread_id,
                           preview_message_id=reply.preview_message_id, dedup_key=reply.dedup_key)


def chunks_for(channel, text, files=()) -> list:
    """A row's chunks: the text's (split_for), then one per file or album. [] when the
    text alone fits in one message."""
    if not files:
        return split_for(channel, text)
    transport = transport_for(channel)
    pieces = (split_for(channel, text) or [text]) if text.strip() else []
    return pieces + attachments.file_chunks(list(files), transport.max_album,
                                            transport.caption_units - PREFIX_UNITS)


def split_for(channel, text) -> list:
    """The chunks a reply is sent in on this channel's platform, [] when it fits in one.
    Each leaves room for the recovery prefix, which any chunk may have to carry."""
    limit = transport_for(channel).max_units
    if limit is None or chunks.units(text) <= limit - PREFIX_UNITS:
        return []
    return chunks.split(text, limit - PREFIX_UNITS)


def parts(row) -> list:
    return row.chunks or split_for(row.channel, row.text) or [row.text]


def enqueue(conversation, text, *, kind, turn=None, reply_target="", thread_id="", files=()):
    """Write one reply down; call inside the transaction of the work that produced it."""
    return enqueue_many([Reply(conversation, text, kind, turn, reply_target, thread_id, tuple(files))])[0]


def enqueue_many(replies):
    """Write replies down as pending rows (one INSERT)."""
    return create_many(OutboundMessage, [_row(r) for r in replies])


def unrecorded(replies):
    """The ledger switched off: rows kept in memory only (a crash loses them)."""
    return [_row(r) for r in replies]
