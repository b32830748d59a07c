"""Sweeps: abandoning what is stale, pruning what is finished, an operator's retry and
abandon, and django-q2's safety sweep."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast
from django.utils import timezone

from agentloop.core import pruning
from agentloop.core.rows import Rare
from delivery import attachments, pacing
from delivery.ledger.claiming import _fresh, _within_budget, claim_many, claimable_ids
from delivery.ledger.outcomes import _audit_abandoned, finish_many, release, resends_used
from delivery.ledger.replies import MAX_RESENDS, PACED_RETRY, attempt_timeout
from delivery.ledger.sending import send
from delivery.models import OutboundMessage, OutboundState, UnreachableChat
from delivery.transports import close_clients

if TYPE_CHECKING:
    from django.db.models import QuerySet

log = logging.getLogger(__name__)


class ChannelHealth(TypedDict):
    last_error: dict[str, Any] | None  # {"last_error", "claimed_at"} of its latest failed send
    unreachable: list[tuple[str, str, datetime]]  # (chat id, error, since), the latest 50


class SweepDone(TypedDict):
    abandoned: int
    sent: int


def abandon_stale(now: datetime | None = None, dead_owners: Collection[str] = ()) -> int:
    """Open rows past their freshness, or past their resend budget with nobody sending
    them, are abandoned."""
    now = now or timezone.now()
    idle = Q(state__in=[OutboundState.PENDING, OutboundState.FAILED]) | Q(
        state=OutboundState.ATTEMPTING, claimed_at__lt=now - attempt_timeout())
    if dead_owners:
        idle |= Q(state=OutboundState.ATTEMPTING, owner__in=list(dead_owners))
    stale = Q(state__in=OutboundMessage.OPEN) & ~_fresh(now)
    spent = ~_within_budget()
    abandoned = 0
    # Open rows are few among the ledger's millions: said so (rows.Rare), or SQLite, with
    # statistics on the file, walked the whole ledger by channel (420 ms a sweep).
    rows = OutboundMessage.objects.select_related("channel").filter(Rare(Q(state__in=OutboundMessage.OPEN)))
    for row in rows.filter(idle & (stale | spent))[:500]:
        with transaction.atomic():
            if OutboundMessage.transition(row.pk, row.state, OutboundState.ABANDONED,
                                          where={"attempts": row.attempts}, next_attempt_at=None):
                why = "resend budget spent" if row.attempts > row.extra_resends + MAX_RESENDS \
                    else f"older than {row.channel.recovery_freshness.total_seconds() / 3600:g} h (its channel's freshness)"
                _audit_abandoned(row, f"{why}; last error: {row.last_error or '—'}")
                abandoned += 1
    return abandoned


def prune(now: datetime | None = None, budget: pruning.Budget | None = None) -> int:
    """Finished rows (delivered, abandoned, unreachable) older than
    AGENTLOOP_RETAIN_LEDGER_DAYS (7) are deleted, in batches (agentloop.core.pruning);
    open ones never; the stored bytes of the files they carried with them, unless a kept
    row names the same object. Run by the retention sweep (conversations.retention)."""
    now = now or timezone.now()
    budget = budget or pruning.Budget(time.monotonic() + settings.AGENTLOOP_RETENTION_SWEEP_BUDGET,
                                      settings.AGENTLOOP_RETENTION_BATCH)
    cutoff = now - timedelta(days=settings.AGENTLOOP_RETAIN_LEDGER_DAYS)
    finished = [OutboundState.DELIVERED, OutboundState.ABANDONED, OutboundState.UNREACHABLE]
    deletable = OutboundMessage.objects.filter(state__in=finished, created_at__lt=cutoff)
    return pruning.delete_old(OutboundMessage, "created_at", cutoff, deletable, budget,
                              on_delete=_forget_files_on_commit)


def _with_files() -> QuerySet[Any]:  # annotated with raw_chunks, which the type does not know
    return OutboundMessage.objects.annotate(raw_chunks=Cast("chunks", TextField())).filter(
        raw_chunks__contains='"files"')


def _forget_files_on_commit(ids: Iterable[int]) -> None:
    """In the transaction deleting these rows: the files they carried, deleted once it commits."""
    names: set[str] = set()
    for pieces in _with_files().filter(pk__in=list(ids)).values_list("chunks", flat=True):
        names |= attachments.stored_names(pieces)
    if names:
        transaction.on_commit(lambda: delete_unnamed_files(names))


def delete_unnamed_files(names: Iterable[str]) -> int:
    """Delete the stored reply files among `names` that no ledger row names any more
    (names are the bytes' digest per channel: the same file sent twice is one object)."""
    gone = 0
    for name in sorted(names):
        channel = name.split("/")[1] if name.count("/") >= 2 else ""
        named = _with_files().filter(raw_chunks__contains=f'"{name}"')
        if channel.isdigit():
            named = named.filter(channel_id=int(channel))
        if named.exists():
            continue
        try:
            default_storage.delete(name)
            gone += 1
        except OSError:
            log.warning("retention: could not delete a reply's stored file (%s); it stays",
                        name.rsplit("/", 1)[-1][:12])
    return gone


def retry_now(ids: Iterable[int], by: str = "operator") -> int:
    """An operator's "retry now": failed, abandoned or unreachable rows get one more
    resend, due at once (they will carry the recovery prefix)."""
    now = timezone.now()
    moved = 0
    retriable = (OutboundState.FAILED, OutboundState.ABANDONED, OutboundState.UNREACHABLE)
    # By id only, the state checked here: SQLite would walk every abandoned row through
    # the state index instead (see conversations.turns.finish_many).
    for row in [row for row in OutboundMessage.objects.filter(pk__in=list(ids)) if row.state in retriable]:
        grant = max(0, resends_used(row) + 1 - MAX_RESENDS - row.extra_resends)
        moved += OutboundMessage.transition(
            row.pk, row.state, OutboundState.FAILED, next_attempt_at=now, extra_resends=F("extra_resends") + grant,
            retried_at=now, last_error=f"retry requested by {by}"[:300])
    return moved


def abandon(ids: Iterable[int], by: str = "operator") -> int:
    rows = OutboundMessage.objects.select_related("channel").filter(
        pk__in=list(ids), state__in=[OutboundState.PENDING, OutboundState.FAILED])
    abandoned = 0
    for row in rows:
        with transaction.atomic():
            if OutboundMessage.transition(row.pk, row.state, OutboundState.ABANDONED, next_attempt_at=None):
                _audit_abandoned(row, f"abandoned by {by}")
                abandoned += 1
    return abandoned


def channel_health(channel_id: int) -> ChannelHealth:
    """For the admin's channel page: the last error and the unreachable chats."""
    last = (OutboundMessage.objects.filter(channel_id=channel_id).exclude(last_error="")
            .order_by("-claimed_at").values("last_error", "claimed_at").first())
    unreachable = list(UnreachableChat.objects.filter(channel_id=channel_id).order_by("-last_failure_at")
                       .values_list("chat_id", "error", "since")[:50])
    return {"last_error": last, "unreachable": unreachable}


def safety_sweep(budget: float | None = None, batch: int = 1) -> SweepDone:
    """django-q2's safety net (every minute): abandon stale rows, and deliver what is due
    when no worker loop is doing it — the claims make racing a live worker harmless.

    It claims a small batch at a time (one row by default: a row claimed is a row being
    sent, so a sweep killed at django-q2's task timeout — or by anything — never leaves
    a delivered row `attempting` nor spends an attempt of a row it did not send),
    records each outcome right after its send, stops claiming when its time budget is
    spent, and gives back whatever it claimed and did not send. A due row whose chat or
    bot has no send slot yet (pacing) is waited for, within the budget."""
    abandoned = abandon_stale()
    pacing.forget_spent()
    owner = f"tasks:{os.uname().nodename}:{os.getpid()}"
    deadline = time.monotonic() + (settings.AGENTLOOP_SAFETY_SWEEP_BUDGET if budget is None else budget)
    loop = asyncio.new_event_loop()
    sent = 0
    try:
        while time.monotonic() < deadline:
            now = timezone.now()
            # Leave fresh rows to the worker loop, which sends them within milliseconds.
            due = claimable_ids(limit=batch, now=now, older_than=now - timedelta(seconds=30))
            rows = claim_many(due, owner)
            if not rows and not due:
                break
            if not rows:  # due, but paced: its chat or bot has no slot yet
                time.sleep(min(PACED_RETRY, max(deadline - time.monotonic(), 0)))
                continue
            sent += _send_each(loop, rows, owner, deadline)
    finally:
        loop.run_until_complete(close_clients())
        loop.close()
    return {"abandoned": abandoned, "sent": sent}


def _send_each(loop: asyncio.AbstractEventLoop, rows: list[OutboundMessage], owner: str, deadline: float) -> int:
    for done, row in enumerate(rows):
        if time.monotonic() >= deadline:
            release(rows[done:], owner)
            return done
        result = loop.run_until_complete(send(row))
        finish_many([(row, result)], owner)
    return len(rows)
