"""Admitting a batch (group commit): one transaction for all its messages, and the
statements they have in common run once for the batch (`_admit_ahead`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentloop.core import tracing
from agentloop.core.rows import insert_many
from audit.failpoints import failpoint
from conversations import addresses, console, control, sql
from conversations.ingest import spans
from conversations.ingest.admission import _buffered, _conversation_from_row, _message, _planned, _retryable, admit
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
      lock already: the read alone). With no buffer open, no turn running and nobody
      holding it (a person back after their reply: half of the paced benchmark's
      messages), a plain message opens its buffer as a new conversation's does, below;
      any other admission goes on from there, one by one.
    - it does not: created (contacts, then conversations: a statement each).
    - a plain message opening a buffer: the buffers, then the messages inserted (a
      statement each for the whole batch): that Admission is complete. A conversation
      another admission created meanwhile is not in the result: its message is admitted
      one by one, as before.

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
    opening = {**{i: conversation for i, conversation in known.items() if _opens_a_buffer(conversation, requests[i][1])},
               **created}
    ahead: dict[int, Admission | Conversation] = {**known, **created}
    ahead.update(_admit_first_messages(requests, opening, now))
    return ahead


def _opens_a_buffer(conversation: Conversation, inbound: Inbound) -> bool:
    """Whether an existing conversation's message may open its buffer in the batch's
    statements: what `admit` would do for it is then exactly that (_admit_in_transaction:
    nobody holds it, no buffer is open to join, no turn runs to double-text, its
    language unchanged, nothing pending to overflow). Commands, answers and a bot's
    messages are sorted out in _admit_first_messages, as for a new conversation's."""
    return (conversation.state != ConversationState.PERSON and conversation.open_buffer_id is None
            and conversation.running_turn_id is None and settings.AGENTLOOP_MAX_PENDING_MESSAGES > 0
            and not (inbound.language and inbound.language[:16] != conversation.language))


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


def _admit_first_messages(requests: Sequence[Request], opening: dict[int, Conversation],
                          now: datetime) -> dict[int, Admission]:
    """{index: Admission} of the plain messages that open a buffer in the conversations
    at `opening` (this transaction created them, or _opens_a_buffer said so): a buffer
    each, then the messages, a statement each. A control command or an answer to a
    question (neither is plain) is left to `admit`, as is a bot's message and a second
    message with the same platform id in this batch."""
    plain, seen = {}, set()
    for i, conversation in opening.items():
        channel, inbound = requests[i]
        if (channel.pk, inbound.platform_message_id) in seen or inbound.is_bot:
            continue  # a bot's message is admitted alone: conversations.loops decides
        if not inbound.media_type and (control.parse(inbound.text)
                                       or confirmations.answer_from_text(channel, conversation, inbound.text)):
            continue
        seen.add((channel.pk, inbound.platform_message_id))
        plain[i] = MessageBuffer(conversation=conversation, first_message_at=now,
                                 **_planned(Arrival(channel, conversation, inbound, now), now, 1, None))
    if not plain:
        return {}
    buffer_ids = {conversation_id: pk for pk, conversation_id in insert_many(
        MessageBuffer, plain.values(), returning=("id", "conversation_id"))}
    messages = {}
    for i, buffer in plain.items():
        buffer.pk = buffer_ids[buffer.conversation_id]
        buffer._state.adding, buffer._state.db = False, connection.alias
        channel, inbound = requests[i]
        messages[i] = _message(Arrival(channel, opening[i], inbound, now), None, buffer)
    stored = {(channel_id, platform_id): pk for pk, channel_id, platform_id in insert_many(
        InboundMessage, messages.values(), ("channel_id", "platform_message_id"),
        ("id", "channel_id", "platform_message_id"))}
    admissions, unused = {}, []
    for i, message in messages.items():
        channel, inbound = requests[i]
        pk = stored.get((channel.pk, inbound.platform_message_id))
        if pk is None:  # admitted before (rare): its buffer goes again
            unused.append(plain[i].pk)
            admissions[i] = Admission(duplicate=True, conversation_id=opening[i].pk)
            continue
        message.pk = pk
        failpoint("inbound.after_insert")
        admissions[i] = admission = _buffered(
            Admission(duplicate=False, conversation_id=opening[i].pk, message_id=message.pk), plain[i])
        if inbound.address:
            addresses.remember(channel.pk, inbound.chat_id, inbound.address)
        console.message_admitted(channel, opening[i].pk, inbound, admission,
                                 f"[{inbound.media_type}] {inbound.text}" if inbound.media_type else inbound.text)
    if unused:
        MessageBuffer.objects.filter(pk__in=unused).delete()
    return admissions
