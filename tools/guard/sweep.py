"""The sweep: claims past their lease, proposals past their time; and the pruning of old claims."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from agentloop.core import pruning
from agentloop.core.pruning import Budget
from tools.guard.proposals import expire_due, reopen_interrupted, settle_applying
from tools.guard.uncertainty import mark_uncertain, reconcile
from tools.models import ActionClaim, ClaimState, ProposalState


def sweep(now: datetime | None = None) -> dict[str, int]:
    """Claims in flight past their lease become uncertain (and are reconciled where the
    tool can); proposals past their time expire; an Apply interrupted between its two
    steps is undone. Run by the worker and by django-q2."""
    now = now or timezone.now()
    stuck = list(ActionClaim.objects.filter(state=ClaimState.IN_FLIGHT, lease_until__lte=now)[:200])
    reconciled = 0
    for claim in stuck:
        if mark_uncertain(claim, "still in flight after its timeout (its process probably died)"):
            claim.state = ClaimState.UNCERTAIN
            reconciled += reconcile(claim) != ClaimState.UNCERTAIN
    reopened = reopen_interrupted()  # before expiring: a reopened one past its time expires now
    expired = expire_due(now)
    settle_applying()
    return {"uncertain": len(stuck), "reconciled": reconciled, "expired": expired, "reopened": reopened}


def prune(now: datetime, budget: Budget) -> int:
    """Claims whose window ended more than AGENTLOOP_RETAIN_CLAIMS_DAYS ago, done or
    released (never in flight, uncertain or proposed: their outcome is still owed), each
    with its proposal and confirmation once the proposal is decided; in batches
    (agentloop.core.pruning). A claim inside its window is never old enough."""
    cutoff = now - timedelta(days=settings.AGENTLOOP_RETAIN_CLAIMS_DAYS)
    open_proposal = ~Q(proposal__state__in=[ProposalState.APPLIED, ProposalState.FAILED, ProposalState.REJECTED,
                                            ProposalState.EXPIRED])
    deletable = (ActionClaim.objects.filter(state__in=[ClaimState.DONE, ClaimState.RELEASED], expires_at__lt=cutoff)
                 .exclude(Q(proposal__isnull=False) & open_proposal))
    return pruning.delete_old(ActionClaim, "created_at", cutoff, deletable, budget)
