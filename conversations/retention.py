"""Retention: how long each kind of data is kept, and the sweep that deletes what is older
(django-q2 runs `conversations.retention.sweep` every 10 minutes; `manage.py
sweepretention` runs it by hand). docs/operations.md#retention.

Each kind is deleted oldest first in batches of AGENTLOOP_RETENTION_BATCH rows, one short
transaction each (agentloop.core.pruning), never what a guarantee still needs:

- an open buffer, or the messages of a buffer whose turn still exists (they are the
  turn's input and its files' descriptions), a ready or running turn;
- a conversation's 20 newest finished turns and notes while the conversation is active
  (a turn within the retention): what its agent reads as history;
- an open ledger row (delivery.ledger.prune), a claim inside its window or whose outcome
  is still owed (tools.guard.sweep.prune);
- a file being fetched; a stored file's bytes while any row still names them;
- a chat's platform address (conversations.addresses) while a message of the chat is
  younger than the retention;
- a schedule still waiting for a tick (only sent or cancelled ones go); an unreachable
  chat's mark while sends to it are still refused (it goes once none has been for the
  retention: the chat's id is personal data, and a new refusal marks it again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from django.utils.translation import gettext, ngettext

from agentloop.core import idempotency, pruning
from audit import events as audit_events
from conversations.models import (
    SETTLED,
    BufferState,
    ContextNote,
    InboundMessage,
    MediaFile,
    MessageBuffer,
    PlatformAddress,
    Turn,
    TurnState,
)
from delivery import ledger
from delivery.models import ScheduledMessage, ScheduleState, UnreachableChat
from tools.guard.sweep import prune as prune_claims

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from agentloop.core.pruning import Budget

log = logging.getLogger(__name__)

HISTORY_TURNS = 20  # conversations.engine.conversation_history's limit
FINISHED_TURNS = [TurnState.DONE, TurnState.CANCELLED, TurnState.FAILED]


def defaults() -> list[tuple[str, str]]:
    """(kind of data, how long it is kept) as the admin shows them, in the reader's language."""
    days = {name: getattr(settings, f"AGENTLOOP_RETAIN_{name}_DAYS")
            for name in ("MESSAGES", "LEDGER", "CLAIMS", "AUDIT", "SCHEDULES", "UNREACHABLE")}

    def span(name: str) -> str:
        count = days[name]
        return ngettext("%(count)s day", "%(count)s days", int(count)) % {"count": f"{count:g}"}

    history = span("MESSAGES")
    return [
        (gettext("Inbound messages, edits, files (rows and bytes)"),
         gettext("%(span)s (never while their turn is kept)") % {"span": history}),
        (gettext("Buffers, turns, notes for the agent"),
         gettext("%(span)s; open buffers and ready/running turns never; a conversation's %(turns)s newest turns "
                 "and notes while it is active") % {"span": history, "turns": HISTORY_TURNS}),
        (gettext("Delivery ledger"),
         gettext("%(span)s once delivered, abandoned or unreachable; open rows never") % {"span": span("LEDGER")}),
        (gettext("Scheduled messages"),
         gettext("%(span)s after their last tick (or, never sent, their creation) once sent or cancelled; waiting "
                 "ones never") % {"span": span("SCHEDULES")}),
        (gettext("Unreachable chats (the mark)"),
         gettext("%(span)s after the last refused send") % {"span": span("UNREACHABLE")}),
        (gettext("Guard claims and proposals"),
         gettext("%(span)s after their window; in flight, uncertain or awaiting approval never")
         % {"span": span("CLAIMS")}),
        (gettext("Audit events"), span("AUDIT")),
        (gettext("API idempotency keys (the first answer kept)"), gettext("24 hours")),
    ]


def sweep(now: datetime | None = None, budget_seconds: float | None = None) -> dict[str, int]:
    """One round over every kind, within the time budget; the counts deleted per table."""
    now = now or timezone.now()
    seconds = settings.AGENTLOOP_RETENTION_SWEEP_BUDGET if budget_seconds is None else budget_seconds
    budget = pruning.Budget(time.monotonic() + seconds, settings.AGENTLOOP_RETENTION_BATCH)
    cutoff = now - timedelta(days=settings.AGENTLOOP_RETAIN_MESSAGES_DAYS)
    ledger.prune(now, budget)
    _prune_schedules(now, budget)
    _prune_unreachable_chats(now, budget)
    _prune_turns(cutoff, budget)
    _prune_messages(cutoff, budget)
    _prune_buffers(cutoff, budget)
    _prune_notes(cutoff, budget)
    _prune_files(cutoff, budget)
    _prune_addresses(cutoff, budget)
    prune_claims(now, budget)
    audit_events.prune(now, budget)
    idempotency.prune(now, budget)
    deleted = {label: n for label, n in budget.deleted.items() if n}
    if deleted:
        log.info("retention: deleted %s", ", ".join(f"{n} {label}" for label, n in deleted.items()))
    return deleted


def _in_history(model: type[Turn] | type[ContextNote], cutoff: datetime) -> Q:
    """Rows the agent still reads: among their conversation's HISTORY_TURNS newest (of that
    kind), in a conversation with a turn since `cutoff`."""
    newer: QuerySet[Any] = model.objects.filter(conversation_id=OuterRef("conversation_id"), pk__gt=OuterRef("pk"))
    if model is Turn:
        newer = newer.filter(state=TurnState.DONE)
    active = Turn.objects.filter(conversation_id=OuterRef("conversation_id"), created_at__gte=cutoff)
    return ~Exists(newer.order_by()[HISTORY_TURNS - 1:HISTORY_TURNS]) & Exists(active)


def _prune_turns(cutoff: datetime, budget: Budget) -> None:
    deletable = Turn.objects.filter(state__in=FINISHED_TURNS, created_at__lt=cutoff).exclude(_in_history(Turn, cutoff))
    pruning.delete_old(Turn, "created_at", cutoff, deletable, budget)


def _prune_messages(cutoff: datetime, budget: Budget) -> None:
    kept_buffer = Q(buffer__state=BufferState.OPEN) | Q(buffer__turn__isnull=False)
    deletable = InboundMessage.objects.filter(received_at__lt=cutoff).exclude(Q(buffer__isnull=False) & kept_buffer)
    pruning.delete_old(InboundMessage, "received_at", cutoff, deletable, budget)


def _prune_buffers(cutoff: datetime, budget: Budget) -> None:
    deletable = MessageBuffer.objects.filter(last_message_at__lt=cutoff).exclude(state=BufferState.OPEN).filter(
        turn__isnull=True, messages__isnull=True)
    pruning.delete_old(MessageBuffer, "first_message_at", cutoff, deletable, budget)


def _prune_notes(cutoff: datetime, budget: Budget) -> None:
    deletable = ContextNote.objects.filter(created_at__lt=cutoff).exclude(_in_history(ContextNote, cutoff))
    pruning.delete_old(ContextNote, "created_at", cutoff, deletable, budget)


def _prune_files(cutoff: datetime, budget: Budget) -> None:
    deletable = MediaFile.objects.filter(state__in=SETTLED, created_at__lt=cutoff, messages__isnull=True)
    pruning.delete_old(MediaFile, "created_at", cutoff, deletable, budget, on_delete=forget_bytes_on_commit)


def _prune_addresses(cutoff: datetime, budget: Budget) -> None:
    """A chat's platform address goes with its messages: unchanged since the cutoff and no
    message of the chat received since (a chat still talking keeps it; a new message
    writes it again)."""
    recent = InboundMessage.objects.filter(channel_id=OuterRef("channel_id"), conversation__chat_id=OuterRef("chat_id"),
                                           received_at__gte=cutoff)
    deletable = PlatformAddress.objects.filter(updated_at__lt=cutoff).exclude(Exists(recent))
    # Walked by `created_at` (it grows with the id); judged by the last change.
    pruning.delete_old(PlatformAddress, "created_at", cutoff, deletable, budget)


def _prune_schedules(now: datetime, budget: Budget) -> None:
    cutoff = now - timedelta(days=settings.AGENTLOOP_RETAIN_SCHEDULES_DAYS)
    last_tick_before = Q(last_sent_at__lt=cutoff) | Q(last_sent_at__isnull=True, created_at__lt=cutoff)
    deletable = ScheduledMessage.objects.filter(last_tick_before, state__in=[ScheduleState.SENT,
                                                                             ScheduleState.CANCELLED])
    pruning.delete_old(ScheduledMessage, "created_at", cutoff, deletable, budget)


def _prune_unreachable_chats(now: datetime, budget: Budget) -> None:
    cutoff = now - timedelta(days=settings.AGENTLOOP_RETAIN_UNREACHABLE_DAYS)
    # Walked by `since` (it grows with the id); judged by the last refusal.
    deletable = UnreachableChat.objects.filter(last_failure_at__lt=cutoff)
    pruning.delete_old(UnreachableChat, "since", cutoff, deletable, budget)


def forget_bytes_on_commit(file_ids: Iterable[int]) -> None:
    """Called in the transaction that deletes these files' rows: once it commits, their
    stored bytes are deleted from the default storage unless a row still names them (the
    same bytes in another file of the channel: names are the bytes' digest)."""
    names = set(MediaFile.objects.filter(pk__in=list(file_ids)).exclude(storage_name="")
                .values_list("storage_name", flat=True))
    if names:
        transaction.on_commit(lambda: delete_unnamed(names))


def delete_unnamed(names: Collection[str]) -> int:
    """Delete the stored objects among `names` that no file row names any more."""
    named = set(MediaFile.objects.filter(storage_name__in=list(names)).values_list("storage_name", flat=True))
    gone = 0
    for name in sorted(set(names) - named):
        try:
            default_storage.delete(name)
            gone += 1
        except OSError:
            log.warning("retention: could not delete a stored file (%s); it stays", name.rsplit("/", 1)[-1][:12])
    return gone
