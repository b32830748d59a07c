"""Turn transitions, each a compare-and-swap on the turn's row.

`cancel` and `mark_effect` race on the same row and exactly one of them wins: a
turn that has fired an external effect can no longer be cancelled, and a cancelled
turn can no longer fire one.
"""

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from conversations.models import Turn, TurnState


def cancel(turn_id, reason, now=None) -> bool:
    """Cancel a ready or running turn that has not fired an external effect."""
    return Turn.objects.filter(
        pk=turn_id, state__in=Turn.ACTIVE, fired_effect=False
    ).update(state=TurnState.CANCELLED, outcome=reason[:300], finished_at=now or timezone.now()) == 1


def mark_effect(turn_id, now=None) -> bool:
    """Call before an external effect; False means the turn was cancelled: do not act."""
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING).update(
        fired_effect=True, effect_fired_at=now or timezone.now()
    ) == 1


def start(turn_id, owner, now=None) -> bool:
    """READY -> RUNNING for `owner`. The partial unique index refuses a second
    running turn in the same conversation, so this is safe across processes."""
    try:
        with transaction.atomic():
            return Turn.objects.filter(pk=turn_id, state=TurnState.READY).update(
                state=TurnState.RUNNING, owner=owner, started_at=now or timezone.now(),
                attempts=F("attempts") + 1,
            ) == 1
    except IntegrityError:
        return False


def finish(turn_id, owner, *, state, reply_text="", outcome="", now=None) -> bool:
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING, owner=owner).update(
        state=state, reply_text=reply_text, outcome=outcome[:300], finished_at=now or timezone.now()
    ) == 1


def ready_candidates(limit):
    """Oldest ready turns, at most one per conversation (turns run in arrival order)."""
    seen, picked = set(), []
    for turn_id, conversation_id in (
        Turn.objects.filter(state=TurnState.READY).order_by("created_at", "pk")
        .values_list("pk", "conversation_id")[: limit * 2]
    ):
        if conversation_id not in seen:
            seen.add(conversation_id)
            picked.append(turn_id)
    return picked[:limit]
