"""Edits of messages the user already sent (Telegram's `edited_message`, the inbound
API's PATCH, the playground's edit): the corrected text counts, once.

Where the edited message's input is decides what the edit does (channel.edits = apply):

- still waiting in an open buffer (its own, or carried there by an interrupt): the
  text is replaced there and the window re-armed from now, planned from the buffer's
  last message (the edited one, if it is the last);
- merged into a turn that has not fired an effect, on a channel whose double texting is
  `interrupt`: the turn is cancelled by the interrupt's own compare-and-swap
  (turns.cancel: only while `fired_effect` is false — the flag every guarded tool call
  sets first, so "no effect fired" is exactly "the guard holds no claim of this turn")
  and its messages go back to a buffer, which flushes into a new turn at once;
- otherwise (enqueue and the other strategies, a turn that fired an effect, or one that
  is over): a note for the agent's next turn, "the user edited 'A' to 'B'". Never lost,
  never an effect run twice.

With `ignore`, an edit is recorded and audited and changes nothing. Every edit is one
transaction with the conversation locked (as an admission), and its row's unique
(message, edited_at) is the dedup: a redelivered edit stops at its INSERT. The rows are
written with the admission's own statements (agentloop.core.rows.insert,
conversations.sql.update_open_buffer), so an edit and an admission racing on a buffer meet
the same compare-and-swap.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from agentloop.core.rows import insert
from audit.events import record
from audit.models import EventKind
from conversations import flushing, ingest, notes, sql, turns, windows
from conversations.ingest.refusal import column_length
from conversations.models import (
    BufferState,
    Conversation,
    Disposition,
    DoubleTexting,
    EditOutcome,
    EditsPolicy,
    FlushReason,
    InboundMessage,
    MessageBuffer,
    MessageEdit,
    MessageKind,
    Turn,
    TurnState,
)

if TYPE_CHECKING:
    from conversations.models import Channel

T = TypeVar("T")

log = logging.getLogger(__name__)

UNKNOWN = "unknown_message"  # an outcome with no row: the edited message was never admitted
# Outcomes that leave a buffer for the flusher to look at (a re-armed or re-run one).
WAKES_THE_FLUSHER = (EditOutcome.BUFFERED, EditOutcome.RERUN)
# A note quotes at most this much of each text (the stored edit keeps them whole).
NOTE_QUOTE_CHARS = 1500
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


@dataclass(frozen=True)
class Edit:
    """An edit in our own terms. `chat_id`/`sender_id`, when given, must be those of the
    edited message's conversation (else it is an unknown message to this sender)."""

    platform_message_id: str
    text: str
    edited_at: datetime
    source: str  # telegram, api, webchat
    chat_id: str | None = None
    sender_id: str = ""


@dataclass(frozen=True, slots=True)
class Correction:
    """An edit being applied to a message whose input a turn holds: where, which message
    (its text already the new one), the text it had, and when."""

    channel: Channel
    conversation: Conversation
    message: InboundMessage
    old_text: str
    now: datetime


@dataclass
class EditResult:
    outcome: str  # an EditOutcome value, or UNKNOWN
    duplicate: bool = False
    message_id: int | None = None
    conversation_id: int | None = None
    turn_id: int | None = None
    buffer_id: int | None = None
    flush_at: datetime | None = None
    window_kind: str = ""
    window_seconds: float = 0.0
    detail: str = ""


def refusal(edit: Edit) -> str:
    """Why this edit cannot be stored, or "": the same bounds as a new message."""
    limits = {"platform_message_id": column_length(InboundMessage, "platform_message_id"),
              "text": ingest.MAX_TEXT_CHARS}
    for name, limit in limits.items():
        value = getattr(edit, name)
        found = _UNSTORABLE_CHARACTER.search(value)
        if found:
            what = "a NUL character" if found.group() == "\x00" else "an unpaired surrogate"
            return f"{name} contains {what} (U+{ord(found.group()):04X}), which cannot be stored"
        if len(value) > limit:
            return f"{name} is {len(value)} characters long; at most {limit} can be stored"
    return ""


def apply(channel: Channel, edit: Edit, now: datetime | None = None) -> EditResult:
    """Apply one edit (see the module's docstring). Raises ingest.Unstorable for an edit
    the database cannot store as given; a deadlock (PostgreSQL) is retried whole."""
    problem = refusal(edit)
    if problem:
        raise ingest.Unstorable(problem)
    return retried(lambda: _apply(channel, edit, now or timezone.now()), f"edit of {edit.platform_message_id}")


def retried(work: Callable[[], T], what: str) -> T:
    """`work()` in one transaction, retried whole (up to 3 times) after a deadlock or a
    serialization failure: edits and deletions lock the conversation as admissions do."""
    for attempt in range(1, 4):
        try:
            with transaction.atomic():
                return work()
        except OperationalError as exc:
            if attempt == 3 or getattr(exc.__cause__, "sqlstate", None) not in ingest.RETRYABLE:
                raise
            log.warning("%s retried after: %s", what, exc)
    raise AssertionError("unreachable")


def apply_or_refuse(channel: Channel, edit: Edit, source: str) -> EditResult | None:
    """For the platforms' paths, which must not fail on bad input (Telegram would resend
    it forever): an unstorable edit is audited and None returned."""
    try:
        return apply(channel, edit)
    except ingest.Unstorable as exc:
        ingest.record_refusal(channel, edit, str(exc), source)
        return None


# --- one edit, inside its transaction ---------------------------------------------------------


def _apply(channel: Channel, edit: Edit, now: datetime) -> EditResult:
    conversation_id = (InboundMessage.objects.filter(channel=channel, platform_message_id=edit.platform_message_id)
                       .values_list("conversation_id", flat=True).first())
    conversation = locked_conversation(channel, conversation_id) if conversation_id else None
    if conversation is None or (edit.chat_id is not None and (conversation.chat_id, conversation.sender_id)
                                != (edit.chat_id, edit.sender_id)):
        return _unknown(channel, edit)
    message = InboundMessage.objects.get(channel=channel, platform_message_id=edit.platform_message_id)
    row = MessageEdit(message=message, conversation=conversation, edited_at=edit.edited_at, received_at=now,
                      source=edit.source, old_text=message.text, new_text=edit.text, outcome="")
    if not insert(row, ("message_id", "edited_at")):
        first = MessageEdit.objects.get(message=message, edited_at=edit.edited_at)
        return EditResult(first.outcome, duplicate=True, message_id=message.pk, conversation_id=conversation.pk,
                          turn_id=first.turn_id, detail=first.detail)
    result = _decide(channel, conversation, message, edit, now)
    result.message_id, result.conversation_id = message.pk, conversation.pk
    MessageEdit.objects.filter(pk=row.pk).update(outcome=result.outcome, detail=result.detail[:300],
                                                 turn_id=result.turn_id)
    _audit(conversation, message, row, result)
    return result


def locked_conversation(channel: Channel, conversation_id: int) -> Conversation | None:
    """The conversation, locked as an admission locks it: the edit and the conversation's
    admissions apply one after the other (SQLite: BEGIN IMMEDIATE already serialises)."""
    rows = Conversation.objects.filter(pk=conversation_id)
    if connection.features.has_select_for_update:
        rows = rows.select_for_update(no_key=True)
    conversation = rows.first()
    if conversation is not None:
        conversation.channel = channel
    return conversation


def _unknown(channel: Channel, edit: Edit) -> EditResult:
    record(EventKind.EDIT_IGNORED, channel_slug=channel.slug, actor=ingest.printable(edit.sender_id),
           target=f"message {ingest.printable(edit.platform_message_id, 150)}",
           summary=f"{edit.source}: an edit of a message never received here", source=edit.source)
    return EditResult(UNKNOWN, detail="no such message")


def _decide(channel: Channel, conversation: Conversation, message: InboundMessage, edit: Edit,
            now: datetime) -> EditResult:
    if channel.edits == EditsPolicy.IGNORE:
        return EditResult(EditOutcome.IGNORED, detail="the channel ignores edits (edits: ignore)")
    if edit.text == message.text:
        return EditResult(EditOutcome.UNCHANGED, detail="the text is the same as before")
    why_not = _never_in_a_turn(message, edit)
    if why_not:
        return EditResult(EditOutcome.NOT_APPLIED, detail=why_not)
    old = message.text
    for _ in range(3):  # a flusher may claim the buffer meanwhile: then the turn decides
        where = input_holder(message)
        if isinstance(where, str):
            return EditResult(EditOutcome.NOT_APPLIED, detail=where)
        _set_text(message, edit.text, now)
        if isinstance(where, MessageBuffer):
            result = correct_open_buffer(channel, where, carried_messages(where), now)
            if result is not None:
                return result
            message.refresh_from_db(fields=["buffer"])
            continue
        return _correct_turn(Correction(channel, conversation, message, old, now), where)
    raise OperationalError("the edited message's buffer kept changing")  # retried by the caller's caller


def _never_in_a_turn(message: InboundMessage, edit: Edit) -> str:
    if message.kind == MessageKind.CONTROL:
        return "a control command is not run again"
    if not edit.text.strip() and not message.media_type:
        return "an edit cannot empty a text message"
    if message.disposition == Disposition.REJECTED:
        return "the message was rejected while a turn ran (the user was asked to send it again)"
    if message.disposition == Disposition.DROPPED:
        return "the message was dropped (/stop or /reset)"
    if message.disposition == Disposition.OVERFLOW:
        return "the message was kept out of a full buffer"
    if message.buffer_id is None:
        return "the message is in no buffer"
    return ""


def input_holder(message: InboundMessage) -> MessageBuffer | Turn | str:
    """Where the message's input is now: its open buffer, the turn it went into, or an
    open buffer or later turn an interrupt carried it to; a str when it went nowhere."""
    buffer: MessageBuffer = MessageBuffer.objects.get(pk=message.buffer_id)
    for _ in range(1000):  # each step follows one interrupt: a finite chain
        if buffer.state == BufferState.OPEN:
            return buffer
        if buffer.state == BufferState.DROPPED:
            return "the message was dropped (/stop or /reset)"
        turn: Turn | None = Turn.objects.filter(buffer=buffer).first()
        if turn is None:
            return "its buffer has no turn"
        if turn.state != TurnState.CANCELLED:
            return turn
        carried_to: MessageBuffer | None = MessageBuffer.objects.filter(carried_turn=turn).first()
        if carried_to is None:
            return f"its turn {turn.pk} was cancelled and its input dropped ({turn.outcome})"
        buffer = carried_to
    return "its input was carried too many times"


def _set_text(message: InboundMessage, text: str, now: datetime) -> None:
    InboundMessage.objects.filter(pk=message.pk).update(text=text, edited_at=now)
    message.text, message.edited_at = text, now


def input_buffers(buffer_id: int | None) -> list[int]:
    """The buffer and those whose input it carries (interrupts), newest first."""
    ids = []
    while buffer_id is not None and buffer_id not in ids:
        ids.append(buffer_id)
        buffer_id = (MessageBuffer.objects.filter(pk=buffer_id)
                     .values_list("carried_turn__buffer_id", flat=True).first())
    return ids


def carried_messages(buffer: MessageBuffer) -> list[InboundMessage]:
    """Messages whose input `buffer` carries as a cancelled turn's text (not as messages)."""
    if buffer.carried_turn_id is None:
        return []
    carried = Turn.objects.filter(pk=buffer.carried_turn_id).values_list("buffer_id", flat=True).first()
    return list(InboundMessage.objects.filter(buffer_id__in=input_buffers(carried))) if carried else []


def correct_open_buffer(channel: Channel, buffer: MessageBuffer, moved: list[InboundMessage],
                        now: datetime) -> EditResult | None:
    """Re-plan the open buffer from now, its `moved` messages (an interrupted turn's
    input, whose text it carried) joining it as messages so the merge reads their
    corrected text. None when the buffer is no longer open (a flusher claimed it)."""
    mine = list(InboundMessage.objects.filter(buffer=buffer))
    fields = _replan(channel, buffer, mine + moved, now)
    if moved:
        fields["carried_turn_id"] = None
    if not sql.update_open_buffer(buffer.pk, fields):
        return None
    if moved:
        InboundMessage.objects.filter(pk__in=[m.pk for m in moved]).update(buffer=buffer)
    return EditResult(EditOutcome.BUFFERED, buffer_id=buffer.pk, flush_at=fields["flush_at"],
                      window_kind=fields["window_kind"], window_seconds=fields["window_seconds"],
                      detail=f"corrected in open buffer {buffer.pk}; its window re-armed "
                             f"({fields['window_kind']}, {fields['window_seconds']:g} s)")


def _replan(channel: Channel, buffer: MessageBuffer, messages: Iterable[InboundMessage],
            now: datetime) -> dict[str, Any]:
    """The buffer's deadline re-planned from now, by its last message (as an admission
    plans it), counting every message it holds."""
    ordered = sorted(messages, key=lambda m: (m.received_at, m.pk))
    last = ordered[-1]
    count = len(windows.message_starts([m.album_id for m in ordered]))  # an album counts once
    plan = windows.plan_flush(ingest.latest(last), now=now, first_message_at=buffer.first_message_at,
                              message_count=count, settings=channel.debounce_settings())
    return {"message_count": count, "last_message_at": now, "flush_at": plan.flush_at,
            "planned_reason": plan.reason, "window_kind": plan.window_kind, "window_seconds": plan.window_seconds,
            "last_album_id": last.album_id}


def _correct_turn(correction: Correction, turn: Turn) -> EditResult:
    """The message's input is in `turn`: re-run it (interrupt, no effect fired), else a
    note for the next turn."""
    channel, conversation, message, now = (correction.channel, correction.conversation, correction.message,
                                           correction.now)
    messages = list(InboundMessage.objects.filter(buffer_id__in=input_buffers(turn.buffer_id)))
    why = cancel_for_rerun(channel, turn, f"interrupt: message {message.pk} was edited; re-run with the corrected "
                                          "text", now)
    if not why:
        return rerun(channel, conversation, turn, messages, now)
    notes.inform(conversation.pk, for_agent=note_text(correction.old_text, message.text))
    return EditResult(EditOutcome.NOTED, turn_id=turn.pk, detail=f"{why}: noted for the next turn")


def cancel_for_rerun(channel: Channel, turn: Turn, reason: str, now: datetime) -> str:
    """Cancel `turn` so that its input runs again, changed: only on a channel whose
    double texting is `interrupt`, and by the interrupt's own compare-and-swap (refused
    once the turn fired an effect). "" when cancelled, else why not."""
    if turn.state in Turn.ACTIVE and channel.double_texting == DoubleTexting.INTERRUPT:
        if turns.cancel(turn.pk, reason, now):
            return ""
        return f"turn {turn.pk} had already fired an external effect"
    if turn.state in Turn.ACTIVE:
        return f"turn {turn.pk} is {turn.state} and the channel's double texting is {channel.double_texting}"
    return f"turn {turn.pk} is {turn.state}"


def note_text(old: str, new: str) -> str:
    """What the agent reads: both texts, each on one line and bounded (the newest part kept)."""
    return f'The user edited an earlier message from "{_quoted(old)}" to "{_quoted(new)}".'


def _quoted(text: str) -> str:
    return flushing.clip(text, NOTE_QUOTE_CHARS).replace("\n", " ")


def rerun(channel: Channel, conversation: Conversation, turn: Turn, messages: list[InboundMessage],
          now: datetime) -> EditResult:
    """The cancelled turn's messages (and those of the turns it carried) go back to the
    conversation's open buffer, or to a new one due now, which the flusher makes the
    re-run turn of."""
    waiting = MessageBuffer.objects.filter(conversation=conversation, state=BufferState.OPEN).first()
    if waiting is not None:
        result = correct_open_buffer(channel, waiting, messages + carried_messages(waiting), now)
        if result is not None:
            result.outcome, result.turn_id = EditOutcome.RERUN, turn.pk
            result.detail = f"turn {turn.pk} cancelled; re-run with the corrected text (with open buffer {waiting.pk})"
            return result
    buffer = MessageBuffer(conversation=conversation, first_message_at=min(m.received_at for m in messages),
                           last_message_at=now, flush_at=now, planned_reason=FlushReason.EDIT, window_kind="edit",
                           message_count=len(messages))
    insert(buffer)
    InboundMessage.objects.filter(pk__in=[m.pk for m in messages]).update(buffer=buffer)
    return EditResult(EditOutcome.RERUN, turn_id=turn.pk, buffer_id=buffer.pk, flush_at=now,
                      detail=f"turn {turn.pk} cancelled; re-run with the corrected text")


def _audit(conversation: Conversation, message: InboundMessage, row: MessageEdit, result: EditResult) -> None:
    changed = result.outcome in (EditOutcome.BUFFERED, EditOutcome.RERUN, EditOutcome.NOTED)
    kind = EventKind.MESSAGE_EDITED if changed else EventKind.EDIT_IGNORED
    record(kind, conversation=conversation, actor=conversation.sender_id, target=f"message {message.pk}",
           summary=f"{EditOutcome(result.outcome).label}: \"{row.old_text[:100]}\" → \"{row.new_text[:100]}\"",
           outcome=result.outcome, detail=result.detail, edit=row.pk, turn=result.turn_id, source=row.source,
           edited_at=row.edited_at.isoformat())
