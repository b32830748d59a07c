"""Deletions of messages the user already sent (Slack's `message_deleted`, the inbound
API's DELETE, the playground's delete; Telegram tells a bot of no deletion): the deleted
text is withdrawn, once.

Where the deleted message's input is decides what the deletion does — the same places,
and the same compare-and-swaps, as an edit's (conversations/edits.py, whose machinery
this reuses):

- still waiting in an open buffer: the message leaves it and the window is re-planned
  from what is left; if it was the only message, the buffer is dropped and no turn runs;
- merged into a turn that has not fired an effect, on a channel whose double texting is
  `interrupt`: the turn is cancelled (turns.cancel, refused once `fired_effect` is set)
  and its other messages run again without it (none left: nothing runs);
- otherwise (another strategy, an effect fired, the turn over): the agent's next turn
  gets a note — "the person deleted the message that asked for <the effects>" — and the
  turn's stored input no longer carries the text, so no later prompt quotes it.

The message row keeps its text for the audit and the story page, marked `deleted_at`.
A redelivered deletion finds `deleted_at` set and changes nothing. Each deletion is one
transaction with the conversation locked, as an edit is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db import OperationalError
from django.utils import timezone

from audit.events import record
from audit.models import EventKind
from conversations import edits, ingest, notes
from conversations.ingest.refusal import column_length
from conversations.models import (
    BufferState,
    FlushReason,
    InboundMessage,
    MessageBuffer,
    MessageKind,
    Turn,
)
from tools.models import ActionClaim

if TYPE_CHECKING:
    from conversations.models import Channel, Conversation

UNKNOWN = edits.UNKNOWN
WITHDRAWN = "withdrawn"  # left its open buffer; the rest of the burst still runs
NO_TURN = "no_turn"  # it was all its buffer held: the buffer dropped, nothing runs
RERUN = "rerun"  # its turn cancelled (no effect fired) and run again without it
CANCELLED = "cancelled"  # its turn cancelled and nothing else to run
NOTED = "noted"  # too late to withdraw: the agent's next turn is told
NOT_APPLIED = "not_applied"  # it never reached a turn (a command, rejected, dropped)
OUTCOMES = (WITHDRAWN, NO_TURN, RERUN, CANCELLED, NOTED, NOT_APPLIED)
# Outcomes that leave a buffer for the flusher to look at (a re-planned or re-run one).
WAKES_THE_FLUSHER = (WITHDRAWN, RERUN)
# What a turn's stored input reads where the deleted text was.
WITHDRAWN_TEXT = "[a message the person deleted]"


@dataclass(frozen=True)
class Deletion:
    """A deletion in our own terms. `chat_id`/`sender_id`, when given, must be those of
    the deleted message's conversation (else it is an unknown message to this sender)."""

    platform_message_id: str
    deleted_at: datetime
    source: str  # slack, api, webchat
    chat_id: str | None = None
    sender_id: str = ""


@dataclass
class DeletionResult:
    outcome: str  # one of OUTCOMES, or UNKNOWN
    duplicate: bool = False
    message_id: int | None = None
    conversation_id: int | None = None
    turn_id: int | None = None
    buffer_id: int | None = None
    flush_at: datetime | None = None
    detail: str = ""


def apply(channel: Channel, deletion: Deletion, now: datetime | None = None) -> DeletionResult:
    """Apply one deletion (see the module's docstring); a deadlock is retried whole."""
    if len(deletion.platform_message_id) > column_length(InboundMessage, "platform_message_id"):
        return _unknown(channel, deletion)  # longer than any id stored: never admitted
    return edits.retried(lambda: _apply(channel, deletion, now or timezone.now()),
                         f"deletion of {deletion.platform_message_id}")


def _apply(channel: Channel, deletion: Deletion, now: datetime) -> DeletionResult:
    conversation_id = (InboundMessage.objects.filter(channel=channel, platform_message_id=deletion.platform_message_id)
                       .values_list("conversation_id", flat=True).first())
    conversation = edits.locked_conversation(channel, conversation_id) if conversation_id else None
    if conversation is None or (deletion.chat_id is not None and (conversation.chat_id, conversation.sender_id)
                                != (deletion.chat_id, deletion.sender_id)):
        return _unknown(channel, deletion)
    message = InboundMessage.objects.get(channel=channel, platform_message_id=deletion.platform_message_id)
    # The row's own compare-and-swap is the dedup: a redelivered deletion stops here.
    if not InboundMessage.objects.filter(pk=message.pk, deleted_at__isnull=True).update(deleted_at=now):
        return DeletionResult(NOT_APPLIED, duplicate=True, detail="deleted before", message_id=message.pk,
                              conversation_id=conversation.pk)
    message.deleted_at = now
    result = _decide(channel, conversation, message, now)
    result.message_id, result.conversation_id = message.pk, conversation.pk
    _audit(conversation, message, deletion, result)
    return result


def _unknown(channel: Channel, deletion: Deletion) -> DeletionResult:
    record(EventKind.MESSAGE_DELETED, channel_slug=channel.slug, actor=ingest.printable(deletion.sender_id),
           target=f"message {ingest.printable(deletion.platform_message_id, 150)}",
           summary=f"{deletion.source}: a deletion of a message never received here", outcome=UNKNOWN,
           source=deletion.source)
    return DeletionResult(UNKNOWN, detail="no such message")


def _decide(channel: Channel, conversation: Conversation, message: InboundMessage, now: datetime) -> DeletionResult:
    if message.kind == MessageKind.CONTROL:
        return DeletionResult(NOT_APPLIED, detail="a control command has run already")
    if message.buffer_id is None:
        return DeletionResult(NOT_APPLIED, detail="the message is in no buffer")
    for _ in range(3):  # a flusher may claim the buffer meanwhile: then the turn decides
        where = edits.input_holder(message)
        if isinstance(where, str):
            return DeletionResult(NOT_APPLIED, detail=where)
        if isinstance(where, MessageBuffer):
            result = _withdraw_from_buffer(channel, where, message, now)
            if result is not None:
                return result
            message.refresh_from_db(fields=["buffer"])
            continue
        return _withdraw_from_turn(channel, conversation, message, where, now)
    raise OperationalError("the deleted message's buffer kept changing")  # retried whole


def _withdraw_from_buffer(channel: Channel, buffer: MessageBuffer, message: InboundMessage,
                          now: datetime) -> DeletionResult | None:
    """The message leaves its open buffer (and the input an interrupt carried there, as
    an edit re-plans it); None when the buffer is no longer open (a flusher claimed it)."""
    moved = [m for m in edits.carried_messages(buffer) if m.pk != message.pk]
    left = InboundMessage.objects.filter(buffer=buffer).exclude(pk=message.pk).exists() or moved
    if not left:
        if not MessageBuffer.transition(buffer.pk, BufferState.OPEN, BufferState.DROPPED,
                                        flush_reason=FlushReason.CONTROL, flushed_at=now):
            return None
        _detach(message)
        return DeletionResult(NO_TURN, buffer_id=buffer.pk,
                              detail=f"it was all open buffer {buffer.pk} held: dropped, no turn")
    previous = message.buffer_id
    _detach(message)
    corrected = edits.correct_open_buffer(channel, buffer, moved, now)
    if corrected is None:
        InboundMessage.objects.filter(pk=message.pk).update(buffer_id=previous)
        return None
    return DeletionResult(WITHDRAWN, buffer_id=buffer.pk, flush_at=corrected.flush_at,
                          detail=f"withdrawn from open buffer {buffer.pk}; its window re-planned "
                                 f"({corrected.window_kind}, {corrected.window_seconds:g} s)")


def _withdraw_from_turn(channel: Channel, conversation: Conversation, message: InboundMessage, turn: Turn,
                        now: datetime) -> DeletionResult:
    """The message's input is in `turn`: cancel and re-run it without the message (the
    channel's double texting decides, as for an edit), else a note for the next turn."""
    others = [m for m in InboundMessage.objects.filter(buffer_id__in=edits.input_buffers(turn.buffer_id))
              if m.pk != message.pk and m.deleted_at is None]
    why = edits.cancel_for_rerun(channel, turn, f"interrupt: message {message.pk} was deleted; re-run without it",
                                 now)
    if not why:
        _detach(message)
        if not others:
            return DeletionResult(CANCELLED, turn_id=turn.pk,
                                  detail=f"turn {turn.pk} cancelled: the deleted message was all it had to answer")
        result = edits.rerun(channel, conversation, turn, others, now)
        return DeletionResult(RERUN, turn_id=turn.pk, buffer_id=result.buffer_id, flush_at=result.flush_at,
                              detail=f"turn {turn.pk} cancelled; re-run without the deleted message")
    _withdraw_text(turn, message)
    notes.inform(conversation.pk, for_agent=note_text(_effects_of(turn, now)))
    return DeletionResult(NOTED, turn_id=turn.pk, detail=f"{why}: noted for the next turn")


def _detach(message: InboundMessage) -> None:
    InboundMessage.objects.filter(pk=message.pk).update(buffer=None)


def _withdraw_text(turn: Turn, message: InboundMessage) -> None:
    """The turn's stored input (what later turns read as history) without the deleted
    text; the message row keeps it for the audit."""
    text = message.text.strip()
    if text and text in turn.merged_input:
        Turn.objects.filter(pk=turn.pk).update(merged_input=turn.merged_input.replace(text, WITHDRAWN_TEXT))


def _effects_of(turn: Turn, now: datetime) -> list[str]:
    """The guarded actions the turn started (the guard's claims, by conversation and
    time): what the deleted message asked for, in the agent's own tool names."""
    if not turn.fired_effect:
        return []
    since = turn.effect_fired_at or turn.started_at or turn.created_at
    until = turn.finished_at or now
    claims = (ActionClaim.objects.filter(conversation_id=turn.conversation_id, created_at__gte=since,
                                         created_at__lte=until).order_by("created_at").values_list("action", flat=True))
    return list(dict.fromkeys(claims[:20]))


def note_text(effects: list[str]) -> str:
    """What the agent reads: that the message is gone, never its words."""
    if effects:
        return (f"The person deleted the message that asked for {', '.join(effects)} (already done). Its text is "
                "withdrawn: do not quote it or act on it again; what was done stands unless they ask to undo it.")
    return ("The person deleted a message they had sent earlier. Its text is withdrawn: do not quote it or act "
            "on it.")


def _audit(conversation: Conversation, message: InboundMessage, deletion: Deletion, result: DeletionResult) -> None:
    record(EventKind.MESSAGE_DELETED, conversation=conversation, actor=conversation.sender_id,
           target=f"message {message.pk}", summary=f"{result.outcome}: \"{message.text[:100]}\" deleted",
           outcome=result.outcome, detail=result.detail[:300], turn=result.turn_id, source=deletion.source,
           deleted_at=deletion.deleted_at.isoformat())
