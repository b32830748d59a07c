"""The worker loop as a real process, with the real web server and a local fake
Telegram Bot API driven by python-telegram-bot: bursts, windows, replies, typing,
control commands, double texting, crashes, several workers, long polling."""

from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.models import BufferState, Channel, InboundMessage, MessageBuffer, Turn, TurnState
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.support.e2e import TOKEN, send, telegram_channel

pytestmark = pytest.mark.e2e


def texts(fake, chat_id=None):
    return [c.params["text"] for c in fake.calls("sendMessage")
            if chat_id is None or int(c.params["chat_id"]) == chat_id]


def test_burst_becomes_one_turn_after_the_adaptive_window(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    for text in ["Confirmo las horas de psicología y", "también la de kine y", "la del dentista y"]:
        last = send(web, "tg", 101, text)
    send(web, "tg", 202, "¿Me confirmas la hora?")

    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    burst = Turn.objects.get(conversation__chat_id="101")
    assert burst.merged_input == "Confirmo las horas de psicología y\ntambién la de kine y\nla del dentista y"
    assert texts(fake_telegram, 101) == [burst.merged_input]
    reply = [c for c in fake_telegram.calls("sendMessage") if int(c.params["chat_id"]) == 101][0]
    assert reply.params["reply_parameters"]["message_id"] == last["message"]["message_id"]

    for chat, window in (("101", 4.0), ("202", 1.2)):
        buffer = MessageBuffer.objects.get(conversation__chat_id=chat)
        assert (buffer.flush_at - buffer.last_message_at).total_seconds() == pytest.approx(window)
        lateness = (buffer.flushed_at - buffer.flush_at).total_seconds()
        assert 0 <= lateness < 0.5, f"flushed {lateness:.3f}s after its deadline"


def test_stop_during_a_burst_answers_at_once_and_runs_nothing(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Agéndame las horas y")
    send(web, "tg", 101, "/stop")
    [answer] = fake_telegram.wait_for("sendMessage", timeout=5)
    assert answer.params["text"] == "Stopped."
    buffer = MessageBuffer.objects.get()
    assert buffer.state == BufferState.DROPPED
    # Answered before the burst's 4 s window would even have closed.
    assert answer.wall < buffer.last_message_at.timestamp() + 4.0
    assert not Turn.objects.exists()


def test_turns_run_concurrently_and_typing_is_refreshed(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, agent_config={"delay": 2.0})
    web, _ = processes.web(wait=False), processes.worker()
    for chat in range(1, 11):
        send(web, "tg", chat, "¿Hola, me ayudas?")
    fake_telegram.wait_for("sendMessage", count=10, timeout=20)
    turns = list(Turn.objects.all())
    assert len(turns) == 10 and all(t.state == TurnState.DONE for t in turns)
    # Every turn was running at one same instant: they overlapped, not queued.
    assert max(t.started_at for t in turns) < min(t.finished_at for t in turns)
    typing_chat_1 = [c for c in fake_telegram.calls("sendChatAction") if int(c.params["chat_id"]) == 1]
    reply_chat_1 = [c for c in fake_telegram.calls("sendMessage") if int(c.params["chat_id"]) == 1][0]
    assert len(typing_chat_1) >= 3, "refreshed every 0.5 s during a 2 s turn"
    assert all(c.at <= reply_chat_1.at for c in typing_chat_1), "typing stops when the turn ends"


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
def test_interrupt_cancels_a_turn_without_effects(processes, make_channel, fake_telegram, strategy):
    telegram_channel(make_channel, fake_telegram, double_texting=strategy, agent_config={"delay": 3.0})
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Confirmo las horas de psicología.")
    first = wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).first(), message="turn running")
    send(web, "tg", 101, "Agéndame las horas en mi calendario.")
    [reply] = fake_telegram.wait_for("sendMessage", timeout=15)
    first.refresh_from_db()
    assert first.state == TurnState.CANCELLED
    expected = "Agéndame las horas en mi calendario."
    if strategy == "interrupt":
        expected = "Confirmo las horas de psicología.\n" + expected
    assert reply.params["text"] == expected
    assert len(texts(fake_telegram)) == 1


def test_no_interrupt_after_an_external_effect(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, double_texting="interrupt",
                     agent_config={"delay": 1.5, "mark_effect": True})
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Confirmo las horas de psicología.")
    wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING, fired_effect=True).exists(),
               message="turn fired its effect")
    send(web, "tg", 101, "Agéndame las horas en mi calendario.")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    assert texts(fake_telegram) == ["Confirmo las horas de psicología.", "Agéndame las horas en mi calendario."]
    assert list(Turn.objects.order_by("pk").values_list("state", flat=True)) == [TurnState.DONE, TurnState.DONE]


def test_reject_tells_the_user_to_wait(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, double_texting="reject", agent_config={"delay": 1.5})
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Confirmo las horas.")
    wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).exists(), message="turn running")
    send(web, "tg", 101, "¿Me oyes?")
    fake_telegram.wait_for("sendMessage", count=2, timeout=15)
    assert "still working" in texts(fake_telegram)[0]
    assert texts(fake_telegram)[1] == "Confirmo las horas."
    assert Turn.objects.count() == 1


def test_worker_killed_with_a_pending_buffer_flushes_it_once_after_restart(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, worker = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "Confirmo las horas y")
    worker.kill()
    buffer = MessageBuffer.objects.get()
    wait_until(lambda: timezone.now() > buffer.flush_at + timedelta(seconds=0.3), message="deadline to pass")
    assert MessageBuffer.objects.get().state == BufferState.OPEN  # nobody was running
    processes.worker()
    fake_telegram.wait_for("sendMessage", timeout=10)
    assert Turn.objects.count() == 1 and texts(fake_telegram) == ["Confirmo las horas y"]
    assert MessageBuffer.objects.get().state == BufferState.FLUSHED


def test_worker_killed_mid_turn_runs_it_again_after_restart(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram, agent_config={"delay": 1.0})
    web, worker = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "¿Me ayudas?")
    wait_until(lambda: Turn.objects.filter(state=TurnState.RUNNING).exists(), message="turn running")
    worker.kill()
    processes.worker()
    fake_telegram.wait_for("sendMessage", timeout=15)
    turn = Turn.objects.get()
    assert (turn.state, turn.attempts) == (TurnState.DONE, 2)
    assert texts(fake_telegram) == ["¿Me ayudas?"]


def test_two_workers_flush_every_buffer_exactly_once(processes, make_channel):
    """Any number of workers side by side: claims are compare-and-swaps."""
    from conversations.ingest import Inbound, admit

    channel = make_channel("api", kind="api", window_closed=0.3)
    workers = [processes.worker(), processes.worker()]
    start = timezone.now()
    count = 150
    for i in range(count):
        # Deadlines spread over ~1.5 s, so both workers are awake for many of them.
        admit(channel, Inbound(platform_message_id=str(i), chat_id=str(i), sender_id=str(i), text="¿ok?"),
              now=start + timedelta(milliseconds=10 * i))
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() == count, timeout=60,
               message="every reply sent")
    assert Turn.objects.count() == count
    assert set(Turn.objects.values_list("buffer_id", flat=True)) == set(MessageBuffer.objects.values_list("pk", flat=True))
    assert not MessageBuffer.objects.exclude(state=BufferState.FLUSHED).exists()
    assert OutboundMessage.objects.count() == count
    for worker in workers:
        assert "Traceback" not in worker.output(), worker.output()


def test_long_polling_persists_its_offset_and_a_rebuilt_poller_readmits_nothing(
        processes, make_channel, fake_telegram):
    channel = make_channel("poll", kind="telegram", platform_settings={
        "bot_token": TOKEN, "api_base": fake_telegram.url, "mode": "polling"})
    processes.worker()
    first = fake_telegram.push_message(TOKEN, 101, "¿Me confirmas las horas?")
    fake_telegram.wait_for("sendMessage", timeout=15)
    wait_until(lambda: Channel.objects.get(pk=channel.pk).poll_offset == first["update_id"] + 1,
               message="offset persisted")
    # The platform re-delivers everything after the connection drops; the poller rebuilds its Bot.
    fake_telegram.forget_offsets = True
    fake_telegram.drop_connection_next("getUpdates")
    second = fake_telegram.push_message(TOKEN, 101, "¿Y la de mañana?")
    fake_telegram.wait_for("sendMessage", count=2, timeout=20)
    wait_until(lambda: len(fake_telegram.calls("getUpdates")) > 4, message="more polls after the rebuild")
    assert InboundMessage.objects.count() == 2
    assert texts(fake_telegram) == ["¿Me confirmas las horas?", "¿Y la de mañana?"]
    assert second["update_id"] > first["update_id"]
    assert fake_telegram.calls("deleteWebhook"), "polling clears a webhook first"


def test_an_agent_past_its_overall_deadline_fails_the_turn_with_the_apology(processes, make_channel, fake_telegram):
    """Per-request timeouts do not bound a turn (a peer may trickle, a loop may go on):
    the whole answer has a deadline; past it the user gets the apology, and the turn is
    never run again (it may have acted)."""
    from conversations.worker import APOLOGY

    telegram_channel(make_channel, fake_telegram, agent_config={"delay": 30.0, "deadline": 1.0})
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, "¿Me confirmas la hora?")
    fake_telegram.wait_for("sendMessage", timeout=15)
    assert texts(fake_telegram, 101) == [APOLOGY]
    turn = Turn.objects.get()
    assert turn.state == TurnState.FAILED and turn.attempts == 1
    assert turn.outcome == "agent unavailable: no answer within 1 s"
