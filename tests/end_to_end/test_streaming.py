"""Streamed replies end to end (docs/streaming.md): the real web and worker processes,
the openai SDK streaming from the local OpenAI-compatible server at a chosen pace,
python-telegram-bot talking to the local Bot API, which records drafts, edits,
deletions and sends. The preview is best effort; the final is one ledger row, sent once."""

import time

import pytest

from conversations.models import Turn, TurnState
from delivery.models import OutboundMessage, OutboundState
from tests.conftest import wait_until
from tests.end_to_end.test_story import logged_in, story_url
from tests.fakes.openai_api import FakeOpenAI, Reply, ToolCalls
from tests.support.e2e import UNPACED, send, telegram_channel
from tools.models import CalendarEvent

pytestmark = pytest.mark.e2e
KEY_ENV = {"FAKE_OPENAI_API_KEY": "sk-test-agentloop"}
GROUP = -1001
# 13 pieces, 0.25 s apart: 3 s of writing.
LONG = "Claro: " + " ".join(f"palabra{i}" for i in range(11)) + " fin."


@pytest.fixture
def fake_openai():
    with FakeOpenAI() as fake:
        yield fake


def streaming_channel(make_channel, fake_telegram, fake_openai, **config):
    return telegram_channel(make_channel, fake_telegram, agent="openai", extra=UNPACED, agent_config={
        "base_url": fake_openai.url, "model": "fake-model", "api_key_env": "FAKE_OPENAI_API_KEY", **config})


def in_chat(calls, chat_id):
    return [c for c in calls if int(c.params["chat_id"]) == chat_id]


def group_update(text, chat_id=GROUP, message_id=None):
    from tests.support.e2e import update

    body = update(chat_id, text, message_id=message_id, user_id=555)
    body["message"]["chat"] = {"id": chat_id, "type": "supergroup", "title": "Equipo"}
    return body


def send_group(web, text):
    from tests.support import local_http
    from tests.support.e2e import SECRET

    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=group_update(text),
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text


def test_a_private_chat_sees_drafts_then_one_final_with_the_whole_text(processes, make_channel, fake_telegram,
                                                                       fake_openai):
    streaming_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(Reply(LONG, pace=0.25))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Explícame algo.")
    [final] = fake_telegram.wait_for("sendMessage", timeout=20)
    drafts = fake_telegram.calls("sendMessageDraft")
    assert final.params["text"] == LONG
    assert len(drafts) >= 2 and final.at - drafts[0].at >= 1.0
    # At most one a second, so no more than a second of streaming each, plus the first.
    assert all(b.at - a.at >= 0.9 for a, b in zip(drafts, drafts[1:]))
    assert len(drafts) <= 4
    assert all(d.params["text"].endswith("▍") and LONG.startswith(d.params["text"][:-2]) for d in drafts)
    assert len({d.params["draft_id"] for d in drafts}) == 1
    # Typing stopped when the first draft appeared.
    assert not [c for c in fake_telegram.calls("sendChatAction") if c.at > drafts[0].at + 0.05]
    time.sleep(0.3)
    assert len(fake_telegram.calls("sendMessage")) == 1 and fake_telegram.calls("editMessageText") == []
    turn = Turn.objects.get()
    # A draft still in flight when the answer came is abandoned (docs/streaming.md): the
    # platform got it, but the turn counts only the drafts it saw answered.
    assert turn.state == TurnState.DONE and turn.previews in (len(drafts), len(drafts) - 1)
    assert turn.first_delta_at is not None
    assert fake_openai.requests()[0].body["stream"] is True


def test_a_group_sees_one_preview_message_edited_into_the_final(processes, make_channel, fake_telegram,
                                                                fake_openai, client):
    streaming_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(Reply(LONG, pace=0.25))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send_group(web, "Explícanos algo.")
    row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).first(), timeout=20,
                     message="the final delivered")
    [preview] = in_chat(fake_telegram.calls("sendMessage"), GROUP)  # the one message: the preview
    edits = fake_telegram.calls("editMessageText")
    assert preview.params["text"].endswith("▍") and len(edits) >= 2
    # The previews a second apart; the final (the last edit, the ledger's) is never held
    # for that second: a stream that ends just after a preview is followed at once.
    previews = [preview, *edits[:-1]]
    assert all(b.at - a.at >= 0.9 for a, b in zip(previews, previews[1:]))
    [shown] = fake_telegram.sent_messages(chat_id=GROUP)
    assert shown["text"] == LONG and shown["message_id"] == int(row.platform_message_id)
    assert edits[-1].params["text"] == LONG  # the final is the last edit, the ledger's
    assert fake_telegram.calls("sendMessageDraft") == [] and fake_telegram.deleted == []
    turn = Turn.objects.get()
    assert turn.preview_message_id == row.platform_message_id and turn.previews == 1 + len(edits) - 1
    # The story page: when the first delta came, how many previews, which send was the final.
    story = logged_in(client, "audrey", "auditor").get(story_url(turn.conversation_id, format="json")).json()
    details = {d["label"]: d["value"] for e in story["entries"] for d in e["details"]}
    assert f"{turn.previews} previews shown; preview message {turn.preview_message_id}" in details["Streamed"]
    assert details["Streamed"].startswith("first delta at ")
    assert details["Final of a stream"] == f"the edit of preview message {row.platform_message_id} " \
                                          f"(after {turn.previews} previews)"


def test_a_429_on_a_preview_stops_previews_and_the_final_goes_once_on_time(processes, make_channel, fake_telegram,
                                                                          fake_openai):
    streaming_channel(make_channel, fake_telegram, fake_openai)
    fake_telegram.fail_next("sendMessageDraft", status=429, description="Too Many Requests: retry after 30",
                            retry_after=30)
    fake_openai.script(Reply(LONG, pace=0.25))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Explícame algo.")
    [final] = fake_telegram.wait_for("sendMessage", timeout=20)
    [request] = fake_openai.requests()
    assert final.params["text"] == LONG and not final.params["text"].startswith("♻️")
    assert final.at - request.at < 3.0 + 1.0  # 3 s of writing: not held back by the 429's 30 s
    assert len(fake_telegram.calls("sendMessageDraft")) == 1  # the refused one; none after it
    time.sleep(0.3)
    assert len(fake_telegram.calls("sendMessage")) == 1
    assert OutboundMessage.objects.get().attempts == 1


def test_a_turn_while_a_429_holds_the_channel_back_streams_no_preview_and_its_final_waits(
        processes, make_channel, fake_telegram, fake_openai):
    """A 429 on a reply paused the channel for 10 s (its flood key, as the ledger writes
    it; long enough to outlast the turn's window and start on a loaded machine): the next
    turn shows no drafts, which the platform would refuse too, and its final goes once
    the pause is over."""
    from delivery import pacing

    channel = streaming_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(Reply("Claro: " + " ".join(f"palabra{i}" for i in range(3)), pace=0.25))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    paused_at = time.monotonic()
    pacing.pause(pacing.flood_key(channel.pk), 10.0)
    send(web, "tg", 101, "Explícame algo.")
    [final] = fake_telegram.wait_for("sendMessage", timeout=30)
    assert fake_openai.requests(), "the agent ran"
    assert fake_telegram.calls("sendMessageDraft") == []
    assert final.at - paused_at >= 10.0 - 0.1  # the ledger waited the pause out (its clock is the wall's)
    assert Turn.objects.get().previews == 0


@pytest.mark.parametrize("failure", ["500", "timeout"])
def test_a_failed_final_edit_leaves_one_finished_answer_and_no_stale_preview(processes, make_channel,
                                                                            fake_telegram, fake_openai, failure):
    streaming_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(Reply("Uno dos tres cuatro.", pace=0.4))
    env = dict(KEY_ENV)
    hold = None
    if failure == "500":
        fake_telegram.fail_next("editMessageText", status=500, description="Internal Server Error", times=10)
    else:
        env["AGENTLOOP_TELEGRAM_READ_TIMEOUT"] = "1"
        hold = fake_telegram.hold("editMessageText")  # every edit: the previews' and the final's
    web, _ = processes.web(wait=False), processes.worker(**env)
    send_group(web, "Cuéntanos.")
    row = wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).first(), timeout=20,
                     message="the final delivered")
    if hold is not None:
        hold.release()  # the held edits land now, on a message deleted meanwhile
    time.sleep(0.3)
    [shown] = fake_telegram.sent_messages(chat_id=GROUP)  # one message in the chat, finished
    assert shown["text"] == "Uno dos tres cuatro." and str(shown["message_id"]) == row.platform_message_id
    [stale] = fake_telegram.deleted
    assert stale["text"].endswith("▍")
    assert row.preview_message_id == "" and row.attempts == 1


def test_a_tool_call_in_the_middle_of_a_stream_runs_once_on_whole_arguments(processes, make_channel, fake_telegram,
                                                                             fake_openai):
    import json

    streaming_channel(make_channel, fake_telegram, fake_openai)
    event = {"title": "Psicología", "start_datetime": "2026-12-01T10:00"}
    fake_openai.script(ToolCalls([("calendar_create_event", event)], content="Voy a agendarlo ahora.", pace=0.3),
                       Reply("Listo, quedó agendado.", pace=0.3))
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send(web, "tg", 101, "Agéndame psicología el 1 de diciembre a las 10.")
    [final] = fake_telegram.wait_for("sendMessage", timeout=20)
    assert final.params["text"] == "Voy a agendarlo ahora.\n\nListo, quedó agendado."
    assert CalendarEvent.objects.count() == 1
    first, second = fake_openai.requests()
    [result] = [json.loads(m["content"]) for m in second.messages if m["role"] == "tool"]
    assert result["status"] == "done"
    [asked] = [m for m in second.messages if m["role"] == "assistant"]
    assert json.loads(asked["tool_calls"][0]["function"]["arguments"]) == event
    drafts = [d.params["text"] for d in fake_telegram.calls("sendMessageDraft")]
    assert drafts and drafts[0].startswith("Voy")
    turn = Turn.objects.get()
    assert turn.fired_effect and turn.streamed_text.startswith("Voy a agendarlo")  # saved before the effect


def test_a_group_preview_whose_send_went_unanswered_is_never_followed_by_a_second(processes, make_channel,
                                                                                 fake_telegram, fake_openai):
    streaming_channel(make_channel, fake_telegram, fake_openai)
    fake_openai.script(Reply(LONG, pace=0.25))
    fake_telegram.drop_connection_next("sendMessage")  # the first preview: sent, no answer
    web, _ = processes.web(wait=False), processes.worker(**KEY_ENV)
    send_group(web, "Explícanos algo.")
    wait_until(lambda: OutboundMessage.objects.filter(state=OutboundState.DELIVERED).exists(), timeout=20,
               message="the final delivered")
    preview, final = in_chat(fake_telegram.calls("sendMessage"), GROUP)
    assert preview.params["text"].endswith("▍") and final.params["text"] == LONG
    assert fake_telegram.calls("editMessageText") == []  # previews stopped: it may be in the chat unseen
    assert Turn.objects.get().previews == 0
