"""Sending: a claimed row's chunks, in order, each start and delivery written down."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import sync_to_async

from agentloop.core import tracing
from audit.failpoints import failpoint
from delivery import attachments, faults, pacing, templates
from delivery.ledger.recoveries import label_of
from delivery.ledger.replies import LATE_RESLOTS, parts
from delivery.models import OutboundMessage, OutboundState, Outcome
from delivery.transports import SendResult, Target, transport_for

if TYPE_CHECKING:
    from delivery.attachments import Chunk
    from delivery.pacing import Pace
    from delivery.transports import Transport

T = TypeVar("T")
# An async runner of a database function: `await db(fn, *args)` is fn(*args)'s result
# (`sync_to_async` by default; the worker's database thread).
DbRunner = Callable[..., Awaitable[Any]]

log = logging.getLogger("delivery.ledger")  # the name it had as one module
SEND = "agentloop.send"


def text_to_send(row: OutboundMessage) -> str:
    """The chunk this attempt resumes at, labelled if its send may have happened before."""
    piece = parts(row)[row.chunks_delivered]
    text = attachments.describe(piece) if attachments.is_files(piece) else piece
    return label_of(row) + text if row.needs_marker else text


async def send_piece(transport: Transport, target: Target, piece: Chunk, label: str) -> SendResult:
    """One chunk: a text, or a file chunk whose marker rides in the first file's caption."""
    if not attachments.is_files(piece):
        return await transport.send_text(target, label + piece)
    files = attachments.files_of(piece)
    result = await transport.send_files(target, files, (label + files[0].caption).rstrip())
    failpoint("ledger.after_upload")
    return result


async def send(row: OutboundMessage, db: DbRunner | None = None) -> SendResult:
    """Send a claimed row (`_send`) under a span of its own (agentloop.core.tracing): the
    child of the turn that wrote it, however late the attempt and whichever worker makes
    it; ids, counts and the outcome only."""
    if not tracing.on():
        return await _send(row, db)
    span = tracing.span(SEND, row.traceparent, kind="client", attributes={
        "agentloop.ledger.row": row.pk, "agentloop.conversation.id": row.conversation_id,
        "agentloop.reply.kind": row.kind, "agentloop.send.attempt": row.attempts,
        "agentloop.send.resumed_at_chunk": row.chunks_delivered or None})
    try:
        result = await _send(row, db)
    except Exception as exc:
        span.fail(exc)
        span.end()
        raise
    span.set({"agentloop.send.outcome": result.outcome, "agentloop.send.labelled": bool(row.needs_marker),
              "agentloop.send.chunks": len(parts(row))})
    if not result.ok:
        span.fail(f"{result.outcome}: {result.error}")
    span.end()
    return result


async def _send(row: OutboundMessage, db: DbRunner | None = None) -> SendResult:
    """Send a claimed row's chunks in order, from the first not known delivered. Around
    each chunk but the attempt's first (started by the claim) and the last (recorded by
    `finish_many`), its start and its delivery are written down (through `db`, an async
    runner of a database function, `sync_to_async` by default), so a crash between
    chunks knows which were delivered and whether the next had started.

    A paced row (`row.pace`, set by the claim) waits for its reserved slot first; its
    later chunks wait a chat interval after the chunk before, and a bot slot each."""
    failpoint("ledger.after_claim")
    db = db or _in_a_thread
    pieces, first = parts(row), row.chunks_delivered
    row.resumed_at = first  # the chunk the label, if any, rides on (`_defer`)
    pace, sent_at = getattr(row, "pace", None), None
    result = SendResult.delivered(row.platform_message_id)
    for index in range(first, len(pieces)):
        if pace is not None and not await _slot_reached(db, row, pace, sent_at):
            result = SendResult.failed(Outcome.NOT_SENT, f"chunk {index + 1} not sent: no send slot could be reserved")
            break
        if index > first and not await _note(db, row, chunks_started=index + 1):
            result = SendResult.failed(Outcome.NOT_SENT, f"chunk {index + 1} not started: its start not recorded")
            break
        target = Target(row.chat_id, row.reply_target if index == 0 else "", row.thread_id,
                        conversation_id=row.conversation_id,
                        buttons=getattr(row, "buttons", ()) if index == len(pieces) - 1 else (),
                        key=f"{row.pk}.{int(row.created_at.timestamp())}.{index}")
        label = label_of(row) if index == first and row.needs_marker else ""
        sent_at = time.monotonic()
        if index == 0 and row.preview_message_id:
            result = await send_over_preview(db, row, target, pieces[index])
        elif row.template:
            result = await transport_for(row.channel).send_template(target, templates.labelled(row.template, label))
        else:
            result = await send_piece(transport_for(row.channel), target, pieces[index], label)
        failpoint("ledger.after_chunk_send")
        if not result.ok or index == len(pieces) - 1:
            break
        if not await _note(db, row, chunks_delivered=index + 1):
            result = SendResult.failed(Outcome.AMBIGUOUS, f"chunk {index + 1} sent; its delivery not recorded")
            break
        failpoint("ledger.after_chunk")
    failpoint("ledger.after_send")
    if not result.ok:
        faults.failed(row.channel, result)
    else:
        faults.recovered(row.channel)
    return result


# An edit that left nothing changed: the row waits as any send would, the preview stays
# (edited next time). Any other failure may have landed, or not: the preview goes.
UNCHANGED = (Outcome.NOT_SENT, Outcome.FLOOD, Outcome.CHANNEL_BLOCKED)
STALE_PREVIEW = "⤵️"  # a preview that could not be deleted points at the final below it


async def send_over_preview(db: DbRunner, row: OutboundMessage, target: Target, piece: Chunk) -> SendResult:
    """A streamed reply's first chunk, over the preview message its stream left in the
    chat (a Telegram group's; docs/streaming.md). The first try edits the preview into
    the final: one message, finished. An edit refused or unanswered (it may have landed,
    or not) or a resend after a crash mid-edit: the preview is deleted — or, if it cannot
    be, marked stale — and that is recorded (`preview_message_id` cleared) before the
    final goes fresh, so a crash after the fresh send resends it labelled like any
    reply. The fresh send is labelled only when the stale preview could be neither
    deleted nor marked and the edit may have landed: then the chat may show it twice."""
    transport = transport_for(row.channel)
    maybe_landed = row.needs_marker
    if not attachments.is_files(piece) and not row.needs_marker:  # a text
        result = await transport.edit_text(target, row.preview_message_id, piece)
        if result.ok or result.outcome in UNCHANGED:
            return result
        maybe_landed = result.outcome != Outcome.PERMANENT
    gone = await transport.delete_message(target, row.preview_message_id)
    if not gone.ok:
        gone = await transport.edit_text(target, row.preview_message_id, STALE_PREVIEW)
    failpoint("ledger.after_preview_removed")
    if not await _note(db, row, preview_message_id=""):
        return SendResult.failed(Outcome.NOT_SENT, "the preview's removal could not be recorded")
    row.needs_marker = maybe_landed and not gone.ok
    return await send_piece(transport, target, piece, label_of(row) if row.needs_marker else "")


async def _slot_reached(db: DbRunner, row: OutboundMessage, pace: Pace, sent_at: float | None) -> bool:
    """Wait for the chunk's slot; False if it could not be reserved (the database away):
    the chunk has not left, so the attempt stops there, resent unlabelled (reported once
    per channel with the send's outcome, and by the database thread once per fault)."""
    try:
        await _wait_for_slot(db, row, pace, sent_at)
    except Exception:
        return False
    return True


async def _wait_for_slot(db: DbRunner, row: OutboundMessage, pace: Pace, sent_at: float | None) -> None:
    """Sleep until this chunk's slot: the attempt's first waits out the delay its claim
    reserved; a later one a chat interval after the chunk before (`sent_at`, monotonic),
    then a bot slot of its own. A send that wakes well past its slot (the event loop or
    the database was busy) takes a fresh slot instead of going at once: the platform
    counts arrivals, and overdue sends going out together are the burst pacing exists to
    prevent. Twice at most; then it goes."""
    if sent_at is None:
        due = getattr(row, "send_at", 0.0)
    else:
        await asyncio.sleep(max(sent_at + pace.chat_interval - time.monotonic(), 0.0))
        due = time.monotonic() + await db(pacing.chunk_slot, pace)
    for _ in range(LATE_RESLOTS):
        await asyncio.sleep(max(due - time.monotonic(), 0.0))
        if time.monotonic() - due <= pacing.LATE_TOLERANCE:
            return
        due = time.monotonic() + await db(pacing.bot_slot, pace)
    await asyncio.sleep(max(due - time.monotonic(), 0.0))


async def _in_a_thread(fn: Callable[..., T], *args: Any) -> T:
    return await sync_to_async(fn)(*args)


async def _note(db: DbRunner, row: OutboundMessage, **progress: Any) -> bool:
    """Record a chunk's progress on the claim we hold; False if it could not be (the
    database away, or the claim lost): the attempt stops there. With the ledger off
    (a row kept in memory only) there is nothing to record."""
    if row.pk is None:
        return True  # type: ignore[unreachable]  # the ledger off: no pk (django-stubs says one is always there)
    try:
        noted = await db(note_progress, row.pk, row.claim_token, progress)
    except Exception as exc:
        log.warning("could not record the progress of ledger row %s: %s", row.pk, type(exc).__name__)
        return False
    if noted:
        for name, value in progress.items():
            setattr(row, name, value)
    return bool(noted)


def note_progress(pk: int, claim_token: str, progress: dict[str, Any]) -> int:
    return OutboundMessage.transition(pk, OutboundState.ATTEMPTING, OutboundState.ATTEMPTING,
                                      where={"claim_token": claim_token}, **progress)
