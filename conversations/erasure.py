"""Erasure of one person (a data-protection request): `manage.py forgetcontact`, the
admin's action on contacts, `POST /api/v1/operator/contacts/forget`. docs/operations.md#erasure.

What goes: every text the person wrote or was sent (messages, their edits, turns' input
and replies, notes, ledger rows, confirmation questions), their files (rows, and stored
bytes no other row names), their name, user name and platform ids, the local calendar
the guard's tools kept for them, their chats' platform addresses (conversations.addresses), and the personal part of the guard's claims (arguments,
results, errors) and of audit events about them (summary, extra, actor).

Beyond their own rows, the copies made elsewhere go too: in a group, their lines in the
other members' turns (input, streamed text, reply) and ledger rows become "[erased]"
lines; their schedules are cancelled and lose their text; files replies carried to them
are deleted with the rows; audit events about them without a conversation (a refused
message, an ignored edit, a lifted limit), the chat marked unreachable, the pacing slot
of their chat and the admin's log entries of their rows lose their ids and names.

What stays, without personal data: the rows' skeletons (counts, states, times), so the
guard still sees a claim inside its window (its fingerprint is a one-way hash), and one
audit event `contact_erased` with who asked and the counts. A message's platform id is
replaced by a keyed one-way digest (HMAC-SHA256 with SECRET_KEY), unique per message, so
no id of the person remains and the unique constraint (the dedup) still holds. The
contact and its conversations get placeholder ids (`erased:<row id>`): the person's
next message is a new contact and conversation, admitted and deduplicated as anyone's.

Work in flight is stopped first, each by compare-and-swap: open buffers are dropped,
ready turns cancelled, open ledger rows abandoned. A running turn or a reply being sent
is waited for (up to `wait` seconds); still running then, the erasure refuses
(`Busy`), so nothing written by that turn afterwards escapes it.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from audit.events import record
from audit.models import AuditEvent, EventKind
from conversations import addresses, erasure_copies, retention
from conversations.erasure_copies import ERASED
from conversations.models import (
    BufferState,
    Contact,
    ContextNote,
    Conversation,
    InboundMessage,
    MediaFile,
    MessageBuffer,
    MessageEdit,
    Turn,
    TurnState,
)
from delivery.models import OutboundMessage, OutboundState, ScheduledMessage, ScheduleState
from tools.models import ActionClaim, Calendar, Confirmation, Proposal

CANCELLED = "cancelled: the person's data was erased on request"


class NotFound(Exception):
    pass


class Busy(Exception):
    pass


def digest(channel_id: int, platform_message_id: str) -> str:
    key = settings.SECRET_KEY.encode()
    mac = hmac.new(key, f"{channel_id}:{platform_message_id}".encode(), hashlib.sha256).hexdigest()
    return f"erased:{mac[:40]}"


def forget(channel_slug: str, contact_id: str, *, by: str, wait: float = 30.0) -> dict[str, int]:
    """Erase the contact `contact_id` (its platform id) of channel `channel_slug`;
    returns the counts (also audited). Raises NotFound, Busy."""
    contact = Contact.objects.filter(channel__slug=channel_slug, platform_id=str(contact_id)).first()
    if contact is None:
        raise NotFound(f"no contact {contact_id!r} in channel {channel_slug!r}")
    conversations = list(contact.conversations.values_list("pk", flat=True))
    _stop_work(conversations, wait)
    with transaction.atomic():
        # Read before their rows are scrubbed: what their copies elsewhere look like.
        copies = erasure_copies.Copies.of(contact, conversations)
        copies.forget_admin_log()
        copies.forget_reply_files_on_commit()
        counts, file_ids = _scrub(contact, conversations)
        counts.update(copies.erase())
        retention.forget_bytes_on_commit(file_ids)
        MediaFile.objects.filter(pk__in=file_ids, messages__isnull=True).delete()
        record(EventKind.CONTACT_ERASED, channel_slug=channel_slug, actor=str(by)[:100],
               target=f"contact {contact.pk}", summary="a person's data was erased on request", **counts)
    return counts


def _stop_work(conversations: list[int], wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        # Schedules first: a tick sent meanwhile wrote its ledger row by now, abandoned below.
        ScheduledMessage.transition(
            list(ScheduledMessage.objects.filter(conversation_id__in=conversations, state=ScheduleState.SCHEDULED)
                 .values_list("pk", flat=True)), ScheduleState.SCHEDULED, ScheduleState.CANCELLED, reason=CANCELLED)
        for pk in MessageBuffer.objects.filter(conversation_id__in=conversations, state=BufferState.OPEN) \
                .values_list("pk", flat=True):
            MessageBuffer.transition(pk, BufferState.OPEN, BufferState.DROPPED, flush_reason="control")
        for pk in Turn.objects.filter(conversation_id__in=conversations, state=TurnState.READY) \
                .values_list("pk", flat=True):
            Turn.transition(pk, TurnState.READY, TurnState.CANCELLED, outcome="erased on request",
                            finished_at=timezone.now())
        for pk, state in OutboundMessage.objects.filter(
                conversation_id__in=conversations, state__in=[OutboundState.PENDING, OutboundState.FAILED]) \
                .values_list("pk", "state"):
            OutboundMessage.transition(pk, state, OutboundState.ABANDONED, next_attempt_at=None)
        busy = (Turn.objects.filter(conversation_id__in=conversations, state=TurnState.RUNNING).exists()
                or OutboundMessage.objects.filter(conversation_id__in=conversations,
                                                  state=OutboundState.ATTEMPTING).exists())
        if not busy:
            return
        if time.monotonic() > deadline:
            raise Busy("a turn of this person is running or a reply is being sent; try again in a minute")
        time.sleep(0.2)


# The counts are also the audit event's extra fields (record's **extra): Any to the checker.
def _scrub(contact: Contact, conversations: list[int]) -> tuple[dict[str, Any], list[int]]:
    of_them = Q(conversation_id__in=conversations)
    messages = InboundMessage.objects.filter(of_them)
    file_ids = [pk for pk in messages.exclude(media_file=None).values_list("media_file_id", flat=True)]
    # Files another person's messages name too (the same photo forwarded) stay.
    shared = set(InboundMessage.objects.filter(media_file_id__in=file_ids).exclude(of_them)
                 .values_list("media_file_id", flat=True))
    file_ids = sorted(set(file_ids) - shared)
    for pk, channel_id, platform_id in messages.values_list("pk", "channel_id", "platform_message_id"):
        if not platform_id.startswith("erased:"):
            InboundMessage.objects.filter(pk=pk).update(platform_message_id=digest(channel_id, platform_id))
    scope = f"contact:{contact.pk}"
    claims = ActionClaim.objects.filter(Q(conversation_id__in=conversations) | Q(scope=scope))
    counts = {
        "messages": messages.update(text="", sender_name="", reply_target="", thread_id="", album_id="",
                                    media_type="", media_file=None),
        "edits": MessageEdit.objects.filter(of_them).delete()[0],
        "turns": Turn.objects.filter(of_them).update(merged_input="", reply_text="", streamed_text="", outcome="",
                                                     reply_target="", thread_id="", preview_message_id=""),
        "notes": ContextNote.objects.filter(of_them).delete()[0],
        "replies": OutboundMessage.objects.filter(of_them).delete()[0],
        "schedules": ScheduledMessage.objects.filter(of_them).update(text=""),
        "confirmations": Confirmation.objects.filter(of_them).delete()[0],
        "files": len(file_ids),
        "claims": claims.update(arguments={}, fingerprint_material={}, result=None, error="", channel_slug=""),
        "calendars": Calendar.objects.filter(scope=scope).delete()[0],
        "audit_events": AuditEvent.objects.filter(conversation_id__in=conversations).update(
            summary=ERASED, extra={}, actor=ERASED, target=""),
    }
    Proposal.objects.filter(claim__in=claims).update(result=None, error="", decided_by="")
    # Their chats' platform addresses (where replies went), unless another person's
    # conversation is in the chat too (a group's address is the group's, not theirs).
    chats = set(Conversation.objects.filter(pk__in=conversations).values_list("chat_id", flat=True))
    shared = set(Conversation.objects.filter(channel_id=contact.channel_id, chat_id__in=chats)
                 .exclude(pk__in=conversations).values_list("chat_id", flat=True))
    counts["addresses"] = addresses.forget(contact.channel_id, chats - shared)
    MessageBuffer.objects.filter(of_them).update(last_album_id="")
    for pk in conversations:  # one conversation per chat: each gets a placeholder of its own
        contact.conversations.filter(pk=pk).update(chat_id=f"erased:{pk}", sender_id=f"erased:{contact.pk}",
                                                   context_reset_at=timezone.now())
    Contact.objects.filter(pk=contact.pk).update(platform_id=f"erased:{contact.pk}", display_name="", username="")
    return counts, file_ids
