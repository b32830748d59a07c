"""Claiming: the insert under the unique constraint that admits one live claim per
fingerprint; what a caught duplicate is told."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from agentloop.core import metrics
from audit.events import record
from audit.models import EventKind
from tools.fingerprint import Fingerprint
from tools.guard.helpers import _original, check_arguments, humanize
from tools.guard.outcomes import Outcome, Status
from tools.models import ActionClaim, ClaimState, Confirmation, ToolPolicy
from tools.registry import Scope


@dataclass
class Attempt:
    claim: ActionClaim
    created: bool


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """What a claim is asked for: the action and its arguments in a scope, their
    fingerprint, and the action's policy (its window, lease and hourly limit)."""

    action: str
    arguments: dict[str, Any]
    scope: Scope
    fp: Fingerprint
    policy: ToolPolicy

    def __post_init__(self) -> None:
        check_arguments(self.arguments)  # before anything is claimed


def take_claim(request: ClaimRequest, *, owner: str, agent_key_id: int | None = None, proposed: bool = False,
               on_created: Callable[[ActionClaim], object] | None = None) -> Attempt:
    """Insert the claim, or return the live claim that holds this fingerprint.

    The insert is the guard: the unique constraint admits one live claim per
    fingerprint, across threads and processes. A claim whose window has passed is
    retired (no longer live) so the same action later is a new action.
    """
    action, arguments, scope, fp, policy = (request.action, request.arguments, request.scope, request.fp,
                                            request.policy)
    for _ in range(5):
        now = timezone.now()
        try:
            with transaction.atomic():
                claim = ActionClaim.objects.create(
                    scope=scope.key, action=action, fingerprint=fp.digest, fingerprint_fields=fp.fields,
                    fingerprint_material=fp.material, arguments=arguments,
                    state=ClaimState.PROPOSED if proposed else ClaimState.IN_FLIGHT, owner=owner,
                    conversation_id=scope.conversation_id, channel_slug=scope.channel_slug,
                    agent_key_id=agent_key_id, created_at=now,
                    expires_at=now + timedelta(seconds=policy.window_seconds),
                    lease_until=now + timedelta(seconds=policy.timeout_seconds),
                )
                _check_rate(claim, policy)
                if on_created is not None:
                    on_created(claim)
                metrics.after_commit(metrics.ACTIONS_CLAIMED.labels(action).inc)
            return Attempt(claim, True)
        except IntegrityError:
            existing = ActionClaim.objects.filter(scope=scope.key, action=action, fingerprint=fp.digest,
                                                  live=True).first()
            if existing is None:
                continue  # released between our insert and our look: try again
            if existing.expires_at <= now and existing.state not in (ClaimState.IN_FLIGHT, ClaimState.PROPOSED):
                ActionClaim.objects.filter(pk=existing.pk, live=True).update(live=False)
                continue
            return Attempt(existing, False)
    raise RuntimeError(f"could not claim {action} for {scope.key}: the claim kept changing")


class RateLimited(Exception):
    """The scope has used its calls of this action for the hour (ToolPolicy.max_per_hour)."""


def _check_rate(claim: ActionClaim, policy: ToolPolicy) -> None:
    """Called just after the new claim's insert, in its transaction: an identical call
    never gets here (it is a duplicate, not a new action), and a refusal rolls the insert
    back. Released claims (failed, rejected) did nothing and do not count."""
    if not policy.max_per_hour:
        return
    if _used_in_the_hour(claim, scope=claim.scope) >= policy.max_per_hour:
        raise RateLimited(f"{claim.action}: the limit of {policy.max_per_hour} per hour for this contact is reached")
    # A key names its own scopes (`agent:<key>:<name>`): per scope alone, it could invent a
    # fresh one for every call. Its calls count together too, whatever scope they name.
    if claim.agent_key_id is not None and \
            _used_in_the_hour(claim, agent_key_id=claim.agent_key_id) >= policy.max_per_hour:
        raise RateLimited(f"{claim.action}: the limit of {policy.max_per_hour} per hour for this agent key "
                          "is reached")


def _used_in_the_hour(claim: ActionClaim, **same: Any) -> int:
    return (ActionClaim.objects.filter(action=claim.action, created_at__gt=claim.created_at - timedelta(hours=1),
                                       **same)
            .exclude(pk=claim.pk).exclude(state=ClaimState.RELEASED).count())


def rate_limited_outcome(exc: RateLimited) -> Outcome:
    return Outcome(Status.FAILED, error=str(exc),
                   note="Not done: too many of these were asked for in the last hour. Tell the user it cannot be "
                        "done right now; do not retry it in this conversation.")


def note_duplicate(claim: ActionClaim, status: str, *, actor: str, scope: Scope, now: datetime | None = None) -> None:
    """Audit a caught duplicate and count it on the original claim."""
    now = now or timezone.now()
    age = (now - claim.created_at).total_seconds()
    with transaction.atomic():
        ActionClaim.objects.filter(pk=claim.pk).update(duplicates_caught=F("duplicates_caught") + 1)
        record(EventKind.DUPLICATE_PREVENTED, conversation_id=scope.conversation_id or claim.conversation_id,
               channel_slug=scope.channel_slug or claim.channel_slug, actor=actor, target=f"claim {claim.pk}",
               summary=f"{claim.action} not repeated ({status}); original {humanize(age)} old",
               tool=claim.action, fingerprint=claim.fingerprint, original_claim=claim.pk, status=status,
               age_seconds=round(age, 1), scope=scope.key, agent_key=claim.agent_key_id)
        metrics.after_commit(metrics.DUPLICATES_PREVENTED.labels(claim.action, status).inc)


def duplicate_outcome(claim: ActionClaim, status: str, now: datetime | None = None) -> Outcome:
    now = now or timezone.now()
    age = humanize((now - claim.created_at).total_seconds())
    notes = {
        Status.DUPLICATE: f"Not done again: this exact action was already carried out {age} ago. "
                          "Do not repeat it; tell the user it is already done.",
        Status.IN_PROGRESS: f"Not done again: an identical action started {age} ago and is still in progress. "
                            "Do not repeat it; tell the user it is being done.",
        Status.UNCERTAIN: f"Not done again: an identical action was started {age} ago and interrupted before "
                          "its outcome was known, so it may or may not have happened. Do not retry it; tell the "
                          "user it may already be done and ask them to check.",
        Status.AWAITING_APPROVAL: f"Not proposed again: an identical action was proposed {age} ago and still "
                                  f"awaits {_approver(claim)}. Tell the user it is waiting for approval.",
    }
    proposal_id = getattr(getattr(claim, "proposal", None), "pk", None) if status == Status.AWAITING_APPROVAL else None
    return Outcome(status, result=claim.result if status == Status.DUPLICATE else None, note=notes[status],
                   claim_id=claim.pk, proposal_id=proposal_id, original=_original(claim, now), duplicate=True)


def _approver(claim: ActionClaim) -> str:
    """Who the proposal waits for: the user (a question in the chat) or an operator."""
    proposal_id = getattr(getattr(claim, "proposal", None), "pk", None)
    if proposal_id is not None and Confirmation.objects.filter(proposal_id=proposal_id).exists():
        return "the user's own confirmation (the question with Yes/No buttons in this chat)"
    return "a person's approval"
