"""Replies written down: the pending rows, their chunks, and the ledger's bounds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.utils import formats, timezone
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _

from agentloop.core import languages
from agentloop.core.rows import create_many, insert_statement
from delivery import attachments, chunks
from delivery.attachments import Chunk, OutboundFile
from delivery.models import OutboundMessage, RestorePoint
from delivery.transports import transport_for

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# conversations' Conversation, Turn and Channel come in from the layer above, which delivery
# may not import, not even for its annotations: Any where one is a parameter (a row's own
# foreign keys to them are typed, by django-stubs).

# The sign first in every language, so people and tools can spot a recovered reply.
RECOVERY_SIGN = "♻️"
RECOVERY_MARKER = _("♻️ Recovered reply — this may repeat a message you already received.")
RECOVERY_PREFIX = "♻️ Recovered reply — this may repeat a message you already received.\n\n"  # English's


# A recovered reply the conversation has moved past (a newer reply delivered since) says
# when it was written (delivery/ledger/recoveries.py).
DATED_RECOVERY_MARKER = _("♻️ Recovered reply from %(time)s — this may repeat a message you already received.")
# The longest time a dated marker shows (another day's date and time), to leave room for.
_LONGEST_TIME = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)


def recovery_prefix(language: str, written_at: datetime | None = None, time_zone: str = "") -> str:
    """The marker a recovered reply starts with, in the language its row was written in;
    with `written_at`, the dated one: that time in `time_zone` (the channel's; empty: the
    deployment's), as the language writes a time (another day's: its date and time)."""
    if written_at is None:
        return languages.text_in(language, RECOVERY_MARKER) + "\n\n"
    return languages.text_in(language, lambda: DATED_RECOVERY_MARKER % {
        "time": local_time(written_at, time_zone)}) + "\n\n"


def local_time(moment: datetime, time_zone: str = "") -> str:
    """`moment` in `time_zone`: the time alone (24-hour, read alike in every language) on
    the same local day as now, else the active language's short date before it."""
    try:
        zone = ZoneInfo(time_zone or settings.AGENTLOOP_DEFAULT_TIME_ZONE)
    except (ValueError, ZoneInfoNotFoundError):
        zone = ZoneInfo(settings.AGENTLOOP_DEFAULT_TIME_ZONE)
    local = moment.astimezone(zone)
    if local.date() == timezone.now().astimezone(zone).date():
        return local.strftime("%H:%M")
    return f"{formats.date_format(local, 'SHORT_DATE_FORMAT')} {local:%H:%M}"


@cache
def prefix_units() -> int:
    """Room left in every chunk for the longest marker of any language, dated or not."""
    return max(chunks.units(prefix) for code, _name in settings.LANGUAGES
               for prefix in (recovery_prefix(code), recovery_prefix(code, _LONGEST_TIME, "UTC")))
MAX_RESENDS = 3
BACKOFF = (timedelta(seconds=30), timedelta(minutes=2))  # resends 1 and 2; resend 3 waits for a start
FRESHNESS = timedelta(hours=24)
NOT_SENT_MAX_WAIT = 60.0
PACED_RETRY = 0.25  # seconds the safety sweep waits when what is due has no send slot yet
LATE_RESLOTS = 2  # fresh slots a late paced send may take before it goes anyway  # seconds: a send that never left is tried again at most this late
PRUNE_AFTER = timedelta(days=7)


def enabled() -> bool:
    return bool(settings.AGENTLOOP_DELIVERY_LEDGER)


def attempt_timeout() -> timedelta:
    """An `attempting` row held longer than any send can take is orphaned, whoever holds it."""
    return timedelta(seconds=settings.AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT)


@dataclass(frozen=True)
class Reply:
    conversation: Any  # conversations' Conversation
    text: StrOrPromise  # a text of our own is lazy (gettext_lazy): written in the conversation's language
    kind: str  # an OutboundKind
    turn: Any = None  # conversations' Turn, if a turn wrote it
    reply_target: str = ""
    thread_id: str = ""
    files: tuple[OutboundFile, ...] = ()  # stored: sent after the text
    preview_message_id: str = ""  # a streamed reply's preview message: its first chunk edits it
    dedup_key: str | None = None  # a scheduled message's tick: unique in the ledger
    template: dict[str, Any] | None = None  # sent as this approved template (delivery.templates), not as free text
    # The span its sends are the children of (agentloop.core.tracing): the run of its
    # turn; None: its turn's flush, if it has a turn (a notice of a recovery).
    traceparent: str | None = None


def _row(reply: Reply) -> OutboundMessage:
    """A text of our own (gettext_lazy) is written in the conversation's language, and the
    row keeps that language for its marker."""
    conversation = reply.conversation
    language = languages.for_conversation(conversation)
    text = languages.text_in(language, reply.text) if isinstance(reply.text, Promise) else reply.text
    return OutboundMessage(conversation=conversation, channel=conversation.channel, language=language,
                           chat_id=conversation.chat_id, turn=reply.turn, kind=reply.kind, text=text,
                           chunks=[] if reply.template else chunks_for(conversation.channel, text, reply.files),
                           template=reply.template or {},
                           reply_target=reply.reply_target, thread_id=reply.thread_id,
                           preview_message_id=reply.preview_message_id, dedup_key=reply.dedup_key,
                           # Only as loaded: a turn read without it is not read again for it.
                           traceparent=reply.traceparent or (reply.turn.__dict__.get("traceparent") if reply.turn else None),
                           chunks_started=1 if began_before_a_restore(reply.turn) else 0)


# Rows made and their INSERT statement (rows.insert_statement), made before the transaction.
Prepared = tuple[list[OutboundMessage], tuple[str, list[str]]]

_restore_point: list[RestorePoint | None] = []  # read once per process


def began_before_a_restore(turn: Any) -> bool:
    """Whether `turn` (or the buffer it was made from) was in flight in the backup this
    database was restored from (delivery.models.RestorePoint): its reply may have gone out
    after the copy was taken, so it is written as "its send may have started" and sent
    labelled. Read once per process: a restore happens with every process stopped."""
    if turn is None:
        return False
    if not _restore_point:
        _restore_point.append(RestorePoint.objects.first())
    point = _restore_point[0]
    if point is None:
        return False
    buffer_id = getattr(turn, "buffer_id", None)
    return bool((turn.pk and turn.pk <= point.last_turn_id) or (buffer_id and buffer_id <= point.last_buffer_id))


def forget_restore_point() -> None:
    """Read the restore point again at the next reply (tests)."""
    _restore_point.clear()


def chunks_for(channel: Any, text: str, files: Sequence[OutboundFile] = ()) -> Sequence[Chunk]:
    """A row's chunks: the text's (split_for), then one per file or album. [] when the
    text alone fits in one message."""
    if not files:
        return split_for(channel, text)
    transport = transport_for(channel)
    pieces: list[Chunk] = [*(split_for(channel, text) or [text])] if text.strip() else []
    return pieces + attachments.file_chunks(list(files), transport.max_album,
                                            transport.caption_units - prefix_units())


def split_for(channel: Any, text: str) -> list[str]:
    """The chunks a reply is sent in on this channel's platform, [] when it fits in one.
    Each leaves room for the recovery prefix, which any chunk may have to carry."""
    limit = transport_for(channel).max_units
    if limit is None or chunks.units(text) <= limit - prefix_units():
        return []
    return chunks.split(text, limit - prefix_units())


def parts(row: OutboundMessage) -> Sequence[Chunk]:
    if row.template:
        return [row.text]  # one template message, whatever the text's length
    return row.chunks or split_for(row.channel, row.text) or [row.text]


def enqueue(conversation: Any, text: StrOrPromise, *, kind: str, turn: Any = None, reply_target: str = "",
            thread_id: str = "", files: Iterable[OutboundFile] = ()) -> OutboundMessage:
    """Write one reply down; call inside the transaction of the work that produced it."""
    return enqueue_many([Reply(conversation, text, kind, turn, reply_target, thread_id, tuple(files))])[0]


def enqueue_many(replies: Iterable[Reply], prepared: Prepared | None = None) -> list[OutboundMessage]:
    """Write replies down as pending rows (one INSERT). `prepared`: `prepare_many(replies)`,
    made before the transaction."""
    if prepared is not None:
        return create_many(OutboundMessage, *prepared)
    return create_many(OutboundMessage, [_row(r) for r in replies])


def prepare_many(replies: Iterable[Reply]) -> Prepared:
    """The rows of `replies` and their INSERT, made without the database (rows.insert_statement),
    for `enqueue_many` to run later: a completion makes them before its transaction."""
    rows = [_row(r) for r in replies]
    return rows, insert_statement(OutboundMessage, rows)


def unrecorded(replies: Iterable[Reply]) -> list[OutboundMessage]:
    """The ledger switched off: rows kept in memory only (a crash loses them)."""
    return [_row(r) for r in replies]
