"""Streamed replies when the worker dies or the user steps in (docs/streaming.md): a
real worker killed with SIGKILL mid-stream (a fault point: `stream.after_preview@N`, the
Nth preview shown), then started again; /stop and an interrupting message mid-stream.
The echo agent writes a word every `stream_pace` seconds."""

import signal
import time

import pytest

from conversations.engine import INTERRUPTED_NOTE
from conversations.models import Turn, TurnState
from conversations.worker.streams import STOPPED_NOTE
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.end_to_end.test_streaming import GROUP, send_group
from tests.support.e2e import UNPACED, send, telegram_channel

pytestmark = pytest.mark.e2e
WORDS = " ".join(f"w{i}" for i in range(12))  # 12 words, 0.3 s apart: 3.3 s of writing
STOPPED_NOTE_EN = str(STOPPED_NOTE)  # the users here give no language: the deployment's, English


def echo_channel(make_channel, fake, **config):
    return telegram_channel(make_channel, fake, agent="echo", extra=UNPACED,
                            agent_config={"stream_pace": 0.3, **config})


def killed_at(processes, point):
    doomed = processes.worker(wait=False, AGENTLOOP_FAILPOINT=point)
    wait_until(lambda: doomed.popen.poll() is not None, timeout=30, message=f"the worker to die at {point}")
    assert doomed.popen.returncode == -signal.SIGKILL
    return doomed


def delivered(count):
    return lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= count


def test_killed_mid_stream_before_any_effect_reruns_and_ends_with_one_final_in_the_preview(
        processes, make_channel, fake_telegram):
    echo_channel(make_channel, fake_telegram)
    web = processes.web(wait=False)
    send_group(web, WORDS)
    killed_at(processes, "stream.after_preview@2")
    turn = Turn.objects.get()
    assert turn.state == TurnState.RUNNING and turn.preview_message_id and not turn.fired_effect
    assert turn.streamed_text == ""  # no effect: nothing saved, the turn runs again
    processes.worker()
    wait_until(delivered(1), timeout=30, message="the final delivered")
    time.sleep(0.3)
    [shown] = fake_telegram.sent_messages(chat_id=GROUP)  # the re-run reused the leftover preview
    assert shown["text"] == turn.merged_input == f"Camila: {WORDS}"  # (a group's input names its sender)
    assert len(fake_telegram.calls("sendMessage")) == 1 and fake_telegram.deleted == []
    turn.refresh_from_db()
    assert turn.state == TurnState.DONE and turn.attempts == 2


def test_killed_mid_stream_before_any_effect_in_a_private_chat_sends_one_final(processes, make_channel,
                                                                              fake_telegram):
    echo_channel(make_channel, fake_telegram)
    web = processes.web(wait=False)
    send(web, "tg", 101, WORDS)
    killed_at(processes, "stream.after_preview@2")
    assert fake_telegram.calls("sendMessage") == []  # drafts only: nothing finished in the chat
    processes.worker()
    [final] = fake_telegram.wait_for("sendMessage", timeout=30)
    time.sleep(0.3)
    assert final.params["text"] == WORDS and len(fake_telegram.calls("sendMessage")) == 1


@pytest.mark.parametrize("chat", ["private", "group"])
def test_killed_mid_stream_after_an_effect_sends_what_was_saved_once_marked_interrupted(
        processes, make_channel, fake_telegram, chat):
    echo_channel(make_channel, fake_telegram, effect_at_word=2)
    web = processes.web(wait=False)
    if chat == "group":
        send_group(web, WORDS)
    else:
        send(web, "tg", 101, WORDS)
    killed_at(processes, "stream.after_preview@3")
    turn = Turn.objects.get()
    assert turn.fired_effect and turn.streamed_text and turn.merged_input.startswith(turn.streamed_text)
    assert turn.streamed_text.split()[-2:] != turn.merged_input.split()[-2:]  # cut short
    processes.worker()
    wait_until(delivered(1), timeout=30, message="the final delivered")
    time.sleep(0.3)
    expected = f"{turn.streamed_text.rstrip()}\n\n{INTERRUPTED_NOTE}"
    if chat == "group":
        [shown] = fake_telegram.sent_messages(chat_id=GROUP)  # the preview, edited into it
        assert shown["text"] == expected and len(fake_telegram.calls("sendMessage")) == 1
    else:
        [final] = fake_telegram.calls("sendMessage")
        assert final.params["text"] == expected
    turn.refresh_from_db()
    assert turn.state == TurnState.FAILED  # never run again: it had acted
    assert OutboundMessage.objects.get().attempts == 1


def test_stop_mid_stream_ends_it_with_what_was_said_marked_stopped(processes, make_channel, fake_telegram):
    echo_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    send(web, "tg", 101, WORDS)
    fake_telegram.wait_for("sendMessageDraft", count=2, timeout=20)
    send(web, "tg", 101, "/stop")
    wait_until(delivered(2), timeout=20, message="the stopped reply and the command's answer")
    time.sleep(0.5)
    texts = [c.params["text"] for c in fake_telegram.calls("sendMessage")]
    [stopped] = [t for t in texts if t.endswith(STOPPED_NOTE_EN)]
    said = stopped[:-len(STOPPED_NOTE_EN)].rstrip()
    assert said and WORDS.startswith(said) and said != WORDS
    assert "Stopped." in texts and len(texts) == 2
    assert Turn.objects.get().state == TurnState.CANCELLED


def test_an_interrupting_message_cancels_the_stream_and_its_preview(processes, make_channel, fake_telegram):
    channel = echo_channel(make_channel, fake_telegram)
    channel.double_texting = "interrupt"
    channel.save()
    web, _ = processes.web(wait=False), processes.worker()
    send_group(web, WORDS)
    fake_telegram.wait_for("editMessageText", count=1, timeout=20)
    send_group(web, "otra cosa")
    wait_until(delivered(1), timeout=30, message="the next turn's final")
    time.sleep(0.3)
    [stale] = fake_telegram.deleted
    assert stale["text"].endswith("▍")
    [shown] = fake_telegram.sent_messages(chat_id=GROUP)
    assert not shown["text"].endswith("▍") and shown["text"].endswith("otra cosa")
    assert [t.state for t in Turn.objects.order_by("pk")] == [TurnState.CANCELLED, TurnState.DONE]


def test_killed_after_the_stale_preview_was_deleted_resends_the_final_plain(processes, make_channel,
                                                                           fake_telegram):
    """The final edit answered 500, the preview was deleted, the worker died before
    recording that: the resend finds the preview gone and sends the final fresh, plain —
    the chat never held the final twice."""
    echo_channel(make_channel, fake_telegram)
    fake_telegram.fail_next("editMessageText", status=500, description="Internal Server Error", times=50)
    web = processes.web(wait=False)
    send_group(web, WORDS)
    killed_at(processes, "ledger.after_preview_removed")
    row = OutboundMessage.objects.get()
    assert row.state == OutboundState.ATTEMPTING and row.preview_message_id
    processes.worker()
    wait_until(delivered(1), timeout=30, message="the final delivered")
    time.sleep(0.3)
    [stale] = fake_telegram.deleted
    [shown] = fake_telegram.sent_messages(chat_id=GROUP)
    assert stale["text"].endswith("▍") and shown["text"] == Turn.objects.get().merged_input  # plain: no ♻️
    row.refresh_from_db()
    assert row.attempts == 2 and row.preview_message_id == "" and row.platform_message_id == str(shown["message_id"])
