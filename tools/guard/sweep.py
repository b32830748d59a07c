"""The sweep: claims past their lease, proposals past their time."""


from django.utils import timezone

from tools import hooks
from tools.guard.uncertainty import mark_uncertain, reconcile
from tools.models import ActionClaim, ClaimState


def sweep(now=None) -> dict:
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
    reopened = hooks.reopen_interrupted()  # before expiring: a reopened one past its time expires now
    expired = hooks.expire_due(now)
    hooks.settle_applying()
    return {"uncertain": len(stuck), "reconciled": reconciled, "expired": expired, "reopened": reopened}
