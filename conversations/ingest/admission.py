"""Admitting one message, one by one: its conversation locked and read with its state
(one statement), the message inserted under its unique constraint (the dedup), then a
control command, an answer, an overflow, the double-texting strategy, or the buffer
re-armed by a compare-and-swap against the flusher."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from agentloop.core import tracing
from agentloop.core.rows import aware, insert
from audit.events import record
from audit.failpoints import failpoint
from audit.models import EventKind
from conversations import addresses, console, control, loops, sql, windows
from conversations.ingest import spans
from conversations.ingest.double_texting import double_text
from conversations.ingest.refusal import refusal
from conversations.ingest.values import Admission, Arrival, Inbound, Unstorable
from conversations.media import files as media_files
from conversations.models import (
    BufferState,
    Contact,
    Conversation,
    ConversationState,
    Disposition,
    InboundMessage,
    MessageBuffer,
    MessageKind,
    Turn,
)
from delivery import ledger
from delivery.models import OutboundKind
from tools import confirmations

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from conversations.models import Channel

M = TypeVar("M", bound=MessageBuffer)

log = logging.getLogger("conversations.ingest")  # the name it had as one module

OVERFLOW_NOTICE = _("You've sent more than I can keep up with. I'll answer what I have so far; "
                    "please send the rest again once I've replied.")


def admit(channel: Channel, inbound: Inbound, now: datetime | None = None, *, batched: bool = False,
          known: Conversation | None = None) -> Admission:
    """Admit one message. The whole admission is one transaction with no effect outside
    the database, so a deadlock (PostgreSQL rolls the loser back whole) is retried.
    Raises Unstorable for a message the database cannot store as given.

    `batched`: inside admit_many's shared transaction, without savepoints of its own
    (see there); an error is then not retried here but fails the batch. `known`: its
    conversation, already locked and read (or created) by this transaction.

    Traced (agentloop.core.tracing), its span is started here, unless the caller's
    (admit_many's) already is: the inbound then carries its traceparent."""
    if inbound.traceparent is not None or not tracing.on():
        return _admit_once(channel, inbound, now, batched=batched, known=known)
    span, inbound = spans.start(channel, inbound)
    try:
        admission = _admit_once(channel, inbound, now, batched=batched, known=known)
    except Exception as exc:
        spans.end(span, exc)
        raise
    spans.end(span, admission)
    return admission


def _admit_once(channel: Channel, inbound: Inbound, now: datetime | None, *, batched: bool,
                known: Conversation | None) -> Admission:
    problem = refusal(inbound)
    if problem:
        raise Unstorable(problem)
    created = known
    for attempt in range(1, 4):
        try:
            admission = _admit(channel, inbound, now or timezone.now(), created, savepoint=not batched)
        except OperationalError as exc:
            if batched or attempt == 3 or not _retryable(exc):
                raise
            log.warning("admission of %s retried after: %s", inbound.platform_message_id, exc)
            created = None
            continue
        if admission is not None:
            return admission
        # Its first message: create, then admit. Inside a batch's transaction the row just
        # created is this transaction's alone until it commits (no buffer, no turn): the
        # admission need not read it back (a group-committed batch of new chats, one
        # statement fewer each).
        nested = transaction.get_connection().in_atomic_block
        created = _create_conversation(channel, inbound, savepoint=not batched)
        if not nested:
            created = None
    raise RuntimeError("conversation vanished while admitting a message")


# PostgreSQL: deadlock_detected, serialization_failure.
RETRYABLE = ("40P01", "40001")


def _retryable(exc: BaseException) -> bool:
    """A deadlock or serialization failure (PostgreSQL): only this transaction lost, not
    the database going away. `admit` retries it; in a batch it fails the batch's
    transaction, whose messages are then admitted one by one (each retried)."""
    return getattr(exc.__cause__, "sqlstate", None) in RETRYABLE


def _admit(channel: Channel, inbound: Inbound, now: datetime, created: Conversation | None = None,
           savepoint: bool = True) -> Admission | None:
    with transaction.atomic(savepoint=savepoint):
        admission = _admit_in_transaction(channel, inbound, now, created)
        if admission is not None and not admission.duplicate:
            if inbound.address:
                addresses.remember(channel.pk, inbound.chat_id, inbound.address)
            console.message_admitted(channel, admission.conversation_id, inbound, admission,
                                     f"[{inbound.media_type}] {inbound.text}" if inbound.media_type else inbound.text)
        return admission


def _admit_in_transaction(channel: Channel, inbound: Inbound, now: datetime,
                          created: Conversation | None = None) -> Admission | None:
    """`_admit`'s work, inside its transaction. `created`: the conversation, when this
    transaction has just created it (nothing else can have touched it)."""
    conversation = created if created is not None else _conversation_with_state(channel, inbound)
    if conversation is None:
        return None
    if inbound.language and inbound.language[:16] != conversation.language:
        _language_changed(conversation, inbound.language[:16])
    if conversation.state == ConversationState.PERSON:
        # A person holds it (conversations.handoff): stored and shown, never a turn, a
        # command's answer or any other text from us — whatever arrives.
        return _held(Arrival(channel, conversation, inbound, now))
    if inbound.is_bot:
        bot = _from_a_bot(Arrival(channel, conversation, inbound, now))
        if bot is not None:
            return bot
    arrival = Arrival(channel, conversation, inbound, now)
    command, answer, overflow = _aside(arrival)
    running = conversation.running_turn_id
    # The open buffer comes with the conversation, so the message is stored with it
    # in one statement; with a turn running the strategy decides first.
    buffer = None if (command or answer or running or overflow) else _known_open_buffer(conversation)
    # No buffer open and none needed first: the message's new buffer is inserted before
    # it, so the message is stored in it (not stored, then moved by an UPDATE).
    fresh = None
    if not (command or answer or running or overflow) and buffer is None:
        buffer = fresh = _new_buffer(arrival, None)
    message = _store_once(arrival, command, buffer,
                          Disposition.CONTROL if answer else Disposition.OVERFLOW if overflow else Disposition.BUFFERED)
    if message is None:
        if fresh is not None:  # a duplicate (rare): the buffer made for it goes again
            MessageBuffer.objects.filter(pk=fresh.pk).delete()
        return Admission(duplicate=True, conversation_id=conversation.pk)
    failpoint("inbound.after_insert")
    admission = Admission(duplicate=False, conversation_id=conversation.pk, message_id=message.pk)
    return _placed(admission, arrival, message, command, answer, overflow, buffer, fresh)


def _aside(arrival: Arrival) -> tuple[str | None, confirmations.PendingAnswer | None, bool]:
    """What takes a message outside the buffer: (a control command, the answer to an open
    question, whether the conversation is past its pending limit)."""
    inbound, conversation = arrival.inbound, arrival.conversation
    command = control.parse(inbound.text) if not inbound.media_type else None
    # "yes"/"no" to an open question, on a channel without buttons: the answer, not a message
    # for the agent (tools.confirmations); stored like a control command, outside any buffer.
    answer = None if (command or inbound.media_type) else confirmations.answer_from_text(
        arrival.channel, conversation, inbound.text)
    # A conversation with this many messages waiting takes no more into its buffer: the
    # message is stored (and audited), and the sender told once per episode.
    overflow = not command and not answer and (
        conversation.open_buffer_count or 0) >= settings.AGENTLOOP_MAX_PENDING_MESSAGES
    return command, answer, overflow


def _placed(admission: Admission, arrival: Arrival, message: InboundMessage, command: str | None,
            answer: confirmations.PendingAnswer | None, overflow: bool, buffer: MessageBuffer | None,
            fresh: MessageBuffer | None) -> Admission:
    """The stored message's way on: an answer, a command, an overflow, or the buffer (`fresh`:
    the buffer made for it; `buffer`: the open one it joined, or None with a turn running)."""
    channel, conversation, now = arrival.channel, arrival.conversation, arrival.now
    running = conversation.running_turn_id
    if answer:
        answer.take(message)  # decided once this admission commits
        admission.disposition = Disposition.CONTROL
        return admission
    if command:
        control.handle(conversation, message, command, now)
        admission.disposition = Disposition.CONTROL
        return admission
    if overflow:
        _overflowed(conversation, message)
        admission.disposition = Disposition.OVERFLOW
        return admission
    carried = None
    if running is not None:
        outcome = double_text(channel, conversation, Turn(pk=running), message, now)
        if outcome == "rejected":
            admission.disposition = Disposition.REJECTED
            return admission
        carried = running if outcome == "interrupted" else None
        buffer = _first(MessageBuffer.objects.filter(conversation=conversation, state=BufferState.OPEN))
    return _buffered(admission, _rearm(arrival, buffer, message, carried) if fresh is None else fresh)


def _held(arrival: Arrival) -> Admission:
    message = _store_once(arrival, None, None, Disposition.HELD)
    if message is None:
        return Admission(duplicate=True, conversation_id=arrival.conversation.pk)
    admission = Admission(duplicate=False, conversation_id=arrival.conversation.pk, message_id=message.pk)
    admission.disposition = Disposition.HELD
    return admission


def _from_a_bot(arrival: Arrival) -> Admission | None:
    """A bot's message (conversations.loops): kept as context if the channel does not allow
    the bot; held if its conversation is paused now by the loop breaker; else None (admitted
    as a person's)."""
    if not loops.bot_allowed(arrival.channel, arrival.inbound):
        message = _store_once(arrival, None, None, Disposition.BOT)
        if message is None:
            return Admission(duplicate=True, conversation_id=arrival.conversation.pk)
        loops.bot_ignored(arrival.conversation, message)
        return Admission(duplicate=False, conversation_id=arrival.conversation.pk, message_id=message.pk,
                         disposition=Disposition.BOT)
    if loops.breaks_the_loop(arrival.conversation, arrival.now):
        return _held(arrival)
    return None


def _buffered(admission: Admission, buffer: MessageBuffer) -> Admission:
    admission.disposition = Disposition.BUFFERED
    admission.buffer_id = buffer.pk
    admission.flush_at = buffer.flush_at
    admission.planned_reason = buffer.planned_reason
    admission.window_kind = buffer.window_kind
    admission.window_seconds = buffer.window_seconds
    return admission


def _first(queryset: QuerySet[M]) -> M | None:
    """The first row or None, without .first()'s ORDER BY (at most one row matches)."""
    rows = list(queryset[:1])
    return rows[0] if rows else None


def _conversation_with_state(channel: Channel, inbound: Inbound) -> Conversation | None:
    lookup = {"channel": channel, "chat_id": inbound.chat_id, "sender_id": inbound.sender_id}
    if connection.features.has_select_for_update:
        # Lock first, read after: a statement that waited for the lock would otherwise
        # see the buffer as it was before the previous holder committed (PostgreSQL
        # re-checks only the locked row). SQLite's BEGIN IMMEDIATE already serialises.
        # Nothing locked means nothing to read: it may appear (committed by a concurrent
        # first message) between the two statements, and must not be used unlocked.
        # NO KEY UPDATE: admissions of one conversation exclude each other, but a flusher
        # inserting a turn (a foreign-key share lock on this row) is not blocked — it
        # may hold a buffer row this admission waits for, which would be a deadlock.
        if not Conversation.objects.select_for_update(no_key=True).filter(**lookup).values_list("pk"):
            return None
    row = sql.conversation_with_state(channel.pk, inbound.chat_id, inbound.sender_id)
    return None if row is None else _conversation_from_row(channel, row)


def _conversation_from_row(channel: Channel, row: sql.Row) -> Conversation:
    fields = dict(zip(sql.CONVERSATION_COLUMNS, row))
    conversation = Conversation(channel=channel, **{**fields, "is_group": bool(fields["is_group"]),
                                                    "context_reset_at": aware(fields["context_reset_at"])})
    conversation._state.adding, conversation._state.db = False, connection.alias
    (conversation.open_buffer_id, first_at, conversation.open_buffer_count, conversation.open_buffer_album,
     conversation.running_turn_id) = row[len(fields):len(fields) + 5]
    conversation.open_buffer_first_at = aware(first_at)
    return conversation


def _known_open_buffer(conversation: Conversation) -> MessageBuffer | None:
    if conversation.open_buffer_id is None:
        return None
    # With an open buffer's id, the row carried its other columns too (none is None).
    return MessageBuffer(pk=conversation.open_buffer_id, conversation=conversation, state=BufferState.OPEN,  # type: ignore[misc]
                         first_message_at=conversation.open_buffer_first_at,
                         message_count=conversation.open_buffer_count, last_album_id=conversation.open_buffer_album)


def open_conversation(channel: Channel, inbound: Inbound) -> Conversation:
    """The conversation this sender's messages go to, created if new (the web chat
    opens it before the first message, to listen to it)."""
    _create_conversation(channel, inbound)
    conversation: Conversation = Conversation.objects.get(channel=channel, chat_id=inbound.chat_id,
                                                          sender_id=inbound.sender_id)
    return conversation


def _create_conversation(channel: Channel, inbound: Inbound, savepoint: bool = True) -> Conversation | None:
    """A conversation's first message creates it in a short transaction of its own, so
    concurrent first messages race only on these two unique rows, never while holding
    the locks of an admission. INSERT … ON CONFLICT DO NOTHING settles that race (what
    get_or_create did with a savepoint, a SELECT and an INSERT for each row, through
    the ORM: most of the admission of a new conversation's first message).
    `savepoint=False`: inside a batch's transaction (admit_many)."""
    with transaction.atomic(savepoint=savepoint):
        contact = Contact(channel=channel, platform_id=inbound.sender_id,
                          display_name=inbound.sender_name[:200], username=inbound.username[:100],
                          language=inbound.language[:16])
        if not insert(contact, ("channel_id", "platform_id")):
            contact.pk = Contact.objects.filter(channel=channel, platform_id=inbound.sender_id).values_list(
                "pk", flat=True).get()
        conversation = Conversation(channel=channel, chat_id=inbound.chat_id, sender_id=inbound.sender_id,
                                    contact_id=contact.pk, is_group=inbound.is_group, language=inbound.language[:16])
        if not insert(conversation, ("channel_id", "chat_id", "sender_id")):
            return None  # created meanwhile by another admission: read as it stands
    conversation.open_buffer_id = conversation.open_buffer_first_at = conversation.running_turn_id = None
    conversation.open_buffer_count, conversation.open_buffer_album = 0, ""
    return conversation


def _language_changed(conversation: Conversation, language: str) -> None:
    """The person's platform language is new (they changed it, or were first seen before
    languages were kept): the contact and each of its conversations take it. Two UPDATEs,
    only when it differs: the row read for every message already carries it."""
    conversation.language = language
    Contact.objects.filter(pk=conversation.contact_id).update(language=language)
    Conversation.objects.filter(contact_id=conversation.contact_id).update(language=language)


def _overflowed(conversation: Conversation, message: InboundMessage) -> None:
    """Audit a message kept out of the full buffer; the first of an episode (the buffer's
    first, by compare-and-swap) also gets the notice."""
    first = MessageBuffer.objects.filter(pk=conversation.open_buffer_id, overflow_noticed=False).update(
        overflow_noticed=True)
    if first:
        ledger.enqueue(conversation, OVERFLOW_NOTICE, kind=OutboundKind.NOTICE,
                       reply_target=message.reply_target, thread_id=message.thread_id)
    record(EventKind.MESSAGE_OVERFLOWED, conversation=conversation, target=f"message {message.pk}",
           actor=conversation.sender_id, summary=message.text[:200],
           pending=conversation.open_buffer_count, noticed=bool(first))


def _store_once(arrival: Arrival, command: str | None, buffer: MessageBuffer | None,
                disposition: str = Disposition.BUFFERED) -> InboundMessage | None:
    """Insert the message under its unique constraint; None when it was already admitted.
    Inserting first is the dedup: a retry, a resume or a re-polled batch all stop here."""
    message = _message(arrival, command, buffer, disposition)
    return message if _insert_unless_admitted(message) else None


def _message(arrival: Arrival, command: str | None, buffer: MessageBuffer | None,
             disposition: str = Disposition.BUFFERED) -> InboundMessage:
    inbound = arrival.inbound
    kind = MessageKind.MEDIA if inbound.media_type else MessageKind.TEXT
    if command:
        kind = MessageKind.CONTROL
    return InboundMessage(
        channel=arrival.channel, conversation=arrival.conversation, buffer=buffer, disposition=disposition,
        platform_message_id=inbound.platform_message_id, kind=kind,
        text=inbound.text, media_type=inbound.media_type, album_id=inbound.album_id,
        sender_name=inbound.sender_name[:200], reply_target=inbound.reply_target, mentioned=inbound.mentioned,
        thread_id=inbound.thread_id, sent_at=inbound.sent_at, received_at=arrival.now,
        traceparent=inbound.traceparent, from_bot=True if inbound.is_bot else None,
        # Its file's row, written now (in this transaction); fetched later by a worker.
        media_file_id=media_files.file_id_for(arrival.channel, inbound.media, arrival.now) if inbound.media else None,
    )


def _insert_unless_admitted(message: InboundMessage) -> bool:
    return insert(message, ("channel_id", "platform_message_id"))


def _rearm(arrival: Arrival, buffer: MessageBuffer | None, message: InboundMessage,
           carried: int | None) -> MessageBuffer:
    """Add the message to the conversation's open buffer (or a new one) and re-plan
    its deadline from this latest message."""
    if buffer is not None:
        fields = _planned(arrival, buffer.first_message_at, counted(buffer, arrival.inbound), carried)
        # Compare-and-swap: the flusher may have claimed this buffer since we read it (it
        # does not lock the conversation); its turn was then made without this message,
        # which starts the next buffer instead.
        if sql.update_open_buffer(buffer.pk, fields):
            for name, value in fields.items():
                setattr(buffer, name, value)
        else:
            buffer = _reread_open_buffer(arrival, carried)
    if buffer is None:
        buffer = _new_buffer(arrival, carried)
    if message.buffer_id != buffer.pk:
        _set_buffer(message, buffer)
    return buffer


def _new_buffer(arrival: Arrival, carried: int | None) -> MessageBuffer:
    fields = _planned(arrival, arrival.now, 1, carried)
    buffer = MessageBuffer(conversation=arrival.conversation, first_message_at=arrival.now, **fields)
    insert(buffer)
    return buffer


def _set_buffer(message: InboundMessage, buffer: MessageBuffer) -> None:
    """The message joins `buffer` (plain SQL: the ORM's update cost more than the statement)."""
    sql.set_buffer(message.pk, buffer.pk)
    message.buffer_id = buffer.pk


def _reread_open_buffer(arrival: Arrival, carried: int | None) -> MessageBuffer | None:
    """After a lost compare-and-swap: the open buffer the flusher may have just made for a
    burst's remainder (flushing._keep_the_rest_waiting), re-armed with this message; None
    when there is none (the caller creates one)."""
    buffer: MessageBuffer | None = _first(MessageBuffer.objects.filter(conversation=arrival.conversation,
                                                                       state=BufferState.OPEN))
    if buffer is None:
        return None
    fields = _planned(arrival, buffer.first_message_at, counted(buffer, arrival.inbound), carried)
    if not sql.update_open_buffer(buffer.pk, fields):
        return None
    for name, value in fields.items():
        setattr(buffer, name, value)
    return buffer


def counted(buffer: MessageBuffer, inbound: Inbound | InboundMessage) -> int:
    """The buffer's message count with this message: an album's next item adds nothing."""
    same_album = bool(inbound.album_id) and inbound.album_id == buffer.last_album_id
    return buffer.message_count + (0 if same_album else 1)


def latest(message: Inbound | InboundMessage) -> windows.Latest:
    """What a message (an Inbound or a stored InboundMessage) gives the window to plan by."""
    return windows.Latest(message.text, media=bool(message.media_type), album=bool(message.album_id))


def _planned(arrival: Arrival, first_at: datetime, count: int, carried: int | None) -> dict[str, Any]:
    channel, inbound, now = arrival.channel, arrival.inbound, arrival.now
    plan = windows.plan_flush(latest(inbound), now=now, first_message_at=first_at, message_count=count,
                              settings=channel.debounce_settings())
    fields: dict[str, Any] = {"message_count": count, "last_message_at": now, "flush_at": plan.flush_at,
              "planned_reason": plan.reason, "window_kind": plan.window_kind, "window_seconds": plan.window_seconds,
              "last_album_id": inbound.album_id}
    if carried is not None:
        fields["carried_turn_id"] = carried
    return fields
