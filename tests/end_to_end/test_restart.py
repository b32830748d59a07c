"""A restart is not an outage: the whole product killed with SIGKILL and started again
on the same host — the new worker takes over what the dead one held (its Telegram
polling lease, turns, rows mid-send) at once, not when leases and heartbeats expire."""

import time

import pytest

from conversations import liveness
from conversations.models import Channel, InboundMessage, MessageBuffer
from tests.conftest import wait_until
from tests.support.e2e import TOKEN

pytestmark = pytest.mark.e2e

WINDOW = 1.0


def replies(fake, chat_id):
    return [(c.params["text"], c.wall) for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def polling_channel(make_channel, fake):
    return make_channel("poll", kind="telegram", platform_settings={
        "bot_token": TOKEN, "api_base": fake.url, "mode": "polling"},
        window_closed=WINDOW, window_greeting=WINDOW, window_open=WINDOW, window_neutral=WINDOW)


def test_sigkill_mid_burst_then_restart_answers_new_messages_within_their_window(
        processes, make_channel, fake_telegram):
    channel = polling_channel(make_channel, fake_telegram)
    web, worker = processes.web(wait=False), processes.worker()
    wait_until(lambda: Channel.objects.get(pk=channel.pk).poll_owner, message="the poller's lease")
    before = {1000 + i: f"Question {i} before the crash?" for i in range(6)}
    for chat_id, text in before.items():
        fake_telegram.push_message(TOKEN, chat_id, text)
    wait_until(lambda: InboundMessage.objects.count() >= 3, timeout=15, message="the burst half admitted")
    worker.kill()  # mid-burst: some admitted, some answered, some still at the platform
    web.kill()

    processes.web(wait=False), processes.worker()
    after = {2000 + i: f"Question {i} after the restart?" for i in range(3)}
    sent = {chat_id: (fake_telegram.push_message(TOKEN, chat_id, text), time.time())[1]
            for chat_id, text in after.items()}
    for chat_id, text in after.items():
        wait_until(lambda: any(t == text for t, _ in replies(fake_telegram, chat_id)), timeout=20,
                   message=f"an answer in chat {chat_id}")
        answered = min(wall for t, wall in replies(fake_telegram, chat_id) if t == text)
        buffer = MessageBuffer.objects.get(conversation__chat_id=str(chat_id))
        window = (buffer.flush_at - buffer.last_message_at).total_seconds()
        polls = [round(c.wall - sent[chat_id], 2) for c in fake_telegram.calls() if c.wall > sent[chat_id] - 3]
        assert answered - sent[chat_id] <= window + 2.0, (
            f"chat {chat_id} answered {answered - sent[chat_id]:.1f} s after it was sent (window {window} s); "
            f"flushed {(buffer.flushed_at.timestamp() - sent[chat_id]):.2f}; calls {polls}")
    for chat_id, text in before.items():  # nothing lost, nothing doubled unlabelled
        wait_until(lambda: any(text in t for t, _ in replies(fake_telegram, chat_id)), timeout=20,
                   message=f"the answer in chat {chat_id}")
    time.sleep(1.0)  # a late duplicate would show up by now
    for chat_id, text in {**before, **after}.items():
        assert sum(t == text for t, _ in replies(fake_telegram, chat_id)) == 1, replies(fake_telegram, chat_id)


def test_an_owner_is_gone_when_its_pid_is_free_or_taken_by_a_later_process():
    me = liveness.new_owner()
    assert not liveness.owner_gone(me)
    host, pid, started, tail = me.split(":")
    assert liveness.owner_gone(f"{host}:{pid}:{int(started) - 1}:{tail}"), "same pid, an earlier process: gone"
    assert liveness.owner_gone(f"{host}:{2 ** 22 + 5}:{started}:{tail}"), "a pid nobody has: gone"
    assert not liveness.owner_gone(f"elsewhere:{2 ** 22 + 5}:{started}:{tail}"), "another host's is not judged"
    assert not liveness.owner_gone("agent:webhook")
