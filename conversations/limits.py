"""Limits per person, per channel: turns per contact per hour, and a daily budget of
model tokens per contact (as the provider reports them, `Turn.tokens_used`).

Checked when a turn is about to run (the worker's runner), only on channels that set a
limit. A turn over a limit is cancelled before the agent sees it: its messages stay
stored (Disposition.LIMITED) and audited, never dropped silently. The first turn of an
episode (a compare-and-swap on `Contact.limited_until`) also writes ONE short notice to
the user; the next ones until the limit resets write nothing. An operator lifts a limit
in the admin (`lift`): usage then counts from that instant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.db.models import F, Q, Sum
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.models import EventKind
from conversations import turns
from conversations.models import Contact, Disposition, InboundMessage, Turn, TurnState
from delivery import ledger
from delivery.models import OutboundKind

if TYPE_CHECKING:
    from conversations.models import Channel

HELD = "limit: "  # the outcome of a turn held here
LIMIT_NOTICE = _("You've reached the limit of messages I can answer for now. I'll be able to answer again later.")
# Turns that cost the agent something: every turn that started, however it ended — one the
# person cancelled (`/stop`, an interrupt, an edit's re-run, a takeover) was read and
# maybe answered all the same, and counting only finished turns let a `/stop` just before
# the end dodge every limit. Not counted: a turn cancelled before it started (the agent
# never saw it), one this module held (it never reached the agent; counting it would
# stretch the limit it enforces), and a person's replies (conversations.handoff).
COUNTED = (Q(state__in=(TurnState.RUNNING, TurnState.DONE, TurnState.FAILED))
           | Q(state=TurnState.CANCELLED, started_at__isnull=False) & ~Q(outcome__startswith=HELD))
HOUR = timedelta(hours=1)


@dataclass(frozen=True)
class Over:
    reason: str
    until: datetime


def applies(channel: Channel) -> bool:
    return bool(channel.turns_per_contact_per_hour or channel.tokens_per_contact_per_day)


def hold_if_over(turn: Turn, now: datetime | None = None) -> bool:
    """Call before running a turn (RUNNING, this worker's). True: its contact is over a
    limit, and the turn was cancelled, its messages marked, the event audited and (the
    first time in this episode) the notice written, in one transaction."""
    channel = turn.conversation.channel
    if not applies(channel):
        return False
    now = now or timezone.now()
    with transaction.atomic():
        contact = Contact.objects.get(pk=turn.conversation.contact_id)
        over = _over(channel, contact, turn, now)
        if over is None or not turns.cancel(turn.pk, f"{HELD}{over.reason}", now):
            return False
        InboundMessage.objects.filter(buffer_id=turn.buffer_id).update(disposition=Disposition.LIMITED)
        first = Contact.objects.filter(Q(limited_until__isnull=True) | Q(limited_until__lte=now), pk=contact.pk
                                       ).update(limited_until=over.until, limit_reason=over.reason[:120])
        if first:
            ledger.enqueue(turn.conversation, LIMIT_NOTICE, kind=OutboundKind.NOTICE,
                           reply_target=turn.reply_target, thread_id=turn.thread_id)
        record(EventKind.LIMIT_REACHED, conversation=turn.conversation, actor=turn.conversation.sender_id,
               target=f"turn {turn.pk}", summary=turn.merged_input[:200], reason=over.reason,
               until=over.until.isoformat(), noticed=bool(first))
    return True


def _over(channel: Channel, contact: Contact, turn: Turn, now: datetime) -> Over | None:
    start = contact.limits_counted_from
    mine = Turn.objects.filter(COUNTED, conversation__contact_id=contact.pk).exclude(pk=turn.pk).exclude(
        owner__startswith="person:")
    if channel.turns_per_contact_per_hour:
        since = max(now - HOUR, start) if start else now - HOUR
        hour = list(mine.filter(created_at__gt=since).order_by("created_at").values_list("created_at", flat=True))
        if len(hour) >= channel.turns_per_contact_per_hour:
            # A slot frees when the oldest turn of the hour leaves it.
            return Over(f"{channel.turns_per_contact_per_hour} turns per hour", hour[0] + HOUR)
    if channel.tokens_per_contact_per_day:
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        since = max(midnight, start) if start else midnight
        used = mine.filter(created_at__gte=since).aggregate(n=Sum("tokens_used"))["n"] or 0
        if used >= channel.tokens_per_contact_per_day:
            return Over(f"{channel.tokens_per_contact_per_day} model tokens per day", midnight + timedelta(days=1))
    return None


def lift(contact_ids: Iterable[int], by: str, now: datetime | None = None) -> int:
    """Lift the limits of these contacts: their usage counts from now."""
    now = now or timezone.now()
    with transaction.atomic():
        contacts = list(Contact.objects.filter(pk__in=contact_ids).select_related("channel"))
        Contact.objects.filter(pk__in=contact_ids).update(limited_until=None, limit_reason="",
                                                          limits_counted_from=now)
        for contact in contacts:
            record(EventKind.LIMIT_LIFTED, channel_slug=contact.channel.slug, actor=by,
                   target=f"contact {contact.platform_id}", summary=contact.limit_reason)
    return len(contacts)


def add_tokens(turn_id: int, tokens: int) -> None:
    """The usage a provider reported for one model request of this turn."""
    if tokens > 0:
        Turn.objects.filter(pk=turn_id).update(tokens_used=F("tokens_used") + int(tokens))
