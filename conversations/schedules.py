"""Scheduled messages going out (delivery.models.ScheduledMessage): the worker's step,
and the one way an operator, the API or the agent's tool schedules one.

Each due tick is sent in one transaction: a compare-and-swap on (state, due_at) moves
the schedule on (to SENT, or to its next tick), and the tick's ledger row is written
with `dedup_key` "schedule:<id>:<due at>", unique in the database. Two workers racing
for a tick, or a worker killed mid-round and restarted, can only ever write it once;
the ledger then delivers it at least once, labelled if it may repeat. The message is
written to the conversation's history as a note, so the agent knows it was said.
Outside a platform's reply window (WhatsApp's 24 hours) the tick goes as an approved
template if the schedule or its channel names one (`how_to_send`), else it waits.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from conversations.models import ContextNote, InboundMessage, MessageKind
from delivery import ledger
from delivery.models import OutboundKind, ScheduledMessage, ScheduleSource, ScheduleState

if TYPE_CHECKING:
    from conversations.models import Conversation

    Template = dict[str, Any]  # an approved template, filled (conversations.platforms.base.Platform.template_for)

# A tick waiting for a platform's reply window is looked at again this much later (its
# due_at moves: nothing was sent, so its key is free).
WAIT_RECHECK = timedelta(minutes=5)
REPLIED = "cancelled: the user wrote after it was scheduled"


def schedule(conversation: Conversation, text: str, due_at: datetime, source: str = ScheduleSource.OPERATOR,
             **options: Any) -> ScheduledMessage:
    """`options`: `repeat_every` (a timedelta), `cancel_on_reply`."""
    # StateMachine declares `objects` for every model it serves: the row's type is said here.
    scheduled: ScheduledMessage = ScheduledMessage.objects.create(conversation=conversation, text=text,
                                                                  due_at=due_at, source=source, **options)
    return scheduled


def dedup_key(schedule_id: int, due_at: datetime) -> str:
    return f"schedule:{schedule_id}:{due_at.astimezone(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}"


def send_due(now: datetime | None = None, limit: int | None = None) -> int:
    """Send every due tick (at most `limit`); how many this call wrote to the ledger."""
    now = now or timezone.now()
    due = (ScheduledMessage.objects.filter(state=ScheduleState.SCHEDULED, due_at__lte=now)
           .order_by("due_at", "id").values_list("pk", "due_at")[:limit or settings.AGENTLOOP_SCHEDULE_BATCH])
    return sum(send_tick(pk, due_at, now) for pk, due_at in list(due))


def send_tick(pk: int, due_at: datetime, now: datetime) -> bool:
    """One tick, claimed by compare-and-swap; False when another worker sent it, the
    user's reply cancelled it, or it has to wait."""
    with transaction.atomic():
        found = ScheduledMessage.objects.select_related("conversation__channel").filter(
            pk=pk, state=ScheduleState.SCHEDULED, due_at=due_at).first()
        if found is None:
            return False  # sent, cancelled or moved meanwhile
        if found.cancel_on_reply and user_wrote_since(found):
            ScheduledMessage.transition(pk, ScheduleState.SCHEDULED, ScheduleState.CANCELLED,
                                        where={"due_at": due_at}, reason=REPLIED)
            return False
        template, waiting = how_to_send(found, now)
        if waiting:
            ScheduledMessage.transition(pk, ScheduleState.SCHEDULED, ScheduleState.SCHEDULED,
                                        where={"due_at": due_at}, due_at=now + WAIT_RECHECK, reason=waiting)
            return False
        following = next_tick(found, now)
        if not ScheduledMessage.transition(
                pk, ScheduleState.SCHEDULED, ScheduleState.SENT if following is None else ScheduleState.SCHEDULED,
                where={"due_at": due_at}, due_at=following or due_at, ticks_sent=F("ticks_sent") + 1,
                last_sent_at=now, reason=""):
            return False
        write(found, due_at, now, template)
    return True


def write(found: ScheduledMessage, due_at: datetime, now: datetime, template: Template | None = None) -> None:
    """The tick's ledger row (as an approved template when `template`) and its note."""
    conversation = found.conversation
    ledger.enqueue_many([ledger.Reply(conversation, found.text, OutboundKind.SCHEDULED,
                                      dedup_key=dedup_key(found.pk, due_at), template=template)])
    ContextNote.objects.create(conversation=conversation, created_at=now,
                               text=f"A scheduled message was sent to the user: {found.text}")


def user_wrote_since(found: ScheduledMessage) -> bool:
    return (InboundMessage.objects.filter(conversation_id=found.conversation_id, received_at__gt=found.created_at)
            .exclude(kind=MessageKind.CONTROL).exists())


def how_to_send(found: ScheduledMessage, now: datetime) -> tuple[Template | None, str]:
    """(template, why it waits). Inside the platform's reply window (or on a platform
    without one) the text goes as it is: (None, ""). Outside it (WhatsApp: 24 hours since
    the user's last message; free text would be refused with 131047) it goes as the
    approved template the schedule or its channel names, filled with the text; without
    one it waits, and says why."""
    channel = found.conversation.channel
    window = channel.platform.reply_window
    if window is None:
        return None, ""
    last = (InboundMessage.objects.filter(conversation_id=found.conversation_id)
            .order_by("-received_at").values_list("received_at", flat=True).first())
    if last is not None and now - last < window:
        return None, ""
    try:
        template = channel.platform.template_for(channel, found.text, found.chosen_template())
    except ValidationError as exc:  # a template setting stored before its check existed, say
        return None, f"waiting: its template is not valid ({'; '.join(exc.messages)}); fix it in the admin"[:300]
    if template is not None:
        return template, ""
    hours = int(window.total_seconds() // 3600)
    return None, (f"waiting: the user has not written in the last {hours} hours, and outside that window the "
                  f"platform takes only approved templates (error 131047); neither the schedule nor its channel "
                  f"names one, so it goes once the user writes")


def next_tick(found: ScheduledMessage, now: datetime) -> datetime | None:
    """A repeating schedule's next due time after `now` (ticks missed while no worker ran
    are skipped, not sent in a burst); None for a one-off."""
    if not found.repeat_every:
        return None
    following = found.due_at + found.repeat_every
    while following <= now:
        following += found.repeat_every
    return following
