"""POST /webhooks/telegram/<slug>/: the secret, bad input, what is stored and what is not.

Payloads are real captured-shape updates from tests/fixtures/."""

import json
import threading
from pathlib import Path

import httpx
import pytest

from conversations import flushing
from conversations.models import InboundMessage, MessageBuffer, Turn

FIXTURES = Path(__file__).parent.parent / "fixtures"
SECRET = "s3cret-token_ABC"
HEADER = "HTTP_X_TELEGRAM_BOT_API_SECRET_TOKEN"


def fixture(name):
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture
def tg(make_channel):
    return make_channel("tg", kind="telegram", group_replies="always",
                        platform_settings={"bot_token": "123:ABC", "webhook_secret": SECRET})


def post(client, body, *, slug="tg", secret=SECRET, raw=False):
    extra = {HEADER: secret} if secret is not None else {}
    data = body if raw else json.dumps(body)
    return client.post(f"/webhooks/telegram/{slug}/", data=data, content_type="application/json", **extra)


def nothing_stored():
    return not InboundMessage.objects.exists() and not MessageBuffer.objects.exists()


def test_text_update_is_admitted_into_a_buffer(client, tg):
    response = post(client, fixture("telegram_text_update.json"))
    assert response.status_code == 200 and response.json() == {"ok": True, "duplicate": False}
    message = InboundMessage.objects.get()
    assert message.platform_message_id == "52093311:3051"
    assert message.sender_name == "Camila Rojas" and message.reply_target == "3051"
    assert MessageBuffer.objects.get().window_kind == "neutral"


def test_a_retried_update_is_a_duplicate(client, tg):
    post(client, fixture("telegram_text_update.json"))
    response = post(client, fixture("telegram_text_update.json"))
    assert response.json() == {"ok": True, "duplicate": True}
    assert InboundMessage.objects.count() == 1


def test_group_photo_in_a_topic_gets_its_captions_window_and_keeps_the_thread(client, tg):
    post(client, fixture("telegram_group_photo_update.json"))
    message = InboundMessage.objects.get()
    assert (message.media_type, message.thread_id, message.text) == ("photo", "17", "la factura")
    assert message.conversation.is_group
    [turn] = flushing.flush_due(now=MessageBuffer.objects.get().flush_at)
    assert (turn.flush_reason, turn.thread_id, turn.merged_input) == ("window", "17", "Bea: [photo] la factura")


def test_updates_we_do_not_act_on_get_200_so_telegram_stops_retrying(client, tg):
    response = post(client, fixture("telegram_edited_update.json"))
    assert response.status_code == 200 and response.json()["ignored"] is True
    assert nothing_stored()


@pytest.mark.parametrize("secret, status", [(None, 401), ("wrong", 403), ("", 403), (SECRET + "x", 403)])
def test_missing_or_wrong_secret_is_refused_and_nothing_stored(client, tg, secret, status):
    response = post(client, fixture("telegram_text_update.json"), secret=secret)
    assert response.status_code == status
    assert "X-Telegram-Bot-Api-Secret-Token" in response.json()["error"]
    assert nothing_stored()


def test_a_channel_without_a_secret_refuses_everything(client, make_channel):
    make_channel("open", kind="telegram", platform_settings={"bot_token": "1:A"})
    assert post(client, fixture("telegram_text_update.json"), slug="open").status_code == 403
    assert nothing_stored()


@pytest.mark.parametrize("body", ["{not json", "", "[1, 2]", '{"message": {}}', '"text"',
                                  '{"update_id": 1, "message": {"message_id": "x"}}'])
def test_malformed_payloads_are_400_and_nothing_stored(client, tg, body):
    response = post(client, body, raw=True)
    assert response.status_code == 400, response.content
    assert response.json()["ok"] is False
    assert nothing_stored()


def test_unknown_or_non_telegram_channel_is_404(client, tg, make_channel):
    make_channel("api-chan", kind="api")
    assert post(client, fixture("telegram_text_update.json"), slug="nope").status_code == 404
    assert post(client, fixture("telegram_text_update.json"), slug="api-chan").status_code == 404
    assert nothing_stored()


def test_oversized_body_is_413_and_nothing_stored(client, tg, settings):
    update = fixture("telegram_text_update.json")
    update["message"]["text"] = "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 10)
    assert post(client, update).status_code == 413
    assert nothing_stored()


def test_get_is_not_allowed(client, tg):
    assert client.get("/webhooks/telegram/tg/").status_code == 405


@pytest.mark.e2e
def test_twenty_concurrent_copies_are_one_message_and_one_turn(processes, make_channel):
    """Real HTTP server, 20 clients at once with the same update."""
    make_channel("tg", kind="telegram", platform_settings={"bot_token": "123:ABC", "webhook_secret": SECRET})
    web = processes.web()
    body = json.dumps(fixture("telegram_text_update.json"))
    start = threading.Barrier(20)
    answers = []

    def send():
        with httpx.Client(timeout=30) as http:
            start.wait()
            response = http.post(f"{web.url}/webhooks/telegram/tg/", content=body,
                                 headers={"Content-Type": "application/json",
                                          "X-Telegram-Bot-Api-Secret-Token": SECRET})
            answers.append((response.status_code, response.json().get("duplicate")))

    threads = [threading.Thread(target=send) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [(200, False)] + [(200, True)] * 19
    assert InboundMessage.objects.count() == 1
    flushing.flush_due(now=MessageBuffer.objects.get().flush_at)
    assert Turn.objects.count() == 1


@pytest.mark.e2e
def test_concurrent_messages_of_one_conversation_all_land_in_its_buffer(processes, make_channel):
    """20 different messages of one chat at once: serialised per conversation, none lost."""
    make_channel("tg", kind="telegram", platform_settings={"bot_token": "123:ABC", "webhook_secret": SECRET})
    web = processes.web()
    base = fixture("telegram_text_update.json")
    start = threading.Barrier(20)
    statuses = []

    def send(i):
        update = json.loads(json.dumps(base))
        update["update_id"] += i
        update["message"]["message_id"] += i
        update["message"]["text"] = f"parte {i} y"
        with httpx.Client(timeout=30) as http:
            start.wait()
            statuses.append(http.post(f"{web.url}/webhooks/telegram/tg/", json=update,
                                      headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}).status_code)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 20
    buffer = MessageBuffer.objects.get()
    assert buffer.message_count == 20
    assert InboundMessage.objects.filter(buffer=buffer).count() == 20
