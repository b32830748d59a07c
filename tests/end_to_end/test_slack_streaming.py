"""Slack's streamed replies end to end (docs/slack.md, docs/streaming.md): the real web
server and worker, slack-sdk's AsyncWebClient against the local fake Web API, which
keeps each message's text as chat.startStream / appendStream / stopStream build it. The
echo agent writes a word every 0.3 s in a DM's thread. The streamed message is the
final one: one message, never a second unlabelled copy."""

import pytest

from conversations.engine import INTERRUPTED_NOTE
from conversations.models import Turn, TurnState
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.end_to_end.test_streaming_crashes import killed_at
from tests.fakes import slack_api
from tests.fakes.slack_api import FakeSlackAPI
from tests.support.slack import DM, TOKEN, send, slack_channel

pytestmark = pytest.mark.e2e
WORDS = " ".join(f"w{i}" for i in range(12))  # 12 words, 0.3 s apart: 3.3 s of writing


@pytest.fixture
def fake_slack():
    with FakeSlackAPI(tokens=[TOKEN]) as fake:
        yield fake


def echo_channel(make_channel, fake, **config):
    return slack_channel(make_channel, fake, agent="echo", agent_config={"stream_pace": 0.3, **config})


def delivered():
    return OutboundMessage.objects.filter(state=OutboundState.DELIVERED).count() >= 1


def in_thread(web, text=WORDS):
    parent = slack_api.new_ts()
    send(web, text, thread_ts=parent)
    return parent


def test_a_streamed_answer_in_a_dm_is_one_message_appended_and_stopped_with_the_whole_text(
        processes, make_channel, fake_slack):
    echo_channel(make_channel, fake_slack)
    web, _ = processes.web(wait=False), processes.worker()
    parent = in_thread(web)
    [stop] = fake_slack.wait_for("chat.stopStream", timeout=30)
    [start] = fake_slack.calls("chat.startStream")
    appends = fake_slack.calls("chat.appendStream")
    assert start.body["channel"] == DM and start.body["thread_ts"] == parent
    assert len(appends) >= 1 and stop.at - start.at >= 1.0  # the text grew as it was written
    assert all(b.at - a.at >= 0.9 for a, b in zip(appends, appends[1:]))  # at most one a second
    wait_until(delivered, message="the final recorded delivered")
    ts = stop.body["ts"]
    # Stopped with the rest of the text: the message reads the whole answer, nothing twice.
    assert start.body["markdown_text"] + "".join(a.body["markdown_text"] for a in appends) + \
        stop.body.get("markdown_text", "") == WORDS
    assert fake_slack.messages(DM) == {ts: WORDS} and not fake_slack.is_streaming(DM, ts)
    assert fake_slack.calls("chat.postMessage") == [] and fake_slack.calls("chat.update") == []
    row = OutboundMessage.objects.get()
    assert row.platform_message_id == ts and row.attempts == 1 and not row.needs_marker
    turn = Turn.objects.get()
    assert turn.state == TurnState.DONE and turn.previews == 1 + len(appends) and turn.preview_message_id == ts


def test_a_429_on_an_append_stops_appends_and_the_final_still_goes_once(processes, make_channel, fake_slack):
    echo_channel(make_channel, fake_slack)
    fake_slack.fail_next("chat.appendStream", status=429, retry_after=30)
    web, _ = processes.web(wait=False), processes.worker()
    in_thread(web)
    [stop] = fake_slack.wait_for("chat.stopStream", timeout=30)
    [start] = fake_slack.calls("chat.startStream")
    assert len(fake_slack.calls("chat.appendStream")) == 1  # the refused one: no more after it
    assert stop.at - start.at < 6  # on time: the 429's 30 s were the previews' only
    wait_until(delivered, message="the final recorded delivered")
    assert fake_slack.messages(DM) == {stop.body["ts"]: WORDS}
    assert fake_slack.calls("chat.postMessage") == []
    assert OutboundMessage.objects.get().attempts == 1


@pytest.mark.parametrize("effect", [False, True], ids=["before-an-effect", "after-an-effect"])
def test_killed_mid_stream_the_recovery_completes_that_message(processes, make_channel, fake_slack, effect):
    echo_channel(make_channel, fake_slack, **({"effect_at_word": 2} if effect else {}))
    web = processes.web(wait=False)
    in_thread(web)
    killed_at(processes, "stream.after_preview@3")
    [start] = fake_slack.calls("chat.startStream")
    [ts] = fake_slack.messages(DM)  # the stream the killed run started
    assert fake_slack.is_streaming(DM, ts) and start.body["channel"] == DM
    turn = Turn.objects.get()
    assert turn.state == TurnState.RUNNING and turn.preview_message_id == ts
    processes.worker()
    wait_until(delivered, timeout=30, message="the final delivered")
    turn.refresh_from_db()
    expected = f"{turn.streamed_text.rstrip()}\n\n{INTERRUPTED_NOTE}" if effect else WORDS
    # The stream an earlier run left is stopped and replaced by the final: one message.
    assert fake_slack.messages(DM) == {ts: expected} and not fake_slack.is_streaming(DM, ts)
    assert fake_slack.calls("chat.postMessage") == [] and len(fake_slack.calls("chat.startStream")) == 1
    [update] = fake_slack.calls("chat.update")
    assert update.body["ts"] == ts and "Recovered" not in update.body["text"]
    assert turn.state == (TurnState.FAILED if effect else TurnState.DONE)
    assert OutboundMessage.objects.get().platform_message_id == ts


def test_a_final_stop_answered_500_has_the_stream_deleted_then_one_fresh_message(processes, make_channel,
                                                                                 fake_slack):
    echo_channel(make_channel, fake_slack)
    fake_slack.fail_next("chat.stopStream", status=500)
    web, _ = processes.web(wait=False), processes.worker()
    parent = in_thread(web)
    [post] = fake_slack.wait_for("chat.postMessage", timeout=30)
    wait_until(delivered, message="the final recorded delivered")
    [stop] = fake_slack.calls("chat.stopStream")
    # The stop may have landed, or not: the stream is deleted before the final goes fresh,
    # unlabelled (the deletion worked): one finished answer in the chat.
    assert fake_slack.deleted() == [stop.body["ts"]]
    assert post.body["text"] == WORDS and post.body["thread_ts"] == parent
    assert list(fake_slack.messages(DM).values()) == [WORDS]
    row = OutboundMessage.objects.get()
    assert row.preview_message_id == "" and not row.needs_marker
