"""Admitting one inbound message: durable dedup, then the buffer (or a control command,
or the channel's double-texting strategy when a turn is running).

Everything for one message happens in one transaction, with the conversation row
locked, so concurrent messages of a conversation are applied one after the other
(PostgreSQL: SELECT … FOR UPDATE; SQLite: BEGIN IMMEDIATE serialises writers).
"""

import functools
import logging
import re
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from agentloop.core.rows import (
    aware,
    in_params,
    in_sql,
    insert_many,
    placeholders,
    postgresql,
    records,
    recordset,
    table,
)
from audit.events import record
from audit.failpoints import failpoint
from audit.models import EventKind
from conversations import console, control, turns, windows
from conversations.models import (
    BufferState,
    Contact,
    Conversation,
    Disposition,
    DoubleTexting,
    InboundMessage,
    MessageBuffer,
    MessageKind,
    Turn,
    TurnState,
)
from delivery import ledger
from delivery.models import OutboundKind
from tools import confirmations

log = logging.getLogger(__name__)

REJECT_NOTICE = "I'm still working on your previous message. Please send this again once I've answered."
OVERFLOW_NOTICE = ("You've sent more than I can keep up with. I'll answer what I have so far; "
                   "please send the rest again once I've replied.")
# Longest text admitted (the inbound API's limit; Telegram's own is 4096).
MAX_TEXT_CHARS = 20000


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


class Unstorable(ValueError):
    """A message the database cannot store as given. Refused alone: its caller answers or
    skips it (and audits the refusal), never retries it."""


# PostgreSQL refuses NUL in text; no database can encode an unpaired UTF-16 surrogate
# (JSON's "\ud800" decodes to one).
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")


@functools.cache
def _field_limits():
    """Fields of an Inbound stored in columns of bounded length, and those lengths."""
    column = {"platform_message_id": (InboundMessage, "platform_message_id"), "chat_id": (Conversation, "chat_id"),
              "sender_id": (Conversation, "sender_id"), "reply_target": (InboundMessage, "reply_target"),
              "thread_id": (InboundMessage, "thread_id"), "media_type": (InboundMessage, "media_type")}
    limits = {name: model._meta.get_field(field).max_length for name, (model, field) in column.items()}
    return {**limits, "text": MAX_TEXT_CHARS}


def refusal(inbound: Inbound) -> str:
    """Why this message cannot be stored, or "" when it can."""
    limits = _field_limits()
    for name in ("platform_message_id", "chat_id", "sender_id", "text", "sender_name", "username",
                 "media_type", "thread_id", "reply_target"):
        value = getattr(inbound, name)
        found = _UNSTORABLE_CHARACTER.search(value)
        if found:
            what = "a NUL character" if found.group() == "\x00" else "an unpaired surrogate"
            return f"{name} contains {what} (U+{ord(found.group()):04X}), which cannot be stored"
        if name in limits and len(value) > limits[name]:
            return f"{name} is {len(value)} characters long; at most {limits[name]} can be stored"
    return ""


def printable(value: str, limit: int = 100) -> str:
    """`value` safe to store in an audit row: unstorable characters escaped, cut to `limit`."""
    return _UNSTORABLE_CHARACTER.sub(lambda m: f"\\u{ord(m.group()):04x}", value)[:limit]


def record_refusal(channel, inbound: Inbound, reason: str, source: str):
    """Audit a refused message (it has no row of its own to show)."""
    record(EventKind.MESSAGE_REFUSED, channel_slug=channel.slug, actor=printable(inbound.sender_id),
           target=f"message {printable(inbound.platform_message_id, 150)}", summary=f"{source}: {reason}")
    log.warning("channel %s: refused message %s from %s: %s", channel.slug,
                printable(inbound.platform_message_id), source, reason)


def admit(channel, inbound: Inbound, now: datetime | None = None, *, batched=False, known=None) -> Admission:
    """Admit one message. The whole admission is one transaction with no effect outside
    the database, so a deadlock (PostgreSQL rolls the loser back whole) is retried.
    Raises Unstorable for a message the database cannot store as given.

    `batched`: inside admit_many's shared transaction, without savepoints of its own
    (see there); an error is then not retried here but fails the batch. `known`: its
    conversation, already locked and read (or created) by this transaction."""
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


class BatchFailed(Exception):
    """The shared transaction of a batch of admissions failed as a whole."""


def admit_many(requests, is_fault) -> list:
    """Admit several messages in one transaction (group commit: one BEGIN, one commit
    for all of them). Returns, in order, an Admission or the exception of each; none is
    committed before this returns, so answer none before.

    The admissions share the transaction without savepoints: on PostgreSQL a savepoint
    and its release are two round trips each, and an admission took two of them (the
    new conversation, the message): a new chat's message in a batch was 14 round trips
    and is 5 (tests.bench.statements). One that fails the database's way leaves the
    transaction unusable: the batch is rolled back and every message admitted again on
    its own (its own transaction, savepoints, retries), so one bad admission still fails
    alone. An error raised before any statement (Unstorable) is that admission's alone,
    and the others go on.

    An error for which `is_fault(exc)` is true (the database went away, SQLite's lock
    timed out) fails the whole batch: it is raised. A deadlock is not raised (only this
    transaction lost): the batch is admitted again one by one, as above. So is a commit
    refused (a deferred foreign key: a channel deleted since it was cached)."""
    results = []
    try:
        with transaction.atomic():
            ahead = _admit_ahead(requests, timezone.now()) if postgresql() and len(requests) > 1 else {}
            for i, (channel, inbound) in enumerate(requests):
                done = ahead.get(i)
                if isinstance(done, Admission):
                    results.append(done)
                    continue
                try:
                    results.append(admit(channel, inbound, batched=True, known=done))
                except Exception as exc:
                    if is_fault(exc) and not _retryable(exc):
                        raise
                    if transaction.get_connection().needs_rollback:
                        raise BatchFailed() from exc
                    results.append(exc)
    except Exception as exc:
        if is_fault(exc) and not _retryable(exc):
            raise
        return [_admit_alone(channel, inbound, is_fault) for channel, inbound in requests]
    return results


def _retryable(exc) -> bool:
    """A deadlock or serialization failure (PostgreSQL): only this transaction lost, not
    the database going away. `admit` retries it; in a batch it fails the batch's
    transaction, whose messages are then admitted one by one (each retried)."""
    return getattr(exc.__cause__, "sqlstate", None) in RETRYABLE


def _admit_alone(channel, inbound, is_fault):
    try:
        return admit(channel, inbound)
    except Exception as exc:
        if is_fault(exc):
            raise
        return exc


def _admit_ahead(requests, now) -> dict:
    """PostgreSQL, inside admit_many's transaction, before its admissions one by one: the
    statements the batch's messages have in common, run once for the batch, its rows as
    one JSON parameter (tests.bench.statements: a batch of 32 new chats was 5 statements
    a message, and is 7 in all). Returns {index in requests: what was done for it}:

    - its conversation exists: locked (all of them in one statement, in the batch's
      order, which is every batch's: lean_ingest sorts them), then read with its open
      buffer and running turn (one more); that admission goes on from there.
    - it does not: created (contacts, then conversations: a statement each), and, for a
      plain message, its buffer and the message inserted (a statement each): that
      Admission is complete. A conversation another admission created meanwhile is not
      in the result: its message is admitted one by one, as before.

    Only a conversation's first message in the batch: its next one must see what the
    first did. A message refused as unstorable is left to `admit`, which refuses it."""
    firsts = {}
    for i, (channel, inbound) in enumerate(requests):
        if not refusal(inbound):
            firsts.setdefault((channel.pk, inbound.chat_id, inbound.sender_id), i)
    if not firsts:
        return {}
    channels = {channel.pk: channel for channel, _ in requests}
    ahead = {firsts[key]: conversation for key, conversation in _lock_and_read(firsts, channels).items()}
    created = _create_conversations(requests, [i for i in firsts.values() if i not in ahead])
    ahead.update(created)
    ahead.update(_admit_first_messages(requests, created, now))
    return ahead


def _lock_and_read(firsts, channels) -> dict:
    """{(channel id, chat, sender): Conversation with its state} of the keys that exist:
    locked first, then read (see _conversation_with_state for why in that order)."""
    keys = list(firsts)
    source = recordset("k", [("channel_id", "bigint"), ("chat_id", "text"), ("sender_id", "text"), ("n", "int")])
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id FROM {table(Conversation)} c JOIN {source} ON c.channel_id = k.channel_id "
            f"AND c.chat_id = k.chat_id AND c.sender_id = k.sender_id ORDER BY k.n FOR NO KEY UPDATE OF c",
            [records(("channel_id", "chat_id", "sender_id", "n"), [(*key, n) for n, key in enumerate(keys)])])
        ids = [row[0] for row in cursor.fetchall()]
        if not ids:
            return {}
        cursor.execute(_conversation_with_state_sql(in_sql("c.id", len(ids))),
                       [TurnState.RUNNING, BufferState.OPEN, *in_params(ids)])
        rows = cursor.fetchall()
    found = {}
    for row in rows:
        conversation = _conversation_from_row(channels[row[-1]], row)
        found[(row[-1], conversation.chat_id, conversation.sender_id)] = conversation
    return found


def _create_conversations(requests, indexes) -> dict:
    """{index: Conversation} of the conversations this transaction created, for the
    first messages at `indexes` (none of them exists yet); two statements (three when a
    contact exists already: a sender seen in another chat)."""
    if not indexes:
        return {}
    contacts = {}
    for i in indexes:
        channel, inbound = requests[i]
        contacts.setdefault((channel.pk, inbound.sender_id), Contact(
            channel=channel, platform_id=inbound.sender_id, display_name=inbound.sender_name[:200],
            username=inbound.username[:100]))
    # In key order, as every batch inserts them: two batches inserting the same new
    # contacts wait for each other's (unique index) in one order, never in a cycle.
    contact_ids = {(channel_id, platform_id): pk for pk, channel_id, platform_id in insert_many(
        Contact, [contacts[key] for key in sorted(contacts)], ("channel_id", "platform_id"),
        ("id", "channel_id", "platform_id"))}
    known = [key for key in contacts if key not in contact_ids]
    if known:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT c.id, c.channel_id, c.platform_id FROM {table(Contact)} c "
                f"JOIN {recordset('k', [('channel_id', 'bigint'), ('platform_id', 'text')])} "
                f"ON c.channel_id = k.channel_id AND c.platform_id = k.platform_id",
                [records(("channel_id", "platform_id"), known)])
            contact_ids.update({(channel_id, platform_id): pk for pk, channel_id, platform_id in cursor.fetchall()})
    conversations = {}
    for i in indexes:
        channel, inbound = requests[i]
        conversations[i] = Conversation(channel=channel, chat_id=inbound.chat_id, sender_id=inbound.sender_id,
                                        contact_id=contact_ids[(channel.pk, inbound.sender_id)],
                                        is_group=inbound.is_group)
    inserted = {tuple(key): pk for pk, *key in insert_many(
        Conversation, conversations.values(), ("channel_id", "chat_id", "sender_id"),
        ("id", "channel_id", "chat_id", "sender_id"))}
    created = {}
    for i, conversation in conversations.items():
        pk = inserted.get((conversation.channel_id, conversation.chat_id, conversation.sender_id))
        if pk is None:
            continue  # created meanwhile by another admission: admitted one by one
        conversation.pk = pk
        conversation._state.adding, conversation._state.db = False, connection.alias
        conversation.open_buffer_id = conversation.open_buffer_first_at = conversation.running_turn_id = None
        conversation.open_buffer_count = 0
        created[i] = conversation
    return created


def _admit_first_messages(requests, created, now) -> dict:
    """{index: Admission} of the plain messages that open the conversations this
    transaction created: a buffer each, then the messages, a statement each. A control
    command or an answer to a question (neither can be plain here) is left to `admit`,
    as is a second message with the same platform id in this batch."""
    plain, seen = {}, set()
    for i, conversation in created.items():
        channel, inbound = requests[i]
        if (channel.pk, inbound.platform_message_id) in seen:
            continue
        if not inbound.media_type and (control.parse(inbound.text)
                                       or confirmations.answer_from_text(channel, conversation, inbound.text)):
            continue
        seen.add((channel.pk, inbound.platform_message_id))
        plain[i] = MessageBuffer(conversation=conversation, first_message_at=now,
                                 **_planned(channel, inbound, now, now, 1, None))
    if not plain:
        return {}
    buffer_ids = {conversation_id: pk for pk, conversation_id in insert_many(
        MessageBuffer, plain.values(), returning=("id", "conversation_id"))}
    messages = {}
    for i, buffer in plain.items():
        buffer.pk = buffer_ids[buffer.conversation_id]
        buffer._state.adding, buffer._state.db = False, connection.alias
        channel, inbound = requests[i]
        messages[i] = _message(channel, created[i], inbound, now, None, buffer)
    stored = {(channel_id, platform_id): pk for pk, channel_id, platform_id in insert_many(
        InboundMessage, messages.values(), ("channel_id", "platform_message_id"),
        ("id", "channel_id", "platform_message_id"))}
    admissions, unused = {}, []
    for i, message in messages.items():
        channel, inbound = requests[i]
        message.pk = stored.get((channel.pk, inbound.platform_message_id))
        if message.pk is None:  # admitted before (rare): its buffer goes again
            unused.append(plain[i].pk)
            admissions[i] = Admission(duplicate=True, conversation_id=created[i].pk)
            continue
        failpoint("inbound.after_insert")
        admissions[i] = admission = _buffered(
            Admission(duplicate=False, conversation_id=created[i].pk, message_id=message.pk), plain[i])
        console.message_admitted(channel, created[i].pk, inbound, admission,
                                 f"[{inbound.media_type}] {inbound.text}" if inbound.media_type else inbound.text)
    if unused:
        MessageBuffer.objects.filter(pk__in=unused).delete()
    return admissions


def _admit(channel, inbound, now, created=None, savepoint=True):
    with transaction.atomic(savepoint=savepoint):
        admission = _admit_in_transaction(channel, inbound, now, created)
        if admission is not None and not admission.duplicate:
            console.message_admitted(channel, admission.conversation_id, inbound, admission,
                                     f"[{inbound.media_type}] {inbound.text}" if inbound.media_type else inbound.text)
        return admission


def _admit_in_transaction(channel, inbound, now, created=None):
    """`_admit`'s work, inside its transaction. `created`: the conversation, when this
    transaction has just created it (nothing else can have touched it)."""
    command = control.parse(inbound.text) if not inbound.media_type else None
    conversation = created if created is not None else _conversation_with_state(channel, inbound)
    if conversation is None:
        return None
    running = conversation.running_turn_id
    # "yes"/"no" to an open question, on a channel without buttons: the answer, not a message
    # for the agent (tools.confirmations); stored like a control command, outside any buffer.
    answer = None if (command or inbound.media_type) else confirmations.answer_from_text(
        channel, conversation, inbound.text)
    # A conversation with this many messages waiting takes no more into its buffer: the
    # message is stored (and audited), and the sender told once per episode.
    overflow = not command and not answer and (
        conversation.open_buffer_count or 0) >= settings.AGENTLOOP_MAX_PENDING_MESSAGES
    # The open buffer comes with the conversation, so the message is stored with it
    # in one statement; with a turn running the strategy decides first.
    buffer = None if (command or answer or running or overflow) else _known_open_buffer(conversation)
    # No buffer open and none needed first: the message's new buffer is inserted before
    # it, so the message is stored in it (not stored, then moved by an UPDATE).
    fresh = None
    if not (command or answer or running or overflow) and buffer is None:
        buffer = fresh = _new_buffer(channel, conversation, inbound, now, None)
    message = _store_once(channel, conversation, inbound, now, command, buffer,
                          Disposition.CONTROL if answer else Disposition.OVERFLOW if overflow else Disposition.BUFFERED)
    if message is None:
        if fresh is not None:  # a duplicate (rare): the buffer made for it goes again
            MessageBuffer.objects.filter(pk=fresh.pk).delete()
        return Admission(duplicate=True, conversation_id=conversation.pk)
    failpoint("inbound.after_insert")
    admission = Admission(duplicate=False, conversation_id=conversation.pk, message_id=message.pk)
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
        outcome = _double_text(channel, conversation, Turn(pk=running), message, now)
        if outcome == "rejected":
            admission.disposition = Disposition.REJECTED
            return admission
        carried = running if outcome == "interrupted" else None
        buffer = _first(MessageBuffer.objects.filter(conversation=conversation, state=BufferState.OPEN))
    if fresh is None:
        buffer = _rearm(channel, conversation, buffer, message, inbound, now, carried)
    return _buffered(admission, buffer)


def _buffered(admission, buffer):
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


# Columns read from the conversation row, in this order, then the state columns.
_CONVERSATION_COLUMNS = ("id", "contact_id", "chat_id", "sender_id", "is_group", "context_reset_at")


@functools.lru_cache(maxsize=2)  # one conversation by its key; a batch's by their ids
def _conversation_with_state_sql(where="c.channel_id = %s AND c.chat_id = %s AND c.sender_id = %s"):
    """One statement for the hot path of every inbound message: the conversation, its
    open buffer, whether a turn runs (and its channel's id, for a batch's). Written as
    SQL because the ORM spent longer compiling the equivalent annotated query (1.3 ms)
    than the rest of the request."""
    conversation, buffer, turn = (m._meta.db_table for m in (Conversation, MessageBuffer, Turn))
    return (
        f"SELECT {', '.join('c.' + c for c in _CONVERSATION_COLUMNS)}, "
        f"b.id, b.first_message_at, b.message_count, "
        f"(SELECT t.id FROM {turn} t WHERE t.conversation_id = c.id AND t.state = %s LIMIT 1), c.channel_id "
        f"FROM {conversation} c LEFT JOIN {buffer} b ON b.conversation_id = c.id AND b.state = %s "
        f"WHERE {where}"
    )


def _conversation_with_state(channel, inbound):
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
    with connection.cursor() as cursor:
        cursor.execute(_conversation_with_state_sql(),
                       [TurnState.RUNNING, BufferState.OPEN, channel.pk, inbound.chat_id, inbound.sender_id])
        row = cursor.fetchone()
    return None if row is None else _conversation_from_row(channel, row)


def _conversation_from_row(channel, row):
    fields = dict(zip(_CONVERSATION_COLUMNS, row))
    conversation = Conversation(channel=channel, **{**fields, "is_group": bool(fields["is_group"]),
                                                    "context_reset_at": aware(fields["context_reset_at"])})
    conversation._state.adding, conversation._state.db = False, connection.alias
    conversation.open_buffer_id, first_at, conversation.open_buffer_count, conversation.running_turn_id = row[6:10]
    conversation.open_buffer_first_at = aware(first_at)
    return conversation


def _known_open_buffer(conversation):
    if conversation.open_buffer_id is None:
        return None
    return MessageBuffer(pk=conversation.open_buffer_id, conversation=conversation, state=BufferState.OPEN,
                         first_message_at=conversation.open_buffer_first_at,
                         message_count=conversation.open_buffer_count)


def open_conversation(channel, inbound) -> Conversation:
    """The conversation this sender's messages go to, created if new (the web chat
    opens it before the first message, to listen to it)."""
    _create_conversation(channel, inbound)
    return Conversation.objects.get(channel=channel, chat_id=inbound.chat_id, sender_id=inbound.sender_id)


def _create_conversation(channel, inbound, savepoint=True):
    """A conversation's first message creates it in a short transaction of its own, so
    concurrent first messages race only on these two unique rows, never while holding
    the locks of an admission. INSERT … ON CONFLICT DO NOTHING settles that race (what
    get_or_create did with a savepoint, a SELECT and an INSERT for each row, through
    the ORM: most of the admission of a new conversation's first message).
    `savepoint=False`: inside a batch's transaction (admit_many)."""
    with transaction.atomic(savepoint=savepoint):
        contact = Contact(channel=channel, platform_id=inbound.sender_id,
                          display_name=inbound.sender_name[:200], username=inbound.username[:100])
        if not _insert(contact, ("channel_id", "platform_id")):
            contact.pk = Contact.objects.filter(channel=channel, platform_id=inbound.sender_id).values_list(
                "pk", flat=True).get()
        conversation = Conversation(channel=channel, chat_id=inbound.chat_id, sender_id=inbound.sender_id,
                                    contact_id=contact.pk, is_group=inbound.is_group)
        if not _insert(conversation, ("channel_id", "chat_id", "sender_id")):
            return None  # created meanwhile by another admission: read as it stands
    conversation.open_buffer_id = conversation.open_buffer_first_at = conversation.running_turn_id = None
    conversation.open_buffer_count = 0
    return conversation


def _overflowed(conversation, message):
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


def _store_once(channel, conversation, inbound, now, command, buffer, disposition=Disposition.BUFFERED):
    """Insert the message under its unique constraint; None when it was already admitted.
    Inserting first is the dedup: a retry, a resume or a re-polled batch all stop here."""
    message = _message(channel, conversation, inbound, now, command, buffer, disposition)
    return message if _insert_unless_admitted(message) else None


def _message(channel, conversation, inbound, now, command, buffer, disposition=Disposition.BUFFERED):
    kind = MessageKind.MEDIA if inbound.media_type else MessageKind.TEXT
    if command:
        kind = MessageKind.CONTROL
    return InboundMessage(
        channel=channel, conversation=conversation, buffer=buffer, disposition=disposition,
        platform_message_id=inbound.platform_message_id, kind=kind,
        text=inbound.text, media_type=inbound.media_type,
        sender_name=inbound.sender_name[:200], reply_target=inbound.reply_target,
        thread_id=inbound.thread_id, sent_at=inbound.sent_at, received_at=now,
    )


def _insert_unless_admitted(message) -> bool:
    return _insert(message, ("channel_id", "platform_message_id"))


@functools.lru_cache(maxsize=8)  # one entry per (model, conflict target) the code inserts
def _insert_sql(model, conflict):
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    on_conflict = f" ON CONFLICT ({', '.join(quote(c) for c in conflict)}) DO NOTHING" if conflict else ""
    sql = (
        f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({placeholders(len(fields))}){on_conflict} RETURNING {quote('id')}"
    )
    return sql, fields


def _insert(instance, conflict=()) -> bool:
    """INSERT [… ON CONFLICT (conflict) DO NOTHING] RETURNING id (SQLite ≥ 3.35 and
    PostgreSQL): one statement, no savepoint, and no exception to unwind for a
    duplicate; False when the row already existed. Plain SQL: on the hot path the ORM's
    save() cost more than the statement."""
    sql, fields = _insert_sql(type(instance), conflict)
    params = [f.get_db_prep_save(f.pre_save(instance, True), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    instance.pk = row[0]
    instance._state.adding, instance._state.db = False, connection.alias
    return True


def _double_text(channel, conversation, running, message, now):
    """Apply the channel's strategy to a message that arrived while `running` runs.
    Returns "rejected", "interrupted", "rolled_back" or "enqueued"."""
    strategy = channel.double_texting
    if strategy == DoubleTexting.REJECT:
        message.disposition = Disposition.REJECTED
        message.save(update_fields=["disposition"])
        ledger.enqueue(conversation, REJECT_NOTICE, kind=OutboundKind.NOTICE,
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
        if _update_if_open(buffer.pk, fields):
            for name, value in fields.items():
                setattr(buffer, name, value)
        else:
            buffer = _reread_open_buffer(channel, conversation, inbound, now, carried)
    if buffer is None:
        buffer = _new_buffer(channel, conversation, inbound, now, carried)
    if message.buffer_id != buffer.pk:
        _set_buffer(message, buffer)
    return buffer


def _new_buffer(channel, conversation, inbound, now, carried):
    fields = _planned(channel, inbound, now, now, 1, carried)
    buffer = MessageBuffer(conversation=conversation, first_message_at=now, **fields)
    _insert(buffer)
    return buffer


def _set_buffer(message, buffer):
    """The message joins `buffer` (plain SQL: the ORM's update cost more than the statement)."""
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {quote(InboundMessage._meta.db_table)} SET {quote('buffer_id')} = %s "
                       f"WHERE {quote('id')} = %s", [buffer.pk, message.pk])
    message.buffer_id = buffer.pk


def _reread_open_buffer(channel, conversation, inbound, now, carried):
    """After a lost compare-and-swap: the open buffer the flusher may have just made for a
    burst's remainder (engine._keep_the_rest_waiting), re-armed with this message; None
    when there is none (the caller creates one)."""
    buffer = _first(MessageBuffer.objects.filter(conversation=conversation, state=BufferState.OPEN))
    if buffer is None:
        return None
    fields = _planned(channel, inbound, now, buffer.first_message_at, buffer.message_count + 1, carried)
    if not _update_if_open(buffer.pk, fields):
        return None
    for name, value in fields.items():
        setattr(buffer, name, value)
    return buffer


def _update_if_open(buffer_id, fields) -> bool:
    """UPDATE … WHERE id = %s AND state = 'open', as plain SQL: on the hot path the ORM's
    compile of this one statement cost as much as running the whole transaction."""
    sql, columns = _update_if_open_sql(tuple(fields))
    params = [f.get_db_prep_save(value, connection) for f, value in zip(columns, fields.values())]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, buffer_id, BufferState.OPEN])
        return cursor.rowcount == 1


@functools.lru_cache(maxsize=8)  # one entry per set of fields the code updates
def _update_if_open_sql(names):
    quote = connection.ops.quote_name
    columns = [MessageBuffer._meta.get_field(name) for name in names]
    sql = (f"UPDATE {quote(MessageBuffer._meta.db_table)} SET "
           + ", ".join(f"{quote(f.column)} = %s" for f in columns)
           + f" WHERE {quote('id')} = %s AND {quote('state')} = %s")
    return sql, columns


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
