"""Streamed replies end to end (docs/streaming.md): the real web and worker processes,
the openai SDK streaming from the local OpenAI-compatible server at a chosen pace,
python-telegram-bot talking to the local Bot API, which records drafts, edits,
deletions and sends. The preview is best effort; the final is one ledger row, sent once."""

import time

import pytest

from conversations.models import Turn, TurnState
from tests.e2e import UNPACED, send, telegram_channel
from tests.fakes.openai_api import FakeOpenAI, Reply

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
    from tests.e2e import update

    body = update(chat_id, text, message_id=message_id, user_id=555)
    body["message"]["chat"] = {"id": chat_id, "type": "supergroup", "title": "Equipo"}
    return body


def send_group(web, text):
    from tests import local_http
    from tests.e2e import SECRET

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
    assert turn.state == TurnState.DONE and turn.previews == len(drafts) and turn.first_delta_at is not None
    assert fake_openai.requests()[0].body["stream"] is True
