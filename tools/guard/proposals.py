"""Proposals as the guard keeps them: opened with their claim (and, under `approval =
user`, the question to the user: tools.questions), expired when nobody decided in time,
finished once the claim an Apply took is settled, and reopened when an Apply of an older
version was cut between its steps. The sweep runs the last three (tools.guard.sweep).

A person's decision — Apply, Reject — stands above the guard, in tools.approvals: it runs
the action through the guard and finishes the proposal here.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import transaction
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.models import EventKind
from tools import questions
from tools.conversation_side import conversation_side
from tools.guard.helpers import transition
from tools.guard.outcomes import Outcome, Status
from tools.models import ActionClaim, ApprovalMode, ClaimState, Proposal, ProposalState, ToolPolicy

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise


def open_proposal(claim: ActionClaim, policy: ToolPolicy) -> Proposal:
    """Called inside the claim's own transaction: a claim awaiting approval always has its proposal."""
    proposal = Proposal.objects.create(
        claim=claim, created_at=claim.created_at,
        expires_at=claim.created_at + timedelta(seconds=policy.approval_ttl_seconds),
    )
    record(EventKind.PROPOSAL_CREATED, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
           actor=claim.owner, target=f"proposal {proposal.pk}", summary=f"{claim.action} awaits approval",
           tool=claim.action, claim=claim.pk, proposal=proposal.pk, agent_key=claim.agent_key_id)
    if policy.approval == ApprovalMode.USER and claim.conversation_id:
        # In the same transaction: a proposal the user must confirm always has its question.
        questions.ask(proposal, claim)
    return proposal


def by_user(by: str) -> bool:
    """A decision taken by the conversation's user (tools.confirmations), not an operator."""
    return by.startswith("user:")


def who(by: str) -> str:
    return "The user" if by_user(by) else "A person"


def describe(claim: ActionClaim) -> str:
    """The call, for the agent's note."""
    args = ", ".join(f"{k}={v!r}" for k, v in claim.arguments.items() if not isinstance(v, (dict, list)))
    return f"{claim.action}({args})"[:300]


def describe_for_user(claim: ActionClaim) -> str:
    args = claim.arguments
    label = args.get("title") or args.get("subject") or claim.action.replace("_", " ")
    when = args.get("start_datetime")
    return f"{label}" + (f" ({when})" if when else "")


def tell(claim: ActionClaim, *, for_agent: str, for_user: StrOrPromise = "") -> None:
    """The decision reaches the claim's conversation, if it has one (tools.conversation_side)."""
    if claim.conversation_id:
        conversation_side().inform(claim.conversation_id, for_agent=for_agent, for_user=for_user)


def finish(proposal: Proposal, claim: ActionClaim, outcome: Outcome, by: str, tell_user: bool = True) -> None:
    """An applied proposal's end, from its run's outcome: applied or failed, audited and
    told in its conversation. An uncertain run leaves it applying until its claim is settled."""
    verb = "confirmed" if by_user(by) else "approved"
    for_user: StrOrPromise
    if outcome.status == Status.DONE:
        state = ProposalState.APPLIED
        for_agent = f"{who(by)} {verb} and applied {describe(claim)}; result: {outcome.result}"
        for_user = format_lazy(_("✅ Confirmed and done: {what}") if by_user(by) else _("✅ Approved and done: {what}"),
                               what=describe_for_user(claim))
    elif outcome.status == Status.UNCERTAIN:
        return  # stays applying until the claim is settled (sweep: settle_applying)
    else:
        state = ProposalState.FAILED
        for_agent = f"{who(by)} {verb} {describe(claim)}, but it failed: {outcome.error}"
        for_user = format_lazy(_("⚠️ Confirmed, but it could not be done: {what}") if by_user(by)
                               else _("⚠️ Approved, but it could not be done: {what}"), what=describe_for_user(claim))
    with transaction.atomic():
        moved = Proposal.transition(proposal.pk, ProposalState.APPLYING, state, result=outcome.result,
                                    error=outcome.error[:2000])
        if moved:
            record(EventKind.PROPOSAL_APPLIED, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
                   actor=by, target=f"proposal {proposal.pk}", summary=f"{claim.action}: {state}",
                   tool=claim.action, claim=claim.pk, proposal=proposal.pk, outcome=state,
                   agent_key=claim.agent_key_id)
            tell(claim, for_agent=for_agent, for_user=for_user if tell_user else "")


def expire(proposal: Proposal, tell_user: bool = True) -> bool:
    """A pending proposal past its time: expired, its claim released, the conversation
    told; and, expired by the sweep, its question withdrawn (a tap shows it itself)."""
    with transaction.atomic():
        won = Proposal.transition(proposal.pk, ProposalState.PENDING, ProposalState.EXPIRED,
                                  where={"expires_at__lte": timezone.now()})
        if won:
            claim = proposal.claim
            transition(claim.pk, [ClaimState.PROPOSED], ClaimState.RELEASED, error="proposal expired")
            record(EventKind.PROPOSAL_EXPIRED, conversation_id=claim.conversation_id,
                   channel_slug=claim.channel_slug, actor="guard", target=f"proposal {proposal.pk}",
                   summary=f"{claim.action} expired unapproved", tool=claim.action, claim=claim.pk,
                   proposal=proposal.pk, agent_key=claim.agent_key_id)
            tell(claim, for_agent=f"Nobody approved {describe(claim)} in time; it expired and was not done.",
                 for_user=format_lazy(_("⌛ Not approved in time, so not done: {what}"),
                                      what=describe_for_user(claim)) if tell_user else "")
            if tell_user:  # expired by the sweep, not by a tap (which shows it itself)
                transaction.on_commit(lambda: questions.withdraw_question(proposal.pk))
    return bool(won)


def expire_due(now: datetime) -> int:
    due = Proposal.objects.select_related("claim").filter(state=ProposalState.PENDING, expires_at__lte=now)[:200]
    return sum(expire(p) for p in due)


def settle_applying() -> None:
    """A proposal whose run was interrupted stays `applying` until its claim is settled
    (reconciled, or released by an operator); then it is finished here."""
    for proposal in Proposal.objects.select_related("claim").filter(
            state=ProposalState.APPLYING, claim__state__in=[ClaimState.DONE, ClaimState.RELEASED])[:200]:
        claim = proposal.claim
        if claim.state == ClaimState.DONE:
            outcome = Outcome(Status.DONE, result=claim.result)
        else:
            outcome = Outcome(Status.FAILED, error=claim.error or "it did not happen")
        # Told in the chat even when a tap decided it: the tap could only say "confirmed".
        finish(proposal, claim, outcome, proposal.decided_by or "guard")


def reopen_interrupted() -> int:
    """Proposals `applying` whose claim is still `proposed`: an Apply that crashed between
    its two steps when they were not yet one transaction (rows left by an older
    version). Nothing ran, so they go back to pending — shown again to operators, or
    expired by the sweep if past their time — rather than being stuck forever."""
    reopened = 0
    for proposal in Proposal.objects.select_related("claim").filter(
            state=ProposalState.APPLYING, claim__state=ClaimState.PROPOSED)[:200]:
        claim = proposal.claim
        with transaction.atomic():
            if not Proposal.transition(proposal.pk, ProposalState.APPLYING, ProposalState.PENDING,
                                       where={"claim__state": ClaimState.PROPOSED}, decided_by="", decided_at=None):
                continue
            reopened += 1
            record(EventKind.PROPOSAL_CREATED, conversation_id=claim.conversation_id,
                   channel_slug=claim.channel_slug, actor="guard", target=f"proposal {proposal.pk}",
                   summary=f"{claim.action} awaits approval again: its Apply was interrupted before it ran",
                   tool=claim.action, claim=claim.pk, proposal=proposal.pk, agent_key=claim.agent_key_id)
    return reopened
