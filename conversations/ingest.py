"""Admitting one inbound message: durable dedup, then the buffer (or a control command,
or the channel's double-texting strategy when a turn is running).

Everything for one message happens in one transaction, with the conversation row
locked, so concurrent messages of a conversation are applied one after the other
(PostgreSQL: SELECT … FOR UPDATE; SQLite: BEGIN IMMEDIATE serialises writers).
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.events import record
from audit.models import EventKind
from conversations import control, turns, windows
from conversations.models import (
    BufferState, Contact, Conversation, Disposition, DoubleTexting, InboundMessage,
    MessageBuffer, MessageKind, Turn, TurnState,
)
from delivery import outbox
from delivery.models import OutboundKind

REJECT_NOTICE = "I'm still working on your previous message. Please send this again once I've answered."


@dataclass(frozen=True)
class Inbound:
    """A platform message in our own terms (parsed from Telegram, the API, the web chat)."""

    platform_message_id: str
    chat_id: str
    sender_id: str
    text: str = ""
    sender_name: str = ""
    username: str = ""
    media_type: str = ""  # "photo", "voice", … ; empty for plain text
    is_group: bool = False
    thread_id: str = ""
    reply_target: str = ""  # the platform id our reply threads to
    sent_at: datetime | None = None


@dataclass
class Admission:
    duplicate: bool
    conversation_id: int | None = None
    message_id: int | None = None
    disposition: str = ""
    buffer_id: int | None = None
    flush_at: datetime | None = None
    planned_reason: str = ""
    window_kind: str = ""
    window_seconds: float = 0.0
    notes: list = field(default_factory=list)


def admit(channel, inbound: Inbound, now: datetime | None = None) -> Admission:
    now = now or timezone.now()
    with transaction.atomic():
        conversation = _locked_conversation(channel, inbound)
        message = _store_once(channel, conversation, inbound, now)
        if message is None:
            return Admission(duplicate=True, conversation_id=conversation.pk)
        admission = Admission(duplicate=False, conversation_id=conversation.pk, message_id=message.pk)
        command = control.parse(inbound.text) if not inbound.media_type else None
        if command:
            control.handle(conversation, message, command, now)
            admission.disposition = Disposition.CONTROL
            return admission
        running = Turn.objects.filter(conversation=conversation, state=TurnState.RUNNING).first()
        carried = None
        if running is not None:
            outcome = _double_text(channel, conversation, running, message, now)
            if outcome == "rejected":
                admission.disposition = Disposition.REJECTED
                return admission
            carried = running if outcome == "interrupted" else None
        buffer = _buffer(conversation, message, inbound, now, carried)
        admission.disposition = Disposition.BUFFERED
        admission.buffer_id = buffer.pk
        admission.flush_at = buffer.flush_at
        admission.planned_reason = buffer.planned_reason
        admission.window_kind = buffer.window_kind
        admission.window_seconds = buffer.window_seconds
        return admission


def _locked_conversation(channel, inbound):
    lookup = {"channel": channel, "chat_id": inbound.chat_id, "sender_id": inbound.sender_id}
    conversation = Conversation.objects.select_for_update().filter(**lookup).first()
    if conversation is not None:
        return conversation
    contact, _ = Contact.objects.get_or_create(
        channel=channel, platform_id=inbound.sender_id,
        defaults={"display_name": inbound.sender_name[:200], "username": inbound.username[:100]},
    )
    conversation, _ = Conversation.objects.get_or_create(
        **lookup, defaults={"contact": contact, "is_group": inbound.is_group}
    )
    # Lock it (a no-op on SQLite, where the IMMEDIATE transaction already serialises).
    return Conversation.objects.select_for_update().get(pk=conversation.pk)


def _store_once(channel, conversation, inbound, now):
    """Insert the message under its unique constraint; None when it was already admitted.
    Inserting first is the dedup: a retry, a resume or a re-polled batch all stop here."""
    kind = MessageKind.MEDIA if inbound.media_type else MessageKind.TEXT
    if not inbound.media_type and control.parse(inbound.text):
        kind = MessageKind.CONTROL
    try:
        with transaction.atomic():  # a savepoint: PostgreSQL aborts the outer block otherwise
            return InboundMessage.objects.create(
                channel=channel, conversation=conversation,
                platform_message_id=inbound.platform_message_id, kind=kind,
                text=inbound.text, media_type=inbound.media_type,
                sender_name=inbound.sender_name[:200], reply_target=inbound.reply_target,
                thread_id=inbound.thread_id, sent_at=inbound.sent_at, received_at=now,
            )
    except IntegrityError:
        return None


def _double_text(channel, conversation, running, message, now):
    """Apply the channel's strategy to a message that arrived while `running` runs.
    Returns "rejected", "interrupted", "rolled_back" or "enqueued"."""
    strategy = channel.double_texting
    if strategy == DoubleTexting.REJECT:
        message.disposition = Disposition.REJECTED
        message.save(update_fields=["disposition"])
        outbox.enqueue(conversation, REJECT_NOTICE, kind=OutboundKind.NOTICE,
                       reply_target=message.reply_target, thread_id=message.thread_id)
        record(EventKind.MESSAGE_REJECTED, conversation=conversation, target=f"turn {running.pk}",
               actor=conversation.sender_id, summary=message.text[:200])
        return "rejected"
    if strategy in (DoubleTexting.INTERRUPT, DoubleTexting.ROLLBACK):
        if turns.cancel(running.pk, f"{strategy}: a new message arrived", now):
            kind = EventKind.TURN_INTERRUPTED if strategy == DoubleTexting.INTERRUPT else EventKind.TURN_ROLLED_BACK
            record(kind, conversation=conversation, target=f"turn {running.pk}", actor=conversation.sender_id)
            return "interrupted" if strategy == DoubleTexting.INTERRUPT else "rolled_back"
        # The turn already touched the outside world: it cannot be undone, so the
        # message waits for it like `enqueue`.
        record(EventKind.STRATEGY_FELL_BACK, conversation=conversation, target=f"turn {running.pk}",
               summary=f"{strategy} refused: the turn has fired an external effect; enqueued instead")
    return "enqueued"


def _buffer(conversation, message, inbound, now, carried):
    """Add the message to the conversation's open buffer (re-arming its deadline)."""
    buffer = MessageBuffer.objects.select_for_update().filter(
        conversation=conversation, state=BufferState.OPEN
    ).first()
    if buffer is None:
        buffer = MessageBuffer(conversation=conversation, first_message_at=now, message_count=0)
    buffer.message_count += 1
    buffer.last_message_at = now
    if carried is not None:
        buffer.carried_turn = carried
    plan = windows.plan_flush(
        text=inbound.text, is_media=bool(inbound.media_type), now=now,
        first_message_at=buffer.first_message_at, message_count=buffer.message_count,
        settings=conversation.channel.debounce_settings(),
    )
    buffer.flush_at = plan.flush_at
    buffer.planned_reason = plan.reason
    buffer.window_kind = plan.window_kind
    buffer.window_seconds = plan.window_seconds
    buffer.save()
    InboundMessage.objects.filter(pk=message.pk).update(buffer=buffer)
    return buffer
