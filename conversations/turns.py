"""Turn transitions, each a compare-and-swap on the turn's row through the checked
`Turn.transition` (it refuses a move that `Turn.TRANSITIONS` does not allow).

`cancel` and `mark_effect` race on the same row and exactly one of them wins: a
turn that has fired an external effect can no longer be cancelled, and a cancelled
turn can no longer fire one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from agentloop.core import metrics
from agentloop.core.redaction import redact
from audit.events import record
from audit.models import EventKind
from conversations import sql
from conversations.models import ConversationState, Turn, TurnState
from delivery import ledger
from delivery.models import OutboundKind

EXTERNAL_GAVE_UP_NOTICE = _("Sorry — I could not answer your last message. Please send it again in a while.")


def cancel(turn_id: int, reason: str, now: datetime | None = None) -> bool:
    """Cancel a ready or running turn that has not fired an external effect."""
    return Turn.transition(turn_id, Turn.ACTIVE, TurnState.CANCELLED, where={"fired_effect": False},
                           outcome=reason[:300], finished_at=now or timezone.now()) == 1


def mark_effect(turn_id: int, now: datetime | None = None) -> bool:
    """Call before an external effect; False means the turn was cancelled: do not act."""
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING).update(
        fired_effect=True, effect_fired_at=now or timezone.now()
    ) == 1


# A turn starts only while the agent holds its conversation (conversations.handoff): a
# takeover between the pick and the start leaves it waiting.
AGENT_HOLDS = Q(conversation__state=ConversationState.AGENT)


def start(turn_id: int, owner: str, now: datetime | None = None, where: dict[str, Any] | None = None) -> bool:
    """READY -> RUNNING for `owner`. The partial unique index refuses a second
    running turn in the same conversation, so this is safe across processes."""
    held = AGENT_HOLDS & (Q(**where) if where else Q())
    try:
        with transaction.atomic():
            return Turn.transition(turn_id, TurnState.READY, TurnState.RUNNING, where=held, owner=owner,
                                   started_at=now or timezone.now(), attempts=F("attempts") + 1) == 1
    except IntegrityError:
        return False


def finish(turn_id: int, owner: str, *, state: TurnState, reply_text: str = "", outcome: str = "",
           now: datetime | None = None) -> bool:
    """RUNNING -> DONE/FAILED for `owner`; False if it was cancelled meanwhile."""
    return turn_id in finish_many([(turn_id, state, reply_text, outcome[:300])], owner, now)


def finish_many(results: Sequence[sql.Finished], owner: str, now: datetime | None = None) -> set[int]:
    """Finish running turns in one UPDATE (`conversations.sql.finish_turns`); returns the ids that were still this owner's to finish (not cancelled meanwhile)."""
    if not results:
        return set()
    now = now or timezone.now()
    redacted = [(r[0], r[1], r[2], redact(r[3])[:300]) for r in results]  # an agent's error may carry a secret
    sql.finish_turns(redacted, owner, now)
    ids = [r[0] for r in redacted]
    # Read back by id only, the state checked here: with `state IN (done, failed)` in the
    # WHERE, SQLite (no statistics) walked the state index through every finished turn
    # instead of looking up these ids: 291 ms a batch on a file of 385,000 turns, in the
    # worker's one database thread, growing with the table (the sustained benchmark's
    # replies fell behind after eight minutes). owner and finished_at are no index's.
    finished = [(pk, state, started) for pk, state, started in
                Turn.objects.filter(pk__in=ids, owner=owner, finished_at=now).values_list("pk", "state", "started_at")
                if state in (TurnState.DONE, TurnState.FAILED)]
    metrics.after_commit(_count_turns, [(state, (now - started).total_seconds())
                                        for _, state, started in finished if started is not None])
    return {pk for pk, _, _ in finished}


def _count_turns(durations: Iterable[tuple[str, float]]) -> None:
    for state, seconds in durations:
        metrics.TURN_SECONDS.labels(state).observe(max(0.0, seconds))


def start_many(turn_ids: Collection[int], owner: str, now: datetime | None = None) -> list[Turn]:
    """Start a batch of turns in one statement; if another worker started a turn in one
    of these conversations meanwhile (the unique index refuses the whole statement),
    fall back to one compare-and-swap each. Returns the turns this owner now runs."""
    if not turn_ids:
        return []
    now = now or timezone.now()
    try:
        with transaction.atomic():
            Turn.transition(list(turn_ids), TurnState.READY, TurnState.RUNNING, where=AGENT_HOLDS, owner=owner,
                            started_at=now, attempts=F("attempts") + 1)
    except IntegrityError:
        for turn_id in turn_ids:
            start(turn_id, owner, now)
    return list(Turn.objects.filter(pk__in=turn_ids, state=TurnState.RUNNING, owner=owner, started_at=now)
                .select_related("conversation__channel", "routing_rule"))


# Owners of turns handed to an external agent: "agent:<key id>" (a pull agent that
# claimed it) or this one (a webhook agent that will answer later through the API).
EXTERNAL_WEBHOOK = "agent:webhook"
# The agent whose turns wait for an external agent to claim them; workers never run them.
PULL_AGENT = "pull"


def external_owner(agent_key_id: int | str) -> str:
    return f"agent:{agent_key_id}"


def hand_over(turn_id: int, owner: str, new_owner: str) -> bool:
    """A running turn passes from its worker to an external agent (same state, new owner)."""
    return Turn.objects.filter(pk=turn_id, state=TurnState.RUNNING, owner=owner).update(
        owner=new_owner, started_at=timezone.now()) == 1


def claim_external(turn_id: int, agent_key_id: int | str, now: datetime | None = None) -> bool:
    """A pull agent takes a ready turn of a `pull` channel (READY -> RUNNING under its
    key). Other channels' turns are their workers' to run: a key claiming one would take
    it from its agent and answer in its place."""
    return start(turn_id, external_owner(agent_key_id), now,
                 where={"conversation__channel__agent": PULL_AGENT})


def may_answer(turn: Turn, agent_key_id: int | str) -> bool:
    return turn.state == TurnState.RUNNING and turn.owner in (external_owner(agent_key_id), EXTERNAL_WEBHOOK)


def release_external(now: datetime | None = None) -> list[int]:
    """External turns not finished in time go back to READY (to be taken again) — up to
    AGENTLOOP_EXTERNAL_TURN_ATTEMPTS claims; then the turn fails and the user is told,
    rather than being offered to agents that keep dropping it, forever."""
    now = now or timezone.now()
    deadline = now - timedelta(seconds=settings.AGENTLOOP_EXTERNAL_TURN_TIMEOUT)
    stale = list(Turn.objects.filter(state=TurnState.RUNNING, owner__startswith="agent:", started_at__lt=deadline)
                 .select_related("conversation__channel"))
    released = []
    for turn in stale:
        if turn.attempts >= settings.AGENTLOOP_EXTERNAL_TURN_ATTEMPTS:
            give_up_external(turn, now)
        elif Turn.transition(turn.pk, TurnState.RUNNING, TurnState.READY, where={"owner": turn.owner},
                             owner="", started_at=None):
            released.append(turn.pk)
    return released


def give_up_external(turn: Turn, now: datetime) -> bool:
    """RUNNING -> FAILED for a turn external agents took and never finished, too often;
    the notice to the user is written in the same transaction."""
    why = f"no external agent finished it in {turn.attempts} attempts"
    with transaction.atomic():
        if not Turn.transition(turn.pk, TurnState.RUNNING, TurnState.FAILED, where={"owner": turn.owner},
                               outcome=why, finished_at=now):
            return False
        ledger.enqueue(turn.conversation, EXTERNAL_GAVE_UP_NOTICE, kind=OutboundKind.NOTICE, turn=turn,
                       reply_target=turn.reply_target, thread_id=turn.thread_id)
        record(EventKind.TURN_FAILED, conversation=turn.conversation, target=f"turn {turn.pk}",
               actor=turn.owner, summary=why)
    return True


def ready_candidates(limit: int) -> list[int]:
    """Oldest ready turns, at most one per conversation and none where a turn runs
    (turns of a conversation run one at a time, in arrival order), leaving those that
    wait for an external agent (`conversations.sql.ready_turns`)."""
    seen: set[int] = set()
    picked: list[int] = []
    for turn_id, conversation_id in sql.ready_turns(limit * 2, PULL_AGENT):
        if conversation_id not in seen:
            seen.add(conversation_id)
            picked.append(turn_id)
    return picked[:limit]


