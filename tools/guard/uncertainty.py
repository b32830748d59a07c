"""Uncertainty: a claim interrupted in flight may have happened; the tool reconciles it
when it can look itself up, or an operator releases it."""

from __future__ import annotations

import logging

from django.db import transaction

from audit.events import record
from audit.models import EventKind
from tools import registry
from tools.guard.helpers import _call_of, transition
from tools.models import ActionClaim, ClaimState
from tools.registry import CannotReconcile

log = logging.getLogger("tools.guard")  # the name it had as one module


def mark_uncertain(claim: ActionClaim, reason: str = "its run was interrupted") -> bool:
    with transaction.atomic():
        moved = transition(claim.pk, [ClaimState.IN_FLIGHT], ClaimState.UNCERTAIN, error=reason[:1000])
        if moved:
            record(EventKind.ACTION_UNCERTAIN, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
                   actor="guard", target=f"claim {claim.pk}", summary=f"{claim.action}: {reason}"[:300],
                   tool=claim.action, claim=claim.pk, agent_key=claim.agent_key_id)
    return moved


def reconcile(claim: ActionClaim, actor: str = "guard") -> str:
    """Ask the tool whether an uncertain action happened. Returns the claim's state after."""
    try:
        tool = registry.get(claim.action)
    except registry.UnknownTool:
        return claim.state  # an external agent's own action: only it (or an operator) knows
    try:
        found = tool.reconcile(_call_of(claim))
    except CannotReconcile:
        return claim.state
    except Exception:
        log.exception("reconciling claim %s failed", claim.pk)
        return claim.state
    with transaction.atomic():
        if found is not None:
            moved, state = transition(claim.pk, [ClaimState.UNCERTAIN], ClaimState.DONE, result=found), ClaimState.DONE
        else:
            moved, state = transition(claim.pk, [ClaimState.UNCERTAIN], ClaimState.RELEASED,
                                       error="reconciled: it did not happen"), ClaimState.RELEASED
        if moved:
            what = "it had happened" if found is not None else "it had not happened"
            record(EventKind.ACTION_RECONCILED, conversation_id=claim.conversation_id,
                   channel_slug=claim.channel_slug, actor=actor, target=f"claim {claim.pk}",
                   summary=f"{claim.action}: {what}", tool=claim.action, claim=claim.pk, found=found is not None,
                   agent_key=claim.agent_key_id)
    return state if moved else ActionClaim.objects.values_list("state", flat=True).get(pk=claim.pk)


def release(claim_id: int, *, by: str, reason: str = "released by an operator") -> bool:
    """An operator's decision for an uncertain (or stuck) claim: it did not happen."""
    claim = ActionClaim.objects.get(pk=claim_id)
    with transaction.atomic():
        moved = transition(claim_id, [ClaimState.UNCERTAIN, ClaimState.IN_FLIGHT], ClaimState.RELEASED,
                            error=reason)
        if moved:
            record(EventKind.CLAIM_RELEASED, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
                   actor=by, target=f"claim {claim.pk}", summary=f"{claim.action}: {reason}", tool=claim.action,
                   claim=claim.pk)
    return moved
