"""Replies are written down before they are sent, then sent by whoever claims them.

`enqueue` runs inside the caller's transaction (a turn's completion, a control
command), so a reply exists exactly when the work that produced it committed.
`claim` is a compare-and-swap that stamps the owner, so two workers never send the
same row for the same claim.
"""

import logging

from datetime import timedelta

from django.db.models import F, Q
from django.utils import timezone

from delivery.models import OutboundMessage, OutboundState
from delivery.transports import Target, transport_for

log = logging.getLogger(__name__)


def enqueue(conversation, text, *, kind, turn=None, reply_target="", thread_id=""):
    return OutboundMessage.objects.create(
        conversation=conversation, turn=turn, kind=kind, text=text,
        reply_target=reply_target, thread_id=thread_id,
    )


MAX_ATTEMPTS = 3
RETRY_AFTER = timedelta(seconds=30)


def _claimable(dead_owners, now):
    due = Q(state=OutboundState.PENDING, next_attempt_at__lte=now)
    orphaned = Q(state=OutboundState.SENDING, owner__in=list(dead_owners))
    return due | orphaned


def claim(outbound_id, owner, dead_owners=(), now=None):
    """Move one row to SENDING for `owner`; None when someone else has it."""
    now = now or timezone.now()
    claimed = OutboundMessage.objects.filter(_claimable(dead_owners, now), pk=outbound_id).update(
        state=OutboundState.SENDING, owner=owner, attempts=F("attempts") + 1
    )
    if claimed != 1:
        return None
    return OutboundMessage.objects.select_related("conversation__channel").get(pk=outbound_id)


def claimable_ids(dead_owners=(), limit=100, now=None):
    """Rows due to be sent, and rows whose sender died mid-send (at-least-once)."""
    rows = OutboundMessage.objects.filter(_claimable(dead_owners, now or timezone.now()))
    return list(rows.order_by("created_at").values_list("pk", flat=True)[:limit])


def finish(outbound, owner, result, now=None):
    now = now or timezone.now()
    if result.ok:
        fields = {"state": OutboundState.SENT, "sent_at": now, "platform_message_id": result.platform_message_id}
    elif result.permanent or outbound.attempts >= MAX_ATTEMPTS:
        fields = {"state": OutboundState.FAILED, "last_error": result.error[:300]}
    else:
        fields = {"state": OutboundState.PENDING, "next_attempt_at": now + RETRY_AFTER,
                  "last_error": result.error[:300]}
    OutboundMessage.objects.filter(pk=outbound.pk, state=OutboundState.SENDING, owner=owner).update(**fields)


async def send(outbound) -> "SendResult":  # noqa: F821
    conversation = outbound.conversation
    target = Target(conversation.chat_id, outbound.reply_target, outbound.thread_id)
    result = await transport_for(conversation.channel).send_text(target, outbound.text)
    if not result.ok:
        log.warning("send of outbound %s failed: %s", outbound.pk, result.error)
    return result
