"""A turn's completion whose answer was lost (the connection died after the commit):
the worker sends the reply row only if it is its completion's to send. Found by the
backends-terminated fault test: the completion committed its pending reply, its claim
failed, the worker's own ledger sweep claimed the row and sent it, and the completion's
recovery, seeing the row `attempting` under the same owner, sent it a second time,
unlabelled."""

import pytest
from django.utils import timezone

from conversations import liveness
from conversations.models import Turn, TurnState
from conversations.worker.supervisor import Worker
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState
from tests.support.e2e import UNPACED

pytestmark = pytest.mark.django_db


@pytest.fixture
def worker():
    worker = Worker(owner=liveness.new_owner(), poll=False)
    worker.liveness = liveness.NoLock()
    return worker


@pytest.fixture
def turn(make_channel, make_conversation, worker):
    channel = make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:T", **UNPACED})
    conversation = make_conversation(channel, "ana")
    return Turn.objects.create(conversation=conversation, merged_input="¿abren el sábado?", flush_reason="window",
                               state=TurnState.RUNNING, owner=worker.owner, started_at=timezone.now())


def committed_without_its_claim(worker, turn, text="Sí, de 9 a 13."):
    """The completion's transaction as it commits — the turn done, its reply row pending —
    with the claim that follows it never made (its connection died first)."""
    from conversations import turns

    turns.finish_many([(turn.pk, TurnState.DONE, text, "")], worker.owner)
    return ledger.enqueue(turn.conversation, text, kind=OutboundKind.REPLY, turn=turn)


def test_a_row_the_worker_sweep_claimed_meanwhile_is_left_to_the_sweep(worker, turn):
    row = committed_without_its_claim(worker, turn)
    [swept] = ledger.claim_due(worker.owner)  # this worker's own sweep: same owner, its own stamp
    assert swept.pk == row.pk

    done, mine = worker.turns.written_before(turn.pk)

    assert done and mine is None  # the sweep sends it: once
    assert OutboundMessage.objects.get(pk=row.pk).claim_token == swept.claim_token


def test_a_pending_row_is_claimed_and_sent_by_the_completion(worker, turn):
    row = committed_without_its_claim(worker, turn)

    done, mine = worker.turns.written_before(turn.pk)

    assert done and mine.pk == row.pk and mine.state == OutboundState.ATTEMPTING
    assert ledger.claim_due(worker.owner) == []  # no sweep can take it as well
    again, same = worker.turns.written_before(turn.pk)  # that claim's answer lost too: asked again
    assert again and same.pk == row.pk and same.claim_token == mine.claim_token


def test_a_claim_that_committed_but_whose_answer_was_lost_is_still_sent(worker, turn):
    [row] = worker.turns.complete_turns([(turn, TurnState.DONE, "Sí, de 9 a 13.", "")])  # claimed, stamped

    done, mine = worker.turns.written_before(turn.pk)  # as if complete_turns had raised after the claim

    assert done and mine.pk == row.pk and mine.claim_token == row.claim_token
    assert not mine.needs_marker  # never sent: nothing to label


def test_a_turn_still_running_is_written_again(worker, turn):
    assert worker.turns.written_before(turn.pk) == (False, None)


@pytest.fixture
def second_turn(make_conversation, worker, turn):
    conversation = make_conversation(turn.conversation.channel, "bea")
    return Turn.objects.create(conversation=conversation, merged_input="¿y el domingo?", flush_reason="window",
                               state=TurnState.RUNNING, owner=worker.owner, started_at=timezone.now())


def test_a_batch_of_completions_writes_each_turns_reply_row_once(worker, turn, second_turn):
    """The rows and their INSERT are made before the transaction (ledger.prepare_many);
    each row must still be its own turn's, with its id."""
    rows = worker.turns.complete_turns([(turn, TurnState.DONE, "Sí, de 9 a 13.", ""),
                                        (second_turn, TurnState.DONE, "No, cerrado.", "")])

    stored = {row.turn_id: row for row in OutboundMessage.objects.all()}
    assert [row.turn_id for row in rows] == [turn.pk, second_turn.pk]
    assert [row.pk for row in rows] == [stored[turn.pk].pk, stored[second_turn.pk].pk]
    assert (stored[turn.pk].text, stored[second_turn.pk].text) == ("Sí, de 9 a 13.", "No, cerrado.")
    assert all(row.state == OutboundState.ATTEMPTING for row in OutboundMessage.objects.all())


def test_a_turn_cancelled_before_its_completion_commits_gets_no_reply_row(worker, turn, second_turn):
    """/stop from another process between the agent's answer and its completion: the
    completion's compare-and-swap finds the turn cancelled, and of the rows made before
    the transaction only the other turn's is written."""
    Turn.objects.filter(pk=second_turn.pk).update(state=TurnState.CANCELLED)

    row, nothing = worker.turns.complete_turns([(turn, TurnState.DONE, "Sí, de 9 a 13.", ""),
                                                (second_turn, TurnState.DONE, "No, cerrado.", "")])

    assert nothing is None and row.turn_id == turn.pk
    assert list(OutboundMessage.objects.values_list("turn_id", "text")) == [(turn.pk, "Sí, de 9 a 13.")]
    assert Turn.objects.get(pk=second_turn.pk).state == TurnState.CANCELLED
