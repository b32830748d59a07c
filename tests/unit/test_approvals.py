"""A person in the loop: proposals that an operator applies (once) or rejects, and the
outcome flowing back into the conversation. The concurrent Apply through the real admin
over HTTP is in test_guard_e2e."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from conversations import engine
from conversations.models import Turn
from delivery.models import OutboundMessage
from tools import approvals, guard
from tools.guard import Status
from tools.models import ActionClaim, CalendarEvent, ClaimState, Proposal, ProposalState, ToolPolicy
from tools.registry import Scope

pytestmark = pytest.mark.django_db
EVENT = {"title": "Sesión de grupo", "start_datetime": "2026-12-03T18:00"}


@pytest.fixture
def conversation(make_channel, make_conversation):
    ToolPolicy.objects.create(name="calendar_create_event", approval="operator", approval_ttl_seconds=3600)
    return make_conversation(make_channel("shop"), "ana")


def propose(conversation, arguments=EVENT):
    return guard.invoke("calendar_create_event", arguments, Scope.of_conversation(conversation), actor="worker:w")


def agent_context(conversation):
    turn = Turn.objects.create(conversation=conversation, merged_input="¿y?", flush_reason="window")
    return engine.conversation_history(conversation, turn)


def test_a_call_under_approval_becomes_a_proposal_and_nothing_happens(conversation):
    outcome = propose(conversation)
    assert outcome.status == Status.AWAITING_APPROVAL and not outcome.duplicate
    body = outcome.for_model()
    assert "NOT been carried out" in body["note"] and body["proposal"] == outcome.proposal_id
    assert not CalendarEvent.objects.exists()
    proposal = Proposal.objects.get()
    assert proposal.state == ProposalState.PENDING and proposal.claim.state == ClaimState.PROPOSED
    again = propose(conversation, {**EVENT, "end_datetime": "2026-12-03T19:00"})
    assert again.status == Status.AWAITING_APPROVAL and again.duplicate and again.proposal_id == proposal.pk
    assert "still awaits a person's approval" in again.note
    assert Proposal.objects.count() == 1
    assert AuditEvent.objects.filter(kind=EventKind.PROPOSAL_CREATED).count() == 1


def test_apply_runs_it_once_and_the_outcome_goes_back(conversation):
    proposal_id = propose(conversation).proposal_id
    applied = approvals.apply(proposal_id, by="olga")
    assert applied.state == ProposalState.APPLIED and applied.decided_by == "olga"
    assert applied.result["title"] == "Sesión de grupo"
    for _ in range(3):  # a second click, a double submit…
        assert approvals.apply(proposal_id, by="pablo").state == ProposalState.APPLIED
    assert CalendarEvent.objects.count() == 1
    assert ActionClaim.objects.get().state == ClaimState.DONE
    notice = OutboundMessage.objects.get()
    assert notice.text.startswith("✅ Approved and done: Sesión de grupo")
    assert notice.conversation_id == conversation.pk
    context = agent_context(conversation)
    assert context[-1]["role"] == "system" and "approved and applied" in context[-1]["content"]
    # Applied: the same call now is an ordinary duplicate.
    assert propose(conversation).status == Status.DUPLICATE


def test_reject_does_nothing_and_the_agent_learns_it(conversation):
    proposal_id = propose(conversation).proposal_id
    rejected = approvals.reject(proposal_id, by="olga", reason="the room is booked")
    assert rejected.state == ProposalState.REJECTED
    assert approvals.apply(proposal_id, by="pablo").state == ProposalState.REJECTED
    assert not CalendarEvent.objects.exists()
    assert ActionClaim.objects.get().state == ClaimState.RELEASED
    assert "Not approved" in OutboundMessage.objects.get().text
    assert "rejected" in agent_context(conversation)[-1]["content"]
    assert "the room is booked" in agent_context(conversation)[-1]["content"]
    assert propose(conversation).status == Status.AWAITING_APPROVAL  # asking again makes a new proposal


def test_an_expired_proposal_cannot_be_applied(conversation):
    proposal_id = propose(conversation).proposal_id
    Proposal.objects.filter(pk=proposal_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert approvals.apply(proposal_id, by="olga").state == ProposalState.EXPIRED
    assert not CalendarEvent.objects.exists()
    assert ActionClaim.objects.get().state == ClaimState.RELEASED
    assert "Not approved in time" in OutboundMessage.objects.get().text
    assert AuditEvent.objects.filter(kind=EventKind.PROPOSAL_EXPIRED).count() == 1


def test_the_sweep_expires_proposals(conversation):
    proposal_id = propose(conversation).proposal_id
    Proposal.objects.filter(pk=proposal_id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert guard.sweep()["expired"] == 1
    assert Proposal.objects.get(pk=proposal_id).state == ProposalState.EXPIRED


def test_an_apply_whose_run_failed_is_reported(conversation, make_channel):
    ToolPolicy.objects.create(name="calendar_delete_event", approval="operator")
    outcome = guard.invoke("calendar_delete_event", {"event_id": "nope"}, Scope.of_conversation(conversation),
                           actor="worker:w")
    failed = approvals.apply(outcome.proposal_id, by="olga")
    assert failed.state == ProposalState.FAILED and "no event" in failed.error
    assert "could not be done" in OutboundMessage.objects.get().text


def test_an_overdue_proposal_does_not_block_a_new_call(conversation):
    first = propose(conversation).proposal_id
    Proposal.objects.filter(pk=first).update(expires_at=timezone.now() - timedelta(seconds=1))
    again = propose(conversation)
    assert again.status == Status.AWAITING_APPROVAL and not again.duplicate and again.proposal_id != first
    assert Proposal.objects.get(pk=first).state == ProposalState.EXPIRED


def test_a_proposal_whose_claim_was_released_is_never_run(conversation):
    outcome = propose(conversation)
    ActionClaim.objects.filter(pk=outcome.claim_id).update(state=ClaimState.RELEASED, live=False)
    assert approvals.apply(outcome.proposal_id, by="olga").state == ProposalState.FAILED
    assert not CalendarEvent.objects.exists()


def interrupted_apply(proposal_id):
    """What a crash between Apply's two steps left when they were separate statements:
    the proposal `applying`, its claim still `proposed` (nothing ran)."""
    Proposal.objects.filter(pk=proposal_id).update(state=ProposalState.APPLYING, decided_by="olga",
                                                   decided_at=timezone.now())


def test_the_sweep_reopens_an_apply_interrupted_between_its_steps(conversation):
    proposal = propose(conversation).proposal_id
    interrupted_apply(proposal)
    assert approvals.apply(proposal, by="luis").state == ProposalState.APPLYING  # stuck: nobody can apply it
    assert guard.sweep()["reopened"] == 1
    reopened = Proposal.objects.get(pk=proposal)
    assert reopened.state == ProposalState.PENDING and reopened.decided_by == "" and reopened.is_open
    assert reopened.claim.state == ClaimState.PROPOSED and not CalendarEvent.objects.exists()
    assert AuditEvent.objects.filter(kind=EventKind.PROPOSAL_CREATED, summary__contains="interrupted").count() == 1
    assert guard.sweep()["reopened"] == 0
    assert approvals.apply(proposal, by="luis").state == ProposalState.APPLIED
    assert CalendarEvent.objects.count() == 1


def test_an_interrupted_apply_past_its_time_is_expired_by_the_same_sweep(conversation):
    proposal = propose(conversation).proposal_id
    interrupted_apply(proposal)
    Proposal.objects.filter(pk=proposal).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert guard.sweep() | {"uncertain": 0, "reconciled": 0} == {"uncertain": 0, "reconciled": 0, "expired": 1,
                                                                   "reopened": 1}
    expired = Proposal.objects.get(pk=proposal)
    assert expired.state == ProposalState.EXPIRED and expired.claim.state == ClaimState.RELEASED
    assert "Not approved in time" in OutboundMessage.objects.get(conversation=conversation).text

