"""The workers' database steps besides flushing (conversations.flushing makes due
buffers into turns): heartbeats, the work of dead workers recovered, the recovery sweep,
and a turn's history. Each step is small, restartable and safe to run in any number of
processes at once: every claim is a compare-and-swap.

The timing lives in the worker loop (conversations/worker/), which sleeps until the
earliest deadline; django-q2 runs `recovery_sweep` as a slower safety net.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.models import EventKind
from conversations import flushing, liveness, schedules, sql, turns
from conversations.media import for_agents
from conversations.models import (
    Channel,
    Conversation,
    Turn,
    TurnState,
    WorkerHeartbeat,
)
from delivery import ledger
from delivery.models import OutboundKind

log = logging.getLogger(__name__)


class Swept(TypedDict):
    """What one recovery sweep did (django-q2 stores it as the task's result)."""

    recovered: int
    flushed: int
    scheduled: int


# After a streamed reply cut short by a crash of its worker (the turn had acted: it is
# not run again), below what was saved of it.
INTERRUPTED_NOTE = _("⚠️ I was interrupted here, and part of what I was doing may already be done. "
                    "Please check before asking again.")
RECOVERY_NOTICE = _(
    "Sorry — something went wrong while I was working on your last message, and part of "
    "it may already be done. Please check before asking again."
)


# --- workers and recovery ------------------------------------------------------

def beat(owner: str, now: datetime | None = None) -> None:
    now = now or timezone.now()
    updated = WorkerHeartbeat.objects.filter(owner=owner).update(seen_at=now)
    if not updated:  # the first beat, or the others took this worker for dead and forgot it
        WorkerHeartbeat.objects.create(owner=owner, hostname=settings.AGENTLOOP_HOSTNAME, pid=os.getpid(),
                                       started_at=now, seen_at=now)


def retire(owner: str) -> None:
    WorkerHeartbeat.objects.filter(owner=owner).delete()


def dead_owners(now: datetime | None = None) -> list[str]:
    """Owners that are dead: a lock holder whose lock is free (whatever its heartbeat
    says — a worker holding its lock is alive however stale its row), any other whose
    heartbeat went stale, and any whose process on this host is gone. Two statements:
    the heartbeats, then the locks held (in that order: see liveness.released)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.AGENTLOOP_WORKER_STALE_AFTER)
    rows = list(WorkerHeartbeat.objects.values_list("owner", "hostname", "pid", "seen_at"))
    lock_free = liveness.released(owner for owner, *_ in rows)
    dead = []
    for owner, hostname, pid, seen_at in rows:
        judged_by_lock = lock_free is not None and liveness.marks_lock(owner)
        if ((judged_by_lock and lock_free is not None and owner in lock_free) or (seen_at < stale and not judged_by_lock)
                or liveness.gone_from_this_host(owner, hostname, pid)):
            dead.append(owner)
    return dead


def workers_alive(now: datetime | None = None) -> int:
    """Worker loops alive now (their liveness lock held or their heartbeat fresh)."""
    return max(0, WorkerHeartbeat.objects.count() - len(dead_owners(now)))


def recover_turns(owners: Iterable[str], now: datetime | None = None) -> list[int]:
    """Turns left RUNNING by dead workers; returns the ids that will run again."""
    running = Turn.objects.filter(state=TurnState.RUNNING, owner__in=list(owners)).select_related("conversation")
    return [turn.pk for turn in running if give_up_turn(turn, now) == TurnState.READY]


def give_back_orphans(owner: str, held: Iterable[int], older_than: float, now: datetime | None = None) -> list[int]:
    """RUNNING turns stamped with a live `owner` that it does not hold (`held`: the ids
    it runs or is finishing) — e.g. a start whose answer was lost with the connection.
    Only turns started more than `older_than` seconds ago: a fresh one may be on its
    way to the owner. Returns the ids given back."""
    now = now or timezone.now()
    orphans = (Turn.objects.filter(state=TurnState.RUNNING, owner=owner,
                                   started_at__lt=now - timedelta(seconds=older_than))
               .exclude(pk__in=list(held)).select_related("conversation"))
    return [turn.pk for turn in orphans if give_up_turn(turn, now)]


def give_up_turn(turn: Turn, now: datetime | None = None) -> TurnState | None:
    """A running turn its worker no longer runs (it died, or it is shutting down): run it
    again if it fired no effect (nothing external happened yet); otherwise never re-run
    it blindly — fail it and tell the user part of it may be done. Returns the new state,
    or None if the turn was no longer this owner's."""
    now = now or timezone.now()
    with transaction.atomic():
        mine = {"owner": turn.owner}
        if Turn.transition(turn.pk, TurnState.RUNNING, TurnState.READY, where={**mine, "fired_effect": False},
                           owner=""):
            record(EventKind.TURN_RECOVERED, conversation=turn.conversation, target=f"turn {turn.pk}",
                   actor=turn.owner, summary="its worker let go before any effect; it will run again")
            return TurnState.READY
        if Turn.transition(turn.pk, TurnState.RUNNING, TurnState.FAILED, where=mine, finished_at=now,
                           outcome="its worker let go after it fired an effect"):
            # A streamed reply: what was saved of it, marked as interrupted, replaces its
            # preview (docs/streaming.md); read now, not from `turn`, which may be older.
            streamed, preview = Turn.objects.filter(pk=turn.pk).values_list(
                "streamed_text", "preview_message_id").get()
            text = (format_lazy("{}\n\n{}", streamed.rstrip(), INTERRUPTED_NOTE) if streamed.strip()
                    else RECOVERY_NOTICE)
            ledger.enqueue_many([ledger.Reply(turn.conversation, text, OutboundKind.NOTICE, turn=turn,
                                              reply_target=turn.reply_target, thread_id=turn.thread_id,
                                              preview_message_id=preview)])
            record(EventKind.TURN_FAILED, conversation=turn.conversation, target=f"turn {turn.pk}",
                   actor=turn.owner, summary="its worker let go after an external effect; not re-run")
            return TurnState.FAILED
    return None


def forget_workers(owners: Iterable[str]) -> None:
    """Drop heartbeats of dead workers once nothing they held is left running or mid-send."""
    for owner in owners:
        busy = Turn.objects.filter(owner=owner, state=TurnState.RUNNING).exists() or ledger.holds_rows(owner)
        if not busy:
            WorkerHeartbeat.objects.filter(owner=owner).delete()


def agents_in_use() -> list[tuple[str, dict[str, Any]]]:
    """(agent, config) of every active channel, for the worker to prepare at start."""
    return list(Channel.objects.filter(is_active=True).values_list("agent", "agent_config"))


def recovery_sweep(grace_seconds: float = 5.0) -> Swept:
    """django-q2's safety net: if no worker loop is alive, overdue buffers still become
    turns, dead workers' turns are released and due scheduled messages are written to the
    ledger (whose own safety sweep sends them). Scheduled every minute."""
    now = timezone.now()
    owners = dead_owners(now)
    recovered = recover_turns(owners, now)
    recovered += turns.release_external(now)
    flushed = flushing.flush_due(now - timedelta(seconds=grace_seconds))
    scheduled = schedules.send_due(now)  # a tick races a live worker harmlessly (one key per tick)
    forget_workers(owners)
    if recovered or flushed or scheduled:
        log.info("recovery sweep: %d turns recovered, %d buffers flushed, %d scheduled messages written",
                 len(recovered), len(flushed), scheduled)
    return {"recovered": len(recovered), "flushed": len(flushed), "scheduled": scheduled}


def conversation_history(conversation: Conversation, before_turn: Turn, limit: int = 20) -> list[dict[str, str]]:
    """The agent's context since the last /reset, oldest first: each finished turn as a
    user message and the assistant's reply, and the notes added meanwhile (a person's
    decision on a proposal) as system messages (`conversations.sql.history`). A turn's
    files are carried as the lines that describe them (and a voice note's transcript),
    not their bytes again."""
    turns_before, notes = sql.history(conversation.pk, before_turn.pk, conversation.context_reset_at, limit)
    seen = for_agents.seen_by_turns([turn for turn in turns_before if turn.has_media])
    entries = []
    for turn in turns_before:
        content = f"{turn.merged_input}\n{seen[turn.pk]}" if seen.get(turn.pk) else turn.merged_input
        entries.append((turn.created_at, 0, {"role": "user", "content": content}))
        if turn.reply_text:
            entries.append((turn.created_at, 1, {"role": "assistant", "content": turn.reply_text}))
    for note in notes:
        entries.append((note.created_at, 2, {"role": "system", "content": note.text}))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [message for _, _, message in entries]
