"""Every state machine's table, exercised through its one checked `transition()` on the
real database: each allowed move happens, each move the table does not list is refused
before anything is written, and the table names every state of its enum."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agentloop.core.states import IllegalTransition
from conversations.models import BufferState, MessageBuffer, Turn, TurnState
from delivery.models import OutboundMessage, OutboundState
from tools.models import ActionClaim, ClaimState, Proposal, ProposalState

pytestmark = pytest.mark.django_db
MACHINES = [(MessageBuffer, BufferState), (Turn, TurnState), (OutboundMessage, OutboundState),
            (ActionClaim, ClaimState), (Proposal, ProposalState)]


@pytest.fixture
def conversation(make_channel, make_conversation):
    return make_conversation(make_channel("machines"), "ana")


def make_row(model, state, conversation):
    """A row of `model` in `state` (fresh each time: the partial unique indexes allow one
    open buffer, one running turn and one live claim at a time)."""
    now = timezone.now()
    if model is MessageBuffer:
        MessageBuffer.objects.filter(conversation=conversation).delete()
        return MessageBuffer.objects.create(conversation=conversation, state=state, first_message_at=now,
                                            last_message_at=now, flush_at=now)
    if model is Turn:
        Turn.objects.filter(conversation=conversation).delete()
        return Turn.objects.create(conversation=conversation, merged_input="hola", flush_reason="window",
                                   state=state)
    if model is OutboundMessage:
        return OutboundMessage.objects.create(conversation=conversation, channel=conversation.channel,
                                              chat_id=conversation.chat_id, text="hola", state=state)
    ActionClaim.objects.all().delete()
    claim = ActionClaim.objects.create(scope="contact:1", action="a", fingerprint="f" * 64, state=state,
                                       expires_at=now + timedelta(hours=1), lease_until=now + timedelta(hours=1))
    if model is ActionClaim:
        return claim
    return Proposal.objects.create(claim=claim, state=state, expires_at=now + timedelta(hours=1))


@pytest.mark.parametrize("model, states", MACHINES, ids=lambda m: getattr(m, "__name__", ""))
def test_the_table_covers_every_state(model, states):
    assert set(model.TRANSITIONS) == set(states.values)
    assert all(set(targets) <= set(states.values) for targets in model.TRANSITIONS.values())


@pytest.mark.parametrize("model, states", MACHINES, ids=lambda m: getattr(m, "__name__", ""))
def test_every_allowed_transition_happens_and_every_other_is_refused(model, states, conversation):
    for old in states.values:
        for new in states.values:
            row = make_row(model, old, conversation)
            if new in model.TRANSITIONS[old]:
                assert model.transition(row.pk, old, new) == 1, f"{old} → {new}"
                assert model.objects.get(pk=row.pk).state == new
                # The compare-and-swap: the row is no longer in `old`, so a second caller
                # moving it from `old` finds nothing (unless old and new are the same).
                assert model.transition(row.pk, old, new) == (1 if old == new else 0)
            else:
                with pytest.raises(IllegalTransition):
                    model.transition(row.pk, old, new)
                assert model.objects.get(pk=row.pk).state == old, f"{old} → {new} was written"


def test_a_move_from_another_state_than_expected_changes_nothing(conversation):
    turn = make_row(Turn, TurnState.READY, conversation)
    assert Turn.transition(turn.pk, TurnState.RUNNING, TurnState.DONE) == 0
    assert Turn.objects.get(pk=turn.pk).state == TurnState.READY


def test_one_update_decides_per_row_and_checks_every_target(conversation, make_conversation):
    other = make_conversation(conversation.channel, "luis")
    first, second = make_row(Turn, TurnState.RUNNING, conversation), make_row(Turn, TurnState.RUNNING, other)
    moved = Turn.transition([first.pk, second.pk], TurnState.RUNNING,
                            {first.pk: TurnState.DONE, second.pk: TurnState.FAILED})
    assert moved == 2
    assert dict(Turn.objects.values_list("pk", "state")) == {first.pk: "done", second.pk: "failed"}
    with pytest.raises(IllegalTransition):
        Turn.transition([first.pk], TurnState.RUNNING, {first.pk: TurnState.DONE, second.pk: "bogus"})


def test_extra_conditions_are_part_of_the_compare_and_swap(conversation):
    turn = make_row(Turn, TurnState.READY, conversation)
    assert Turn.transition(turn.pk, TurnState.READY, TurnState.CANCELLED, where={"fired_effect": True}) == 0
    assert Turn.transition(turn.pk, TurnState.READY, TurnState.CANCELLED, where={"fired_effect": False},
                           outcome="stop") == 1
    assert Turn.objects.get(pk=turn.pk).outcome == "stop"
