"""The delivery ledger's rules on the real database, with injected time: the marker
decided by the claim, flood control, the backoff and budget, unreachable chats,
freshness, pruning, operators' actions."""

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent, EventKind
from delivery import ledger
from delivery.models import OutboundKind, OutboundMessage, OutboundState, Outcome, UnreachableChat
from delivery.transports import SendResult
from tests.support.e2e import UNPACED

pytestmark = pytest.mark.django_db
T0 = timezone.now()


def at(seconds):
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def conversation(make_channel, make_conversation):
    """A Telegram chat whose channel is unpaced: these are the ledger's rules, claimed
    several rows of one chat at a time (pacing has tests of its own below)."""
    return make_conversation(make_channel("tg", kind="telegram", platform_settings={"bot_token": "1:T", **UNPACED}),
                             "ana")


@pytest.fixture
def paced(make_channel, make_conversation):
    return make_conversation(make_channel("paced", kind="telegram", platform_settings={"bot_token": "3:P"}), "ana")


@pytest.fixture
def row(conversation):
    return write(conversation, "Su cita es el lunes.")


def write(conversation, text, created=0):
    row = ledger.enqueue(conversation, text, kind=OutboundKind.REPLY, reply_target="55", thread_id="7")
    OutboundMessage.objects.filter(pk=row.pk).update(created_at=at(created), next_attempt_at=at(created))
    return row


def claim(owner="w1", now=0, dead=(), boot=False):
    return ledger.claim_due(owner, dead, now=at(now), boot=boot)


def fail(rows, outcome, now, retry_after=0.0, owner="w1"):
    for r in rows:
        ledger.finish(r, owner, SendResult.failed(outcome, "boom", retry_after), now=at(now))


def state(row):
    return OutboundMessage.objects.get(pk=row.pk)


def test_a_row_never_claimed_goes_out_plain_and_a_retried_one_labelled(row):
    [first] = claim(now=1)
    assert first.state == OutboundState.ATTEMPTING and first.attempts == 1 and not first.needs_marker
    assert ledger.text_to_send(first) == "Su cita es el lunes."
    assert claim("w2", now=1) == []  # held: nobody else can take it
    fail([first], Outcome.TEMPORARY, now=2)
    [second] = claim(now=32)
    assert second.attempts == 2 and second.needs_marker
    assert ledger.text_to_send(second).startswith("♻️ Recovered reply")
    assert ledger.text_to_send(second).endswith("Su cita es el lunes.")
    # Retries keep the bot, the chat, the thread and the reply-to.
    assert (second.channel.slug, second.chat_id, second.thread_id, second.reply_target) == ("tg", "ana", "7", "55")


def test_a_pending_row_with_attempts_is_labelled(row):
    OutboundMessage.objects.filter(pk=row.pk).update(attempts=1, chunks_started=1)  # claimed before, maybe sent
    [claimed] = claim(now=1)
    assert claimed.needs_marker


def test_temporary_failures_back_off_30s_then_2min_then_wait_for_the_next_start(row):
    [r] = claim(now=0)
    fail([r], Outcome.TEMPORARY, now=1)
    assert state(row).next_attempt_at == at(31)
    assert claim(now=30) == [] and len(claim(now=31)) == 1
    fail([state(row)], Outcome.AMBIGUOUS, now=32)
    assert state(row).next_attempt_at == at(152)
    assert claim(now=151) == []
    [r] = claim(now=152)
    fail([r], Outcome.TEMPORARY, now=153)
    kept = state(row)
    assert kept.state == OutboundState.FAILED and kept.next_attempt_at is None  # the last resend
    assert claim(now=10_000) == []  # no timer takes it...
    [r] = claim(now=10_000, boot=True)  # ...the next worker start does
    assert r.needs_marker and r.attempts == 4
    fail([r], Outcome.TEMPORARY, now=10_001)
    assert state(row).state == OutboundState.ABANDONED
    assert AuditEvent.objects.filter(kind=EventKind.REPLY_ABANDONED).count() == 1


def test_flood_control_waits_for_the_penalty_spends_no_attempt_and_labels_nothing(row):
    # A 429 is a refusal: nothing reached the chat, so the resend goes out plain.
    for attempt in range(6):
        [r] = claim(now=attempt * 10)
        assert not r.needs_marker and r.attempts == 1
        fail([r], Outcome.FLOOD, now=attempt * 10, retry_after=7)
        assert state(row).next_attempt_at == at(attempt * 10 + 7)
        assert claim(now=attempt * 10 + 6) == []
    flooded = state(row)
    assert (flooded.state, flooded.flood_waits, flooded.attempts) == (OutboundState.FAILED, 6, 0)
    [r] = claim(now=100)
    assert ledger.text_to_send(r) == "Su cita es el lunes."
    ledger.finish(r, "w1", SendResult.delivered("m1"), now=at(101))
    delivered = state(row)
    assert delivered.state == OutboundState.DELIVERED and delivered.platform_message_id == "m1"
    assert delivered.attempts == 1
    assert not AuditEvent.objects.filter(kind=EventKind.REPLY_RECOVERED).exists()


def test_a_flood_pauses_every_row_of_the_bot_not_only_the_refused_one(paced, make_conversation):
    other = make_conversation(paced.channel, "beto")
    first, second = write(paced, "uno"), write(other, "dos", created=1)
    [r] = ledger.claim_many([first.pk], "w1", now=at(2))
    fail([r], Outcome.FLOOD, now=2, retry_after=5)
    assert claim(now=3) == []  # beto's row waits too: the whole bot is paused
    rows = claim(now=7.5)
    assert [r.pk for r in rows] == [first.pk, second.pk]  # oldest first once the penalty is over
    spacing = 1 / paced.channel.setting("messages_per_second")
    assert [r.pace_delay for r in rows] == [0, pytest.approx(spacing, abs=1e-4)]  # spaced by the bot's rate


def test_a_flood_of_an_unpaced_channel_pauses_its_other_chats_not_other_channels(conversation, make_channel,
                                                                                  make_conversation):
    other = make_conversation(conversation.channel, "beto")
    elsewhere = make_conversation(make_channel("tg2", kind="telegram", platform_settings={"bot_token": "2:T",
                                                                                         **UNPACED}), "ana")
    first, second, third = write(conversation, "uno"), write(other, "dos", created=1), write(elsewhere, "tres", 1)
    [r] = ledger.claim_many([first.pk], "w1", now=at(2))
    fail([r], Outcome.FLOOD, now=2, retry_after=5)  # Twilio's 429 (20429): the account's, not the message's
    assert [r.pk for r in claim(now=3)] == [third.pk]  # beto's row waits too; another channel's does not
    assert ledger.claim_many([second.pk], "w2", now=at(6.9)) == []  # nor does a claim by id take it
    # Nor a turn's reply as its turn completes (claimed as written: delivery.sql.claim_pending).
    reply = write(make_conversation(conversation.channel, "carla"), "cuatro", created=3)
    assert ledger.claim_written([reply], "w1", now=at(6.9)) == []
    assert [r.pk for r in claim(now=7.5)] == [first.pk, second.pk, reply.pk]  # oldest first once it is over


def test_a_send_that_never_left_is_resent_plain_backing_off_without_spending_attempts(row):
    waits = []
    for attempt in range(8):
        [r] = claim(now=attempt * 100)
        assert not r.needs_marker
        fail([r], Outcome.NOT_SENT, now=attempt * 100)
        waits.append((state(row).next_attempt_at - at(attempt * 100)).total_seconds())
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60]
    assert state(row).attempts == 0 and state(row).state == OutboundState.FAILED


def test_a_resend_after_an_ambiguous_send_stays_labelled_through_a_flood(row):
    [r] = claim(now=0)
    fail([r], Outcome.AMBIGUOUS, now=1)  # it may have arrived
    [r] = claim(now=31)
    assert r.needs_marker
    fail([r], Outcome.FLOOD, now=31, retry_after=3)  # the labelled resend was refused
    [r] = claim(now=40)
    assert r.needs_marker and r.attempts == 2  # still labelled; the flood spent nothing


def test_permanent_failure_marks_the_chat_unreachable_and_is_never_retried(row, conversation):
    [r] = claim(now=0)
    fail([r], Outcome.PERMANENT, now=1)
    assert state(row).state == OutboundState.UNREACHABLE
    assert claim(now=10_000) == [] and claim(now=10_000, boot=True) == []
    mark = UnreachableChat.objects.get()
    assert (mark.channel_id, mark.chat_id) == (conversation.channel_id, "ana")
    second = write(conversation, "otra")
    [r] = claim(now=2)
    fail([r], Outcome.PERMANENT, now=3)
    assert UnreachableChat.objects.get().failures == 2
    assert AuditEvent.objects.filter(kind=EventKind.CHAT_UNREACHABLE).count() == 1  # once per chat
    # The user unblocked the bot and wrote again: a reply reaches the chat, the mark goes.
    third = write(conversation, "hola de nuevo")
    [r] = claim(now=4)
    ledger.finish_many([(r, SendResult.delivered("9"))], "w1", now=at(5))
    assert not UnreachableChat.objects.exists()
    assert state(second).state == OutboundState.UNREACHABLE and state(third).state == OutboundState.DELIVERED


def test_a_dead_owners_row_is_taken_over_labelled_a_live_owners_is_not(row):
    claim("dead-worker", now=0)
    assert claim("w2", now=1) == []
    [taken] = claim("w2", now=1, dead=["dead-worker"])
    assert taken.owner == "w2" and taken.needs_marker and taken.attempts == 2
    # The dead owner's late outcome changes nothing: the claim is not its any more.
    ledger.finish(taken, "dead-worker", SendResult.failed(Outcome.PERMANENT, "x"), now=at(2))
    assert state(row).state == OutboundState.ATTEMPTING and state(row).owner == "w2"


def test_a_row_held_longer_than_any_send_is_orphaned(row, settings):
    settings.AGENTLOOP_DELIVERY_ATTEMPT_TIMEOUT = 60
    claim("tasks:gone", now=0)
    assert claim("w2", now=59) == []
    [taken] = claim("w2", now=61)
    assert taken.needs_marker


def test_rows_wait_while_their_transport_cannot_send(row, conversation):
    conversation.channel.__class__.objects.filter(pk=conversation.channel_id).update(is_active=False)
    assert claim(now=1, boot=True) == []
    channel = conversation.channel.__class__.objects.get(pk=conversation.channel_id)
    channel.is_active, channel.platform_settings = True, {**channel.platform_settings, "bot_token": ""}
    channel.save()
    assert channel.send_blocked and claim(now=1, boot=True) == []


def test_stale_rows_are_abandoned_not_sent(conversation):
    old = write(conversation, "ayer", created=-25 * 3600)
    fresh = write(conversation, "hoy")
    assert [r.pk for r in claim(now=0)] == [fresh.pk]
    assert ledger.abandon_stale(now=at(0)) == 1
    assert state(old).state == OutboundState.ABANDONED
    assert "older than 24 h" in AuditEvent.objects.get(kind=EventKind.REPLY_ABANDONED).summary


def test_an_orphan_past_its_budget_is_abandoned(row):
    OutboundMessage.objects.filter(pk=row.pk).update(state=OutboundState.ATTEMPTING, owner="dead", attempts=4,
                                                     claimed_at=at(0))
    assert claim(now=1, dead=["dead"], boot=True) == []
    assert ledger.abandon_stale(now=at(1), dead_owners=["dead"]) == 1
    assert state(row).state == OutboundState.ABANDONED


def test_pruning_deletes_finished_rows_after_seven_days(conversation):
    rows = {name: write(conversation, name, created=-8 * 86400) for name in ("delivered", "abandoned", "pending")}
    OutboundMessage.objects.filter(pk=rows["delivered"].pk).update(state=OutboundState.DELIVERED)
    OutboundMessage.objects.filter(pk=rows["abandoned"].pk).update(state=OutboundState.ABANDONED)
    recent = write(conversation, "recent", created=-86400)
    OutboundMessage.objects.filter(pk=recent.pk).update(state=OutboundState.DELIVERED)
    assert ledger.prune(now=at(0)) == 2
    assert set(OutboundMessage.objects.values_list("text", flat=True)) == {"pending", "recent"}


def test_retry_now_and_abandon(row, conversation):
    [r] = claim(now=0)
    fail([r], Outcome.PERMANENT, now=1)
    other = write(conversation, "otra")
    assert ledger.retry_now([row.pk], by="olga") == 1
    retried = state(row)
    assert retried.state == OutboundState.FAILED and retried.retried_at is not None
    assert ledger.abandon([other.pk], by="olga") == 1
    [r] = ledger.claim_due("w1")
    assert r.pk == row.pk and r.needs_marker
    assert state(other).state == OutboundState.ABANDONED


def test_batch_claims_decide_each_rows_marker(conversation):
    plain = [write(conversation, f"m{i}") for i in range(3)]
    retried = write(conversation, "retried")
    OutboundMessage.objects.filter(pk=retried.pk).update(state=OutboundState.FAILED, attempts=1, chunks_started=1,
                                                         next_attempt_at=at(0))
    claimed = {r.text: r.needs_marker for r in claim(now=1)}
    assert claimed == {"m0": False, "m1": False, "m2": False, "retried": True}
    assert not plain[0].needs_marker


def test_without_the_ledger_a_failure_is_given_up(row, settings):
    settings.AGENTLOOP_DELIVERY_LEDGER = False
    [r] = claim(now=0)
    fail([r], Outcome.TEMPORARY, now=1)
    assert state(row).state == OutboundState.ABANDONED
    OutboundMessage.objects.filter(pk=row.pk).update(state=OutboundState.ATTEMPTING, owner="dead")
    assert claim(now=2, dead=["dead"], boot=True) == []  # nothing in flight is recovered


@pytest.mark.django_db(transaction=True)
def test_the_django_q2_safety_sweep_delivers_when_no_worker_runs(make_channel, make_conversation, fake_telegram):
    channel = make_channel("tg2", kind="telegram", platform_settings={
        "bot_token": "5:SAFE", "api_base": fake_telegram.url})
    conversation = make_conversation(channel, "202")
    row = ledger.enqueue(conversation, "¿sigue en pie?", kind=OutboundKind.REPLY)
    OutboundMessage.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=2))
    stale = ledger.enqueue(conversation, "ayer", kind=OutboundKind.REPLY)
    OutboundMessage.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(hours=25))
    assert ledger.safety_sweep() == {"abandoned": 1, "sent": 1}
    assert [c.params["text"] for c in fake_telegram.calls("sendMessage")] == ["¿sigue en pie?"]
    assert state(row).state == OutboundState.DELIVERED and state(stale).state == OutboundState.ABANDONED


def test_a_just_written_row_is_claimed_like_a_sweep_would_claim_it(conversation, make_channel, make_conversation):
    """claim_written (the completion path's claim, in SQL of its own) wins exactly the
    rows a sweep's claim would: pending, within their budget, fresh, of a channel that
    can send; and leaves them as that claim does."""
    sendable = write(conversation, "hoy")
    stale = write(conversation, "ayer", created=-25 * 3600)
    spent = write(conversation, "gastada")
    OutboundMessage.objects.filter(pk=spent.pk).update(attempts=ledger.MAX_RESENDS + 1)
    held = write(conversation, "ya tomada")
    [held] = ledger.claim_many([held.pk], "w0", now=at(0))
    quiet = make_conversation(make_channel("off", kind="telegram", platform_settings={"bot_token": "2:T", **UNPACED}),
                              "eva")
    inactive = write(quiet, "canal apagado")
    quiet.channel.__class__.objects.filter(pk=quiet.channel_id).update(is_active=False)
    blocked = make_conversation(make_channel("blocked", kind="telegram", platform_settings=UNPACED), "leo")
    unsendable = write(blocked, "sin token")
    rows = [state(r) for r in (sendable, stale, spent, held, inactive, unsendable)]

    won = ledger.claim_written(rows, "w1", now=at(1))
    assert [r.pk for r in won] == [sendable.pk]
    stored = state(sendable)
    assert (stored.state, stored.owner, stored.claim_token, stored.attempts, stored.chunks_started,
            stored.needs_marker) == (OutboundState.ATTEMPTING, "w1", won[0].claim_token, 1, 1, False)
    assert (won[0].attempts, won[0].chunks_started, won[0].needs_marker) == (1, 1, False)
    assert state(held).owner == "w0"
    assert [r.state for r in map(state, (stale, spent, inactive, unsendable))] == [OutboundState.PENDING] * 4
