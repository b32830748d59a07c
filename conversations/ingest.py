"""Admitting one inbound message: durable dedup, then the buffer (or a control command,
or the channel's double-texting strategy when a turn is running).

Everything for one message happens in one transaction, with the conversation row
locked, so concurrent messages of a conversation are applied one after the other
(PostgreSQL: SELECT … FOR UPDATE; SQLite: BEGIN IMMEDIATE serialises writers).
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery
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
    command = control.parse(inbound.text) if not inbound.media_type else None
    with transaction.atomic():
        conversation = _locked_conversation(channel, inbound)
        running = conversation.running_turn_id
        # The open buffer comes with the conversation, so the message is stored with it
        # in one statement; with a turn running the strategy decides first.
        buffer = None if (command or running) else _known_open_buffer(conversation)
        message = _store_once(channel, conversation, inbound, now, command, buffer)
        if message is None:
            return Admission(duplicate=True, conversation_id=conversation.pk)
        admission = Admission(duplicate=False, conversation_id=conversation.pk, message_id=message.pk)
        if command:
            control.handle(conversation, message, command, now)
            admission.disposition = Disposition.CONTROL
            return admission
        carried = None
        if running is not None:
            outcome = _double_text(channel, conversation, Turn(pk=running), message, now)
            if outcome == "rejected":
                admission.disposition = Disposition.REJECTED
                return admission
            carried = running if outcome == "interrupted" else None
            buffer = _first(MessageBuffer.objects.filter(conversation=conversation, state=BufferState.OPEN))
        buffer = _rearm(channel, conversation, buffer, message, inbound, now, carried)
        admission.disposition = Disposition.BUFFERED
        admission.buffer_id = buffer.pk
        admission.flush_at = buffer.flush_at
        admission.planned_reason = buffer.planned_reason
        admission.window_kind = buffer.window_kind
        admission.window_seconds = buffer.window_seconds
        return admission


def _first(queryset):
    """The first row or None, without .first()'s ORDER BY (at most one row matches)."""
    rows = list(queryset[:1])
    return rows[0] if rows else None


def _with_state(conversations):
    """Conversations annotated with their running turn and open buffer: one indexed
    query on the hot path instead of three."""
    running = Turn.objects.filter(conversation=OuterRef("pk"), state=TurnState.RUNNING)
    open_buffer = MessageBuffer.objects.filter(conversation=OuterRef("pk"), state=BufferState.OPEN)
    return conversations.annotate(
        running_turn_id=Subquery(running.values("pk")[:1]),
        open_buffer_id=Subquery(open_buffer.values("pk")[:1]),
        open_buffer_first_at=Subquery(open_buffer.values("first_message_at")[:1]),
        open_buffer_count=Subquery(open_buffer.values("message_count")[:1]),
    )


def _known_open_buffer(conversation):
    if conversation.open_buffer_id is None:
        return None
    return MessageBuffer(pk=conversation.open_buffer_id, conversation=conversation, state=BufferState.OPEN,
                         first_message_at=conversation.open_buffer_first_at,
                         message_count=conversation.open_buffer_count)


def _locked_conversation(channel, inbound):
    """The conversation, locked (PostgreSQL: FOR UPDATE; on SQLite the IMMEDIATE
    transaction already serialises writers), created on its first message."""
    lookup = {"channel": channel, "chat_id": inbound.chat_id, "sender_id": inbound.sender_id}
    locked = _with_state(Conversation.objects.select_for_update(of=("self",)))
    conversation = _first(locked.filter(**lookup))
    if conversation is not None:
        return conversation
    contact, _ = Contact.objects.get_or_create(
        channel=channel, platform_id=inbound.sender_id,
        defaults={"display_name": inbound.sender_name[:200], "username": inbound.username[:100]},
    )
    Conversation.objects.get_or_create(**lookup, defaults={"contact": contact, "is_group": inbound.is_group})
    return locked.get(**lookup)


def _store_once(channel, conversation, inbound, now, command, buffer):
    """Insert the message under its unique constraint; None when it was already admitted.
    Inserting first is the dedup: a retry, a resume or a re-polled batch all stop here."""
    kind = MessageKind.MEDIA if inbound.media_type else MessageKind.TEXT
    if command:
        kind = MessageKind.CONTROL
    try:
        with transaction.atomic():  # a savepoint: PostgreSQL aborts the outer block otherwise
            return InboundMessage.objects.create(
                channel=channel, conversation=conversation, buffer=buffer,
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


def _rearm(channel, conversation, buffer, message, inbound, now, carried):
    """Add the message to the conversation's open buffer (or a new one) and re-plan
    its deadline from this latest message."""
    if buffer is not None:
        fields = _planned(channel, inbound, now, buffer.first_message_at, buffer.message_count + 1, carried)
        # Compare-and-swap: the flusher may have claimed this buffer since we read it (it
        # does not lock the conversation); its turn was then made without this message,
        # which starts the next buffer instead.
        if MessageBuffer.objects.filter(pk=buffer.pk, state=BufferState.OPEN).update(**fields):
            for name, value in fields.items():
                setattr(buffer, name, value)
        else:
            buffer = None
    if buffer is None:
        fields = _planned(channel, inbound, now, now, 1, carried)
        buffer = MessageBuffer.objects.create(conversation=conversation, first_message_at=now, **fields)
    if message.buffer_id != buffer.pk:
        InboundMessage.objects.filter(pk=message.pk).update(buffer=buffer)
    return buffer


def _planned(channel, inbound, now, first_at, count, carried):
    plan = windows.plan_flush(
        text=inbound.text, is_media=bool(inbound.media_type), now=now, first_message_at=first_at,
        message_count=count, settings=channel.debounce_settings(),
    )
    fields = {"message_count": count, "last_message_at": now, "flush_at": plan.flush_at,
              "planned_reason": plan.reason, "window_kind": plan.window_kind, "window_seconds": plan.window_seconds}
    if carried is not None:
        fields["carried_turn_id"] = carried
    return fields
