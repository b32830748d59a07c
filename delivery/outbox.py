"""Replies are written down before they are sent, then sent by whoever claims them.

`enqueue` runs inside the caller's transaction (a turn's completion, a control
command), so a reply exists exactly when the work that produced it committed.
`claim` is a compare-and-swap that stamps the owner, so two workers never send the
same row for the same claim.
"""

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Case, CharField, F, Q, Value, When
from django.utils import timezone

from delivery.models import OutboundMessage, OutboundState
from delivery.transports import SendResult, Target, transport_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reply:
    conversation: object
    text: str
    kind: str
    turn: object = None
    reply_target: str = ""
    thread_id: str = ""


def enqueue(conversation, text, *, kind, turn=None, reply_target="", thread_id=""):
    return enqueue_many([Reply(conversation, text, kind, turn, reply_target, thread_id)])[0]


def enqueue_many(replies, claimed_by=""):
    """Write replies down (one INSERT). With `claimed_by`, they start as SENDING owned
    by that worker, which sends them at once; if it dies, the sweep resends them."""
    state = OutboundState.SENDING if claimed_by else OutboundState.PENDING
    rows = [OutboundMessage(conversation=r.conversation, turn=r.turn, kind=r.kind, text=r.text,
                            reply_target=r.reply_target, thread_id=r.thread_id, state=state,
                            owner=claimed_by, attempts=1 if claimed_by else 0)
            for r in replies]
    return OutboundMessage.objects.bulk_create(rows)


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


def finish_many(outcomes, owner, now=None):
    """Record send outcomes. Deliveries — nearly all of them — are one UPDATE for the
    whole batch (each row's platform id chosen by CASE); failures one by one."""
    now = now or timezone.now()
    delivered = {row.pk: result.platform_message_id for row, result in outcomes if result.ok}
    if delivered:
        platform_ids = Case(*(When(pk=pk, then=Value(pid)) for pk, pid in delivered.items()),
                            output_field=CharField())
        OutboundMessage.objects.filter(pk__in=delivered, state=OutboundState.SENDING, owner=owner).update(
            state=OutboundState.SENT, sent_at=now, platform_message_id=platform_ids)
    for row, result in outcomes:
        if not result.ok:
            finish(row, owner, result, now)


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


async def send(outbound) -> SendResult:
    conversation = outbound.conversation
    target = Target(conversation.chat_id, outbound.reply_target, outbound.thread_id)
    result = await transport_for(conversation.channel).send_text(target, outbound.text)
    if not result.ok:
        log.warning("send of outbound %s failed: %s", outbound.pk, result.error)
    return result
