"""Delivery receipts: what a platform reports, after it accepted a send, about where the
message went (WhatsApp's `statuses`: sent, delivered, read, failed; Twilio's status
callbacks: queued, sent, delivered, undelivered, failed), and a person's word that they
want no more messages (an SMS "STOP": `chat_opted_out`, undone by `chat_opted_in`).

Only `failed` changes anything: the platform answered our send with a message id, so the
ledger recorded the row delivered, and now says the message never reached the user. The
row goes back into the ledger's hands — failed, resent on its resend budget after the
ledger's first back-off (30 s), labelled like any resend of a row sent before; or
unreachable, the chat marked as a permanent send error marks it, when the platform
says no resend can help — with the platform's error (redacted) and an audit event.

Receipts arrive late, twice, or out of order. Every change is one compare-and-swap from
`delivered` on the row that still carries that platform id: a second copy of a receipt,
or one about a send superseded by a resend (the row has its new id), changes nothing.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentloop.core.redaction import channel_secrets, redact
from audit.events import record
from audit.models import EventKind
from delivery import ledger
from delivery.models import OutboundMessage, OutboundState, Outcome, UnreachableChat

log = logging.getLogger(__name__)

# What an applied receipt did (also the webhook's tally).
UNKNOWN = "unknown"  # no row of this channel carries that id (pruned, or not ours)
NOTED = "noted"  # sent / delivered / read: the row stays delivered (nothing is read or written)
UNCHANGED = "unchanged"  # failed, but the row had moved on (a copy, a resend)
FAILED = "failed"
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Failure:
    """The platform's word that a message it accepted did not arrive."""

    platform_message_id: str
    error: str
    permanent: bool = False  # no resend can help (e.g. WhatsApp's 24-hour window)


def failed_after_send(channel: Any, failure: Failure, now: datetime | None = None) -> str:
    """Apply the platform's word that a message it accepted did not arrive (`channel`:
    conversations' Channel, whose row carries that platform id). What it did: a constant above."""
    now = now or timezone.now()
    row = (OutboundMessage.objects.filter(channel=channel, platform_message_id=failure.platform_message_id)
           .order_by("-pk").first())
    if row is None:
        return UNKNOWN
    row.channel = channel
    error = redact(f"not delivered (platform receipt): {failure.error}", channel_secrets(channel))[:300]
    with transaction.atomic():
        if failure.permanent:
            moved = OutboundMessage.transition(
                row.pk, OutboundState.DELIVERED, OutboundState.UNREACHABLE,
                where={"platform_message_id": failure.platform_message_id},
                last_outcome=Outcome.PERMANENT, last_error=error, next_attempt_at=None, delivered_at=None)
            if moved:
                ledger.mark_unreachable(row, error, now)
        else:
            moved = OutboundMessage.transition(
                row.pk, OutboundState.DELIVERED, OutboundState.FAILED,
                where={"platform_message_id": failure.platform_message_id},
                last_outcome=Outcome.TEMPORARY, last_error=error, next_attempt_at=now + ledger.BACKOFF[0],
                delivered_at=None)
        if not moved:
            return UNCHANGED
        record(EventKind.REPLY_FAILED_AFTER_SEND, conversation_id=row.conversation_id, channel_slug=channel.slug,
               actor="platform", target=f"ledger row {row.pk}",
               summary=("never retried: " if failure.permanent else "resent: ") + error, ledger_row=row.pk,
               platform_message_id=failure.platform_message_id)
    log.warning("channel %s: ledger row %s was not delivered after all (%s)", channel.slug, row.pk, error)
    return UNREACHABLE if failure.permanent else FAILED


def chat_opted_out(channel: Any, chat_id: str, reason: str, now: datetime | None = None) -> bool:
    """The platform says the person asked for no more messages (an SMS "STOP"): the chat
    is marked unreachable as a permanent send error marks it, before any reply fails on
    it (the platform would refuse each one). True when the mark is new (audited once)."""
    now = now or timezone.now()
    error = redact(reason, channel_secrets(channel))[:300]
    with transaction.atomic():
        mark, created = UnreachableChat.objects.get_or_create(
            channel_id=channel.pk, chat_id=chat_id, defaults={"error": error, "since": now, "last_failure_at": now})
        if not created:
            UnreachableChat.objects.filter(pk=mark.pk).update(error=error, last_failure_at=now)
            return False
        record(EventKind.CHAT_UNREACHABLE, channel_slug=channel.slug, actor="platform", target=f"chat {chat_id}",
               summary=f"opted out: {error}"[:300])
    return True


def chat_opted_in(channel: Any, chat_id: str) -> bool:
    """The person asked for messages again (an SMS "START"): the unreachable mark goes.
    True when there was one."""
    return UnreachableChat.objects.filter(channel_id=channel.pk, chat_id=chat_id).delete()[0] > 0
