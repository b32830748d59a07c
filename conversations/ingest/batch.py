"""Admitting a batch (group commit): one transaction for all its messages, and the
statements they have in common run once for the batch (`_admit_ahead`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentloop.core import tracing
from agentloop.core.rows import insert_many
from audit.failpoints import failpoint
from conversations import addresses, console, control, sql
from conversations.ingest import spans
from conversations.ingest.admission import (
    _buffered,
    _conversation_from_row,
    _known_open_buffer,
    _message,
    _new_buffer,
    _planned,
    _reread_open_buffer,
    _retryable,
    _set_buffer,
    admit,
    counted,
)
from conversations.ingest.refusal import refusal
from conversations.ingest.values import Admission, Arrival, Inbound
from conversations.models import (
    Contact,
    Conversation,
    ConversationState,
    InboundMessage,
    MessageBuffer,
)
from tools import confirmations

if TYPE_CHECKING:
    from conversations.models import Channel

# One message to admit, from its channel.
Request = tuple["Channel", Inbound]
# Whether an error fails the whole batch (raised) rather than its admission alone.
IsFault = Callable[[BaseException], bool]
# A conversation's key: (channel id, chat id, sender id).
Key = tuple[int, str, str]


class BatchFailed(Exception):
    """The shared transaction of a batch of admissions failed as a whole."""


def admit_many(requests: Sequence[Request], is_fault: IsFault) -> list[Admission | Exception]:
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
    refused (a deferred foreign key: a channel deleted since it was cached).

    Traced (agentloop.core.tracing), each message's admission span starts here and ends
    once the batch has committed (or failed)."""
    if not tracing.on():
        return _admit_many(requests, is_fault)
    started = [spans.start(channel, inbound, len(requests)) for channel, inbound in requests]
    try:
        results = _admit_many([(channel, inbound) for (channel, _), (_, inbound) in zip(requests, started)],
                              is_fault)
    except Exception as exc:
        for span, _ in started:
            spans.end(span, exc)
        raise
    for (span, _), result in zip(started, results):
        spans.end(span, result)
    return results


def _admit_many(requests: Sequence[Request], is_fault: IsFault) -> list[Admission | Exception]:
    results: list[Admission | Exception] = []
    try:
        with transaction.atomic():
            ahead: dict[int, Admission | Conversation] = (
                _admit_ahead(requests, timezone.now()) if len(requests) > 1 else {})
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


def _admit_alone(channel: Channel, inbound: Inbound, is_fault: IsFault) -> Admission | Exception:
    try:
        return admit(channel, inbound)
    except Exception as exc:
        if is_fault(exc):
            raise
        return exc


def _admit_ahead(requests: Sequence[Request], now: datetime) -> dict[int, Admission | Conversation]:
    """Inside admit_many's transaction, before its admissions one by one: the statements
    the batch's messages have in common, run once for the batch, its rows as one JSON
    parameter (tests.bench.statements: a batch of 32 new chats was 5 statements a
    message, and is 7 in all, on either database). Returns {index in requests:
    what was done for it}:

    - its conversation exists: on PostgreSQL locked (all of them in one statement, in
      the batch's order, which is every batch's: lean_ingest sorts them), then read with
      its open buffer and running turn (one more; SQLite's transaction holds the write
      lock already: the read alone).
    - it does not: created (contacts, then conversations: a statement each).
    - a plain message (`_plain`) whose admission is the batch's to do (`_batched_way`:
      nobody holds the conversation, no turn runs there): stored in a new buffer, or in
      the open one, which is re-planned (_admit_plain: a statement each for the whole
      batch); that Admission is complete. Any other admission goes on from its
      conversation, one by one, as does the message of a conversation another
      admission created meanwhile.

    Only a conversation's first message in the batch: its next one must see what the
    first did. A message refused as unstorable is left to `admit`, which refuses it."""
    firsts: dict[Key, int] = {}
    for i, (channel, inbound) in enumerate(requests):
        if not refusal(inbound):
            firsts.setdefault((channel.pk, inbound.chat_id, inbound.sender_id), i)
    if not firsts:
        return {}
    channels = {channel.pk: channel for channel, _ in requests}
    known = {firsts[key]: conversation for key, conversation in _lock_and_read(firsts, channels).items()}
    created = _create_conversations(requests, [i for i in firsts.values() if i not in known])
    ways = {i: _batched_way(conversation, requests[i][1]) for i, conversation in known.items()}
    ways.update(dict.fromkeys(created, OPENS))
    plain = _plain(requests, {i: conversation for i, conversation in {**known, **created}.items() if ways[i]})
    ahead: dict[int, Admission | Conversation] = {**known, **created}
    ahead.update(_admit_plain(requests, {i: conversation for i, conversation in plain.items() if ways[i] == OPENS},
                              {i: conversation for i, conversation in plain.items() if ways[i] == JOINS}, now))
    return ahead


OPENS, JOINS = "opens", "joins"


def _batched_way(conversation: Conversation, inbound: Inbound) -> str | None:
    """How a plain message to an existing conversation is admitted in the batch's
    statements: it OPENS a buffer (none is open) or JOINS the open one; exactly what
    `admit` would do for it (_admit_in_transaction). None: `admit`'s, one by one — a
    person holds the conversation, a turn runs there (double texting decides), its
    language changed, its buffer is full."""
    if (conversation.state == ConversationState.PERSON or conversation.running_turn_id is not None
            or (inbound.language and inbound.language[:16] != conversation.language)):
        return None
    limit = settings.AGENTLOOP_MAX_PENDING_MESSAGES
    if conversation.open_buffer_id is None:
        return OPENS if limit > 0 else None
    return JOINS if (conversation.open_buffer_count or 0) < limit else None


def _plain(requests: Sequence[Request], candidates: dict[int, Conversation]) -> dict[int, Conversation]:
    """The candidates whose message is plain: not a bot's (conversations.loops decides
    that alone), not a control command nor an answer to an open question, and the first
    with its platform id in the batch."""
    plain, seen = {}, set()
    for i, conversation in candidates.items():
        channel, inbound = requests[i]
        if (channel.pk, inbound.platform_message_id) in seen or inbound.is_bot:
            continue
        if not inbound.media_type and (control.parse(inbound.text)
                                       or confirmations.answer_from_text(channel, conversation, inbound.text)):
            continue
        seen.add((channel.pk, inbound.platform_message_id))
        plain[i] = conversation
    return plain


def _lock_and_read(firsts: dict[Key, int], channels: dict[int, Channel]) -> dict[Key, Conversation]:
    """{(channel id, chat, sender): Conversation with its state} of the keys that exist:
    locked first, then read (see _conversation_with_state for why in that order)."""
    rows = sql.lock_and_read_conversations(list(firsts))
    found: dict[Key, Conversation] = {}
    for row in rows:
        conversation = _conversation_from_row(channels[row[-1]], row)
        found[(row[-1], conversation.chat_id, conversation.sender_id)] = conversation
    return found


def _create_conversations(requests: Sequence[Request], indexes: list[int]) -> dict[int, Conversation]:
    """{index: Conversation} of the conversations this transaction created, for the
    first messages at `indexes` (none of them exists yet); two statements (three when a
    contact exists already: a sender seen in another chat)."""
    if not indexes:
        return {}
    contacts: dict[tuple[int, str], Contact] = {}
    for i in indexes:
        channel, inbound = requests[i]
        contacts.setdefault((channel.pk, inbound.sender_id), Contact(
            channel=channel, platform_id=inbound.sender_id, display_name=inbound.sender_name[:200],
            username=inbound.username[:100], language=inbound.language[:16]))
    # In key order, as every batch inserts them: two batches inserting the same new
    # contacts wait for each other's (unique index) in one order, never in a cycle.
    contact_ids = {(channel_id, platform_id): pk for pk, channel_id, platform_id in insert_many(
        Contact, [contacts[key] for key in sorted(contacts)], ("channel_id", "platform_id"),
        ("id", "channel_id", "platform_id"))}
    known = [key for key in contacts if key not in contact_ids]
    if known:
        contact_ids.update({(channel_id, platform_id): pk for pk, channel_id, platform_id in sql.contact_ids(known)})
    conversations = {}
    for i in indexes:
        channel, inbound = requests[i]
        conversations[i] = Conversation(channel=channel, chat_id=inbound.chat_id, sender_id=inbound.sender_id,
                                        contact_id=contact_ids[(channel.pk, inbound.sender_id)],
                                        is_group=inbound.is_group, language=inbound.language[:16])
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
        conversation.open_buffer_count, conversation.open_buffer_album = 0, ""
        created[i] = conversation
    return created


def _admit_plain(requests: Sequence[Request], opening: dict[int, Conversation], joining: dict[int, Conversation],
                 now: datetime) -> dict[int, Admission]:
    """{index: Admission} of the plain messages at `opening` (a new buffer each) and at
    `joining` (each into its conversation's open buffer): the new buffers, the messages,
    the joined buffers re-planned; a statement each for the whole batch."""
    arrivals = {i: Arrival(requests[i][0], conversation, requests[i][1], now)
                for i, conversation in {**opening, **joining}.items()}
    if not arrivals:
        return {}
    buffers = _new_buffers({i: arrivals[i] for i in opening}, now)
    # JOINS: each of these conversations has its buffer open, so none is None.
    buffers.update({i: cast(MessageBuffer, _known_open_buffer(conversation)) for i, conversation in joining.items()})
    messages = {i: _message(arrival, None, buffers[i]) for i, arrival in arrivals.items()}
    stored = {(channel_id, platform_id): pk for pk, channel_id, platform_id in insert_many(
        InboundMessage, messages.values(), ("channel_id", "platform_message_id"),
        ("id", "channel_id", "platform_message_id"))}
    admitted = {}
    for i, arrival in arrivals.items():
        pk = stored.get((arrival.channel.pk, arrival.inbound.platform_message_id))
        if pk is not None:
            messages[i].pk = admitted[i] = pk
            failpoint("inbound.after_insert")
    buffers.update(_rearm_joined({i: buffers[i] for i in joining if i in admitted}, arrivals, messages))
    unused = [buffers[i].pk for i in opening if i not in admitted]
    if unused:  # admitted before (rare): the buffers made for them go again
        MessageBuffer.objects.filter(pk__in=unused).delete()
    admissions = {}
    for i, arrival in arrivals.items():
        channel, conversation, inbound = arrival.channel, arrival.conversation, arrival.inbound
        if i not in admitted:
            admissions[i] = Admission(duplicate=True, conversation_id=conversation.pk)
            continue
        admissions[i] = admission = _buffered(
            Admission(duplicate=False, conversation_id=conversation.pk, message_id=admitted[i]), buffers[i])
        if inbound.address:
            addresses.remember(channel.pk, inbound.chat_id, inbound.address)
        console.message_admitted(channel, conversation.pk, inbound, admission,
                                 f"[{inbound.media_type}] {inbound.text}" if inbound.media_type else inbound.text)
    return admissions


def _new_buffers(arrivals: dict[int, Arrival], now: datetime) -> dict[int, MessageBuffer]:
    """A new open buffer for each arrival's conversation, in one statement."""
    buffers = {i: MessageBuffer(conversation=arrival.conversation, first_message_at=now,
                                **_planned(arrival, now, 1, None)) for i, arrival in arrivals.items()}
    if not buffers:
        return {}
    buffer_ids = {conversation_id: pk for pk, conversation_id in insert_many(
        MessageBuffer, buffers.values(), returning=("id", "conversation_id"))}
    for buffer in buffers.values():
        buffer.pk = buffer_ids[buffer.conversation_id]
        buffer._state.adding, buffer._state.db = False, connection.alias
    return buffers


def _rearm_joined(joined: dict[int, MessageBuffer], arrivals: dict[int, Arrival],
                  messages: dict[int, InboundMessage]) -> dict[int, MessageBuffer]:
    """`_rearm` for a batch: each open buffer a message at `joined` was stored in,
    re-planned from that message, in one statement (a compare-and-swap on each). One the
    flusher claimed since it was read (it does not lock the conversation) gives its
    message to the conversation's next buffer, as `_rearm` does. {index: its buffer}."""
    planned = {i: _planned(arrivals[i], buffer.first_message_at, counted(buffer, arrivals[i].inbound), None)
               for i, buffer in joined.items()}
    held = sql.update_open_buffers({buffer.pk: planned[i] for i, buffer in joined.items()})
    placed = {}
    for i, buffer in joined.items():
        if buffer.pk in held:
            for name, value in planned[i].items():
                setattr(buffer, name, value)
        else:
            buffer = _reread_open_buffer(arrivals[i], None) or _new_buffer(arrivals[i], None)
            _set_buffer(messages[i], buffer)
        placed[i] = buffer
    return placed
