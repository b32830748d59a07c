"""Media is part of the burst, through the real web server and worker: an album of three
photos with its question after it is one turn, and so is a photo followed by its
question — the two cases that made four and two replies while media flushed at once."""

import itertools
import time

import pytest

from conversations.models import BufferState, MessageBuffer, Turn, TurnState
from delivery.models import OutboundMessage, OutboundState
from tests import local_http
from tests.conftest import wait_until
from tests.e2e import SECRET, send, telegram_channel

pytestmark = pytest.mark.e2e
_ids = itertools.count(700_000)


def photo_update(chat_id, *, caption="", album=""):
    """A Telegram photo message as the Bot API sends it (sizes of one photo; an album's
    items share `media_group_id`)."""
    message_id = next(_ids)
    message = {
        "message_id": message_id, "date": int(time.time()),
        "from": {"id": chat_id, "is_bot": False, "first_name": "Camila"},
        "chat": {"id": chat_id, "type": "private", "first_name": "Camila"},
        "photo": [{"file_id": f"photo-{message_id}-s", "file_unique_id": f"u{message_id}s", "width": 90,
                   "height": 67, "file_size": 1_200},
                  {"file_id": f"photo-{message_id}-m", "file_unique_id": f"u{message_id}m", "width": 800,
                   "height": 600, "file_size": 61_000}],
    }
    if caption:
        message["caption"] = caption
    if album:
        message["media_group_id"] = album
    return {"update_id": next(_ids), "message": message}


def post(web, body):
    response = local_http.post(f"{web.url}/webhooks/telegram/tg/", json=body,
                               headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text


def settled(chat_id):
    """Every buffer of the chat flushed, its turns over and their replies delivered."""
    def check():
        buffers = MessageBuffer.objects.filter(conversation__chat_id=str(chat_id))
        turns = Turn.objects.filter(conversation__chat_id=str(chat_id))
        return (buffers.exists() and not buffers.filter(state=BufferState.OPEN).exists()
                and not turns.exclude(state__in=[TurnState.DONE, TurnState.FAILED]).exists()
                and not OutboundMessage.objects.filter(chat_id=str(chat_id)).exclude(
                    state=OutboundState.DELIVERED).exists())
    return check


def replies(fake, chat_id):
    return [c.params["text"] for c in fake.calls("sendMessage") if str(c.params["chat_id"]) == str(chat_id)]


def test_an_album_and_a_photo_each_with_their_question_are_one_turn_each(processes, make_channel, fake_telegram):
    telegram_channel(make_channel, fake_telegram)
    web, _ = processes.web(wait=False), processes.worker()
    album = [photo_update(501, caption="Las boletas de ayer", album="13579"),
             photo_update(501, album="13579"), photo_update(501, album="13579")]
    for item in album:  # as a phone uploads them: one after the other
        post(web, item)
    time.sleep(0.5)  # the user's pause before the question (the table's 0.5 s), not a wait for a result
    send(web, "tg", 501, "¿cuánto suman en total?")
    post(web, photo_update(502))
    time.sleep(0.6)
    send(web, "tg", 502, "¿qué dice esta boleta?")

    for chat in (501, 502):
        wait_until(settled(chat), timeout=30, message=f"chat {chat} answered")
    assert replies(fake_telegram, 501) == ["[photo] Las boletas de ayer\n[photo]\n[photo]\n¿cuánto suman en total?"]
    assert replies(fake_telegram, 502) == ["[photo]\n¿qué dice esta boleta?"]
    [album_turn] = Turn.objects.filter(conversation__chat_id="501")
    [photo_turn] = Turn.objects.filter(conversation__chat_id="502")
    assert (album_turn.flush_reason, photo_turn.flush_reason) == ("window", "window")
    buffer = MessageBuffer.objects.get(conversation__chat_id="501")
    assert buffer.message_count == 2  # the album and its question
