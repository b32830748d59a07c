"""Outcomes: what one attempt's result does to its row (delivered, deferred, resent,
unreachable, abandoned), and giving back a claim whose send did not leave."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, transaction
from django.db.models import F
from django.utils import timezone

from agentloop.core import metrics
from agentloop.core.redaction import redact
from audit.events import record, record_many
from audit.models import EventKind
from delivery import console, pacing, sql
from delivery.ledger.replies import BACKOFF, MAX_RESENDS, NOT_SENT_MAX_WAIT, enabled
from delivery.models import OutboundMessage, OutboundState, Outcome, UnreachableChat, channel_model
from delivery.retry_after import clamp_retry_after
from delivery.transports import SendResult, transport_for

log = logging.getLogger("delivery.ledger")  # the name it had as one module

# A claimed row and what its send came to.
Sent = tuple[OutboundMessage, SendResult]


def finish_many(outcomes: Sequence[Sent], owner: str, now: datetime | None = None) -> None:
    """Record send outcomes. Deliveries — nearly all of them — are one UPDATE for the
    whole batch (each row's platform id chosen by CASE); the rest one by one.

    Rows are isolated: each write runs in a savepoint of the caller's transaction, so one
    row that cannot be recorded never undoes the others' (a rolled-back "delivered" mark
    would be resent, labelled). A row that fails stays `attempting` and is recovered as
    an orphan. Only the database going away is raised (the caller retries the batch)."""
    now = now or timezone.now()
    unrecorded = [result for row, result in outcomes if row.pk is None]
    if unrecorded:  # the ledger is off: one try each, nothing to write down
        _count_unrecorded(unrecorded)
    outcomes = [(row, result) for row, result in outcomes if row.pk is not None]
    delivered = [(row, result) for row, result in outcomes if result.ok]
    if delivered:
        _record_deliveries(delivered, owner, now)
    failures = [row.pk for row, result in outcomes if not result.ok and not _isolated(finish, row, owner, result, now)]
    if failures:
        log.error("could not record the outcome of ledger rows %s; they will be recovered as orphans", failures)
    console.sends_recorded(outcomes)


def _record_deliveries(delivered: list[Sent], owner: str, now: datetime) -> None:
    def batch() -> None:
        won = sql.mark_delivered([(row.pk, result.platform_message_id) for row, result in delivered], owner, now)
        _after_delivery([row for row, _ in delivered if row.pk in won], now)

    if len(delivered) > 1 and _isolated(batch):
        return
    failures = [row.pk for row, result in delivered if not _isolated(_record_delivery, row, result, owner, now)]
    if failures:
        log.error("could not record the delivery of ledger rows %s; they will be recovered as orphans", failures)


def _record_delivery(row: OutboundMessage, result: SendResult, owner: str, now: datetime) -> None:
    won = sql.mark_delivered([(row.pk, result.platform_message_id)], owner, now)
    _after_delivery([row] if row.pk in won else [], now)


def _isolated(write: Callable[..., object], *args: Any) -> bool:
    """Run one write in a savepoint; False (rolled back to the savepoint) if it failed
    for any reason but the database going away."""
    try:
        with transaction.atomic():
            write(*args)
        return True
    except (OperationalError, InterfaceError):
        raise
    except (DatabaseError, ArithmeticError, ValueError, TypeError):
        log.exception("recording a ledger outcome failed")
        return False


def _after_delivery(rows: list[OutboundMessage], now: datetime) -> None:
    """The rows whose delivery this worker recorded (its compare-and-swap won)."""
    metrics.after_commit(_count_deliveries, [((now - row.created_at).total_seconds(), row.needs_marker)
                                             for row in rows])
    record_many([dict(kind=EventKind.REPLY_RECOVERED, conversation_id=row.conversation_id,
                      channel_slug=row.channel.slug, actor=row.owner, target=f"ledger row {row.pk}",
                      summary=f"resent with the recovery prefix (attempt {row.attempts})",
                      attempts=row.attempts)
                 for row in rows if row.needs_marker])
    chats = {(row.channel_id, row.chat_id) for row in rows}
    if chats and UnreachableChat.objects.filter(channel_id__in={c for c, _ in chats}).exists():
        for channel_id, chat_id in chats:  # it was reached again: not unreachable any more
            UnreachableChat.objects.filter(channel_id=channel_id, chat_id=chat_id).delete()


def _count_deliveries(deliveries: list[tuple[float, bool]]) -> None:
    for seconds, labelled in deliveries:
        metrics.REPLY_ATTEMPTS.labels(Outcome.DELIVERED).inc()
        metrics.DELIVERY_SECONDS.observe(max(0.0, seconds))
        if labelled:
            metrics.REPLIES_RECOVERED.inc()


def _count_unrecorded(results: list[SendResult]) -> None:
    for result in results:
        metrics.REPLY_ATTEMPTS.labels(result.outcome).inc()
        if not result.ok:
            metrics.REPLIES_ABANDONED.inc()


def resends_used(row: OutboundMessage) -> int:
    """Resends spent so far: attempts after the first (a deferred send gave its own back)."""
    return max(0, row.attempts - 1)


def finish(row: OutboundMessage, owner: str, result: SendResult, now: datetime | None = None) -> OutboundState | None:
    """Record one attempt's outcome (a compare-and-swap on the claim we hold). Returns
    where a failed send left the row (None: delivered, or the ledger is off)."""
    now = now or timezone.now()
    if result.ok:
        finish_many([(row, result)], owner, now)
        return None
    def mine(new_state: str, **fields: Any) -> int:
        return OutboundMessage.transition(row.pk, OutboundState.ATTEMPTING, new_state,
                                          where={"owner": owner, "claim_token": row.claim_token}, **fields)

    metrics.after_commit(metrics.REPLY_ATTEMPTS.labels(result.outcome).inc)
    error = redact(result.error)[:300]
    if not enabled():
        # No ledger: one try, then the reply is given up (and said so in the log).
        if mine(OutboundState.ABANDONED, last_outcome=result.outcome, last_error=error, next_attempt_at=None):
            metrics.after_commit(metrics.REPLIES_ABANDONED.inc)
        return None
    if result.outcome in (Outcome.FLOOD, Outcome.NOT_SENT):
        return _defer(row, owner, result, error, now)
    if result.outcome == Outcome.CHANNEL_BLOCKED:
        return wait_for_channel(row, owner, error, now)
    if result.outcome == Outcome.PERMANENT:
        with transaction.atomic():
            if mine(OutboundState.UNREACHABLE, last_outcome=result.outcome, last_error=error,
                    next_attempt_at=None):
                if result.chat_unreachable:
                    mark_unreachable(row, error, now)
                else:  # the message was refused, not the chat (a template): the chat stays reachable
                    _audit_abandoned(row, f"never retried: {error}")
        return OutboundState.UNREACHABLE
    # Temporary or ambiguous: a resend, on the budget.
    next_resend = resends_used(row) + 1
    budget = MAX_RESENDS + row.extra_resends
    if next_resend > budget:
        with transaction.atomic():
            if mine(OutboundState.ABANDONED, last_outcome=result.outcome, last_error=error,
                    next_attempt_at=None):
                _audit_abandoned(row, f"{budget} resends spent; last error: {error}")
        return OutboundState.ABANDONED
    # The last budgeted resend is kept for the next worker start.
    when = None if next_resend == budget else now + BACKOFF[min(next_resend, len(BACKOFF)) - 1]
    mine(OutboundState.FAILED, next_attempt_at=when, last_outcome=result.outcome, last_error=error)
    return OutboundState.FAILED


def _defer(row: OutboundMessage, owner: str, result: SendResult, error: str, now: datetime) -> OutboundState:
    """The send provably did not leave (a flood refused it; no connection could be had or
    made): the row waits and goes out again as it would have — unlabelled unless the chunk
    it stopped at carried the label — and the attempt is given back. A flood pauses the
    whole bot (every row of it; of an unpaced channel, every row of the channel) for the
    penalty; a send that never left waits 1 s, then 2, 4… up to a minute (the 24-hour
    freshness still bounds it)."""
    if result.outcome == Outcome.FLOOD:
        wait = clamp_retry_after(result.retry_after)
        pace = transport_for(row.channel).pace(row.chat_id)
        # On this host's clock (`now`, injectable): a second's skew is nothing here. An
        # unpaced channel's rows wait too (the claims read its key: claiming._not_flooded,
        # sql.claim_pending).
        pacing.pause(pacing.flood_pause_key(pace, row.channel_id), wait, clock=now.timestamp())
    else:
        wait = min(2.0 ** row.flood_waits, NOT_SENT_MAX_WAIT)
    _give_back(row, owner, OutboundState.FAILED, flood_waits=F("flood_waits") + 1,
               next_attempt_at=now + timedelta(seconds=wait), last_outcome=result.outcome, last_error=error)
    return OutboundState.FAILED


def _give_back(row: OutboundMessage, owner: str, state: str, **fields: Any) -> int:
    """Undo our claim of a row whose send did not leave: the attempt it counted returned,
    and the chunk it stopped at left as it was before (labelled next time only if it
    carried the label this time — its earlier send may have landed)."""
    carried_label = row.needs_marker and row.chunks_delivered == getattr(row, "resumed_at", row.chunks_delivered)
    fields.setdefault("next_attempt_at", timezone.now())
    return OutboundMessage.transition(
        row.pk, OutboundState.ATTEMPTING, state, where={"owner": owner, "claim_token": row.claim_token},
        owner="", claim_token="", claimed_at=None, attempts=F("attempts") - 1, needs_marker=False,
        chunks_started=F("chunks_delivered") + (1 if carried_label else 0), **fields)


def _waiting_state(row: OutboundMessage) -> OutboundState:
    """Where a claimed row waits when its attempt is given back: pending if it was never
    tried before, else failed (a timer makes it due)."""
    return OutboundState.PENDING if row.attempts <= 1 else OutboundState.FAILED


def wait_for_channel(row: OutboundMessage, owner: str, error: str, now: datetime) -> OutboundState:
    """The platform refused the channel's credentials: nothing was sent, so the row goes
    back to waiting as it was before the claim (its attempt given back: a dead token must
    not spend the resend budget), and the channel's replies wait until an operator saves
    it again (Channel.save recomputes send_blocked). Audited once per block."""
    Channel: Any = channel_model()  # conversations' (its manager's own methods are not typed down here)
    before = _waiting_state(row)
    with transaction.atomic():
        _give_back(row, owner, before, next_attempt_at=now, last_outcome=Outcome.CHANNEL_BLOCKED, last_error=error)
        if Channel.objects.filter(pk=row.channel_id, send_blocked="").update(send_blocked=error or "refused"):
            Channel.objects.forget_cached()
            record(EventKind.CHANNEL_BLOCKED, channel_slug=row.channel.slug, actor=row.owner or owner,
                   target=f"channel {row.channel.slug}",
                   summary=f"replies wait until the channel is saved again: {error}"[:300], ledger_row=row.pk)
    return before


def mark_unreachable(row: OutboundMessage, error: str, now: datetime) -> None:
    mark, created = UnreachableChat.objects.get_or_create(
        channel_id=row.channel_id, chat_id=row.chat_id, defaults={"error": error, "since": now,
                                                                   "last_failure_at": now})
    if not created:
        UnreachableChat.objects.filter(pk=mark.pk).update(error=error, last_failure_at=now,
                                                          failures=F("failures") + 1)
        return
    record(EventKind.CHAT_UNREACHABLE, conversation_id=row.conversation_id, channel_slug=row.channel.slug,
           actor=row.owner, target=f"chat {row.chat_id}", summary=f"never retried: {error}"[:300],
           ledger_row=row.pk)


def _audit_abandoned(row: OutboundMessage, why: str) -> None:
    metrics.after_commit(metrics.REPLIES_ABANDONED.inc)
    record(EventKind.REPLY_ABANDONED, conversation_id=row.conversation_id, channel_slug=row.channel.slug,
           actor=row.owner or "ledger", target=f"ledger row {row.pk}", summary=why[:300], ledger_row=row.pk)


def release(rows: Iterable[OutboundMessage], owner: str) -> int:
    """Give back claimed rows this owner did not send: as they were before the claim
    (the attempt it counted is returned, so an unsent row goes out plain if it never
    went out before)."""
    return sum(_give_back(row, owner, _waiting_state(row)) for row in rows)
