"""A person in the loop: a call under an approval policy becomes a proposal that an
operator applies or rejects — or, under `approval = user`, that the conversation's own
user confirms in the chat (tools.confirmations asks; its tap calls `apply`/`reject`).

Apply is a compare-and-swap from `pending` to `applying`: a second click, a double
submit or two operators at the same moment find it no longer pending and change
nothing, so the action runs exactly once. The proposal's move and its claim's move
(`proposed` → `in flight`) commit together: a crash between them leaves both as they
were. The outcome goes back into the conversation: a short message to the user and a
note in the agent's context for its next turn.
"""

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from audit.events import record
from audit.failpoints import failpoint
from audit.models import EventKind
from tools import guard, hooks, registry
from tools.models import ApprovalMode, ClaimState, Proposal, ProposalState

log = logging.getLogger(__name__)


def open_proposal(claim, policy) -> Proposal:
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
        hooks.ask(proposal, claim)
    return proposal


def by_user(by: str) -> bool:
    """A decision taken by the conversation's user (tools.confirmations), not an operator."""
    return by.startswith("user:")


def _who(by) -> str:
    return "The user" if by_user(by) else "A person"


def _describe(claim) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in claim.arguments.items() if not isinstance(v, (dict, list)))
    return f"{claim.action}({args})"[:300]


def apply(proposal_id, *, by: str, tell_user: bool = True) -> Proposal:
    """Run the proposed action once. Returns the proposal as it stands afterwards
    (unchanged when it was not pending: applied already, rejected or expired).
    `tell_user` False: the caller shows the outcome itself (a question's buttons edited)."""
    return apply_once(proposal_id, by=by, tell_user=tell_user)[0]


def apply_once(proposal_id, *, by: str, tell_user: bool = True) -> tuple[Proposal, bool]:
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
        _finish(proposal, claim, guard.Outcome(guard.Status.FAILED, error=f"its claim is {claim.state}"), by,
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
    _finish(proposal, claim, outcome, by, tell_user)
    proposal.refresh_from_db()
    return proposal, True


def _begin_apply(proposal_id, by) -> tuple[bool, bool]:
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


def _finish(proposal, claim, outcome, by, tell_user=True):
    verb = "confirmed" if by_user(by) else "approved"
    if outcome.status == guard.Status.DONE:
        state = ProposalState.APPLIED
        for_agent = f"{_who(by)} {verb} and applied {_describe(claim)}; result: {outcome.result}"
        for_user = format_lazy(_("✅ Confirmed and done: {what}") if by_user(by) else _("✅ Approved and done: {what}"),
                               what=_describe_for_user(claim))
    elif outcome.status == guard.Status.UNCERTAIN:
        return  # stays applying until the claim is settled (sweep: settle_applying)
    else:
        state = ProposalState.FAILED
        for_agent = f"{_who(by)} {verb} {_describe(claim)}, but it failed: {outcome.error}"
        for_user = format_lazy(_("⚠️ Confirmed, but it could not be done: {what}") if by_user(by)
                               else _("⚠️ Approved, but it could not be done: {what}"), what=_describe_for_user(claim))
    with transaction.atomic():
        moved = Proposal.transition(proposal.pk, ProposalState.APPLYING, state, result=outcome.result,
                                    error=outcome.error[:2000])
        if moved:
            record(EventKind.PROPOSAL_APPLIED, conversation_id=claim.conversation_id, channel_slug=claim.channel_slug,
                   actor=by, target=f"proposal {proposal.pk}", summary=f"{claim.action}: {state}",
                   tool=claim.action, claim=claim.pk, proposal=proposal.pk, outcome=state,
                   agent_key=claim.agent_key_id)
            if claim.conversation_id:
                hooks.inform(claim.conversation_id, for_agent=for_agent, for_user=for_user if tell_user else "")


def _describe_for_user(claim) -> str:
    args = claim.arguments
    label = args.get("title") or args.get("subject") or claim.action.replace("_", " ")
    when = args.get("start_datetime")
    return f"{label}" + (f" ({when})" if when else "")


def reject(proposal_id, *, by: str, reason: str = "", tell_user: bool = True) -> Proposal:
    return reject_once(proposal_id, by=by, reason=reason, tell_user=tell_user)[0]


def reject_once(proposal_id, *, by: str, reason: str = "", tell_user: bool = True) -> tuple[Proposal, bool]:
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
            if claim.conversation_id:
                why = f" ({reason})" if reason else ""
                said = "said no to" if by_user(by) else "rejected"
                hooks.inform(claim.conversation_id,
                             for_agent=f"{_who(by)} {said} {_describe(claim)}{why}; it was not done.",
                             for_user=format_lazy(_("❌ Not approved: {what}"), what=_describe_for_user(claim) + why)
                             if tell_user else "")
    if not won and proposal.state == ProposalState.PENDING:  # it is past its time
        expire(proposal, tell_user=tell_user)
        proposal.refresh_from_db()
    return proposal, bool(won)


def expire(proposal, tell_user: bool = True) -> bool:
    with transaction.atomic():
        won = Proposal.transition(proposal.pk, ProposalState.PENDING, ProposalState.EXPIRED,
                                  where={"expires_at__lte": timezone.now()})
        if won:
            claim = proposal.claim
            guard.transition(claim.pk, [ClaimState.PROPOSED], ClaimState.RELEASED, error="proposal expired")
            record(EventKind.PROPOSAL_EXPIRED, conversation_id=claim.conversation_id,
                   channel_slug=claim.channel_slug, actor="guard", target=f"proposal {proposal.pk}",
                   summary=f"{claim.action} expired unapproved", tool=claim.action, claim=claim.pk,
                   proposal=proposal.pk, agent_key=claim.agent_key_id)
            if claim.conversation_id:
                hooks.inform(claim.conversation_id,
                             for_agent=f"Nobody approved {_describe(claim)} in time; it expired and was not done.",
                             for_user=format_lazy(_("⌛ Not approved in time, so not done: {what}"),
                                                  what=_describe_for_user(claim)) if tell_user else "")
            if tell_user:  # expired by the sweep, not by a tap (which shows it itself)
                transaction.on_commit(lambda: hooks.withdraw_question(proposal.pk))
    return bool(won)


def expire_due(now) -> int:
    due = Proposal.objects.select_related("claim").filter(state=ProposalState.PENDING, expires_at__lte=now)[:200]
    return sum(expire(p) for p in due)


def settle_applying():
    """A proposal whose run was interrupted stays `applying` until its claim is settled
    (reconciled, or released by an operator); then it is finished here."""
    for proposal in Proposal.objects.select_related("claim").filter(
            state=ProposalState.APPLYING, claim__state__in=[ClaimState.DONE, ClaimState.RELEASED])[:200]:
        claim = proposal.claim
        if claim.state == ClaimState.DONE:
            outcome = guard.Outcome(guard.Status.DONE, result=claim.result)
        else:
            outcome = guard.Outcome(guard.Status.FAILED, error=claim.error or "it did not happen")
        # Told in the chat even when a tap decided it: the tap could only say "confirmed".
        _finish(proposal, claim, outcome, proposal.decided_by or "guard")


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
