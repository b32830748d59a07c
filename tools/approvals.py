"""A person in the loop: a call under an approval policy becomes a proposal that an
operator applies or rejects — or, under `approval = user`, that the conversation's own
user confirms in the chat (tools.confirmations asks; its tap calls `apply`/`reject`).

Apply is a compare-and-swap from `pending` to `applying`: a second click, a double
submit or two operators at the same moment find it no longer pending and change
nothing, so the action runs exactly once. The proposal's move and its claim's move
(`proposed` → `in flight`) commit together: a crash between them leaves both as they
were. The outcome goes back into the conversation: a short message to the user and a
note in the agent's context for its next turn.

Above the guard, which runs the action: opening, expiring and finishing a proposal are
the guard's (tools.guard.proposals), which its sweep calls too.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.failpoints import failpoint
from audit.models import EventKind
from tools import guard, registry
from tools.guard.proposals import by_user, describe, describe_for_user, expire, finish, tell, who
from tools.models import ClaimState, Proposal, ProposalState


def apply(proposal_id: int, *, by: str, tell_user: bool = True) -> Proposal:
    """Run the proposed action once. Returns the proposal as it stands afterwards
    (unchanged when it was not pending: applied already, rejected or expired).
    `tell_user` False: the caller shows the outcome itself (a question's buttons edited)."""
    return apply_once(proposal_id, by=by, tell_user=tell_user)[0]


def apply_once(proposal_id: int, *, by: str, tell_user: bool = True) -> tuple[Proposal, bool]:
    """`apply`, and whether this call was the one that decided it (a second tap is told
    "already confirmed")."""
    won, took = _begin_apply(proposal_id, by)
    proposal = Proposal.objects.select_related("claim").get(pk=proposal_id)
    if not won:
        if proposal.state == ProposalState.PENDING:  # it is past its time
            expire(proposal, tell_user=tell_user)
            proposal.refresh_from_db()
        return proposal, False
    claim = proposal.claim
    if not took:  # its claim was settled some other way (an operator released it): never run it
        finish(proposal, claim, guard.Outcome(guard.Status.FAILED, error=f"its claim is {claim.state}"), by,
               tell_user)
        proposal.refresh_from_db()
        return proposal, True
    failpoint("approval.between_steps")
    try:
        tool = registry.get(claim.action)
        outcome = guard.execute(tool, claim)
    except registry.UnknownTool:
        guard.transition(claim.pk, [ClaimState.IN_FLIGHT], ClaimState.RELEASED, error="tool no longer exists")
        outcome = guard.Outcome(guard.Status.FAILED, error=f"tool {claim.action!r} no longer exists")
    finish(proposal, claim, outcome, by, tell_user)
    proposal.refresh_from_db()
    return proposal, True


def _begin_apply(proposal_id: int, by: str) -> tuple[bool, bool]:
    """(won the proposal, took its claim), both moves in one transaction."""
    now = timezone.now()
    with transaction.atomic():
        won = Proposal.transition(proposal_id, ProposalState.PENDING, ProposalState.APPLYING,
                                  where={"expires_at__gt": now}, decided_by=by[:150], decided_at=now)
        if not won:
            return False, False
        claim_id, action = Proposal.objects.filter(pk=proposal_id).values_list("claim_id", "claim__action").get()
        policy = guard.policy_for(action)
        took = guard.transition(claim_id, [ClaimState.PROPOSED], ClaimState.IN_FLIGHT,
                                owner=(by if by_user(by) else f"operator:{by}")[:100],
                                lease_until=timezone.now() + timedelta(seconds=policy.timeout_seconds))
    return True, took


def reject(proposal_id: int, *, by: str, reason: str = "", tell_user: bool = True) -> Proposal:
    return reject_once(proposal_id, by=by, reason=reason, tell_user=tell_user)[0]


def reject_once(proposal_id: int, *, by: str, reason: str = "", tell_user: bool = True) -> tuple[Proposal, bool]:
    """`reject`, and whether this call was the one that decided it. A proposal past its
    time is expired rather than rejected (its answer says so)."""
    now = timezone.now()
    with transaction.atomic():
        won = Proposal.transition(proposal_id, ProposalState.PENDING, ProposalState.REJECTED,
                                  where={"expires_at__gt": now}, decided_by=by[:150], decided_at=now,
                                  error=reason[:2000])
        proposal = Proposal.objects.select_related("claim").get(pk=proposal_id)
        if won:
            claim = proposal.claim
            guard.transition(claim.pk, [ClaimState.PROPOSED], ClaimState.RELEASED, error="rejected by a person")
            record(EventKind.PROPOSAL_REJECTED, conversation_id=claim.conversation_id,
                   channel_slug=claim.channel_slug, actor=by, target=f"proposal {proposal.pk}",
                   summary=f"{claim.action} rejected", tool=claim.action, claim=claim.pk, proposal=proposal.pk,
                   agent_key=claim.agent_key_id)
            why = f" ({reason})" if reason else ""
            said = "said no to" if by_user(by) else "rejected"
            tell(claim, for_agent=f"{who(by)} {said} {describe(claim)}{why}; it was not done.",
                 for_user=format_lazy(_("❌ Not approved: {what}"), what=describe_for_user(claim) + why)
                 if tell_user else "")
    if not won and proposal.state == ProposalState.PENDING:  # it is past its time
        expire(proposal, tell_user=tell_user)
        proposal.refresh_from_db()
    return proposal, bool(won)
