"""Helpers for the end-to-end tests: Telegram updates sent to the real web server, and an
operator logged in to it."""

import itertools
import time

import httpx

from tests.support import local_http

SECRET = "e2e-secret"
TOKEN = "4242:E2E-TOKEN"
_update_ids = itertools.count(900_000)
_message_ids = itertools.count(1)


# A Telegram channel's pacing switched off (delivery.pacing), for tests of something
# else that send several replies into one chat at once: paced, the second would wait 1 s.
UNPACED = {"messages_per_second": 0, "chat_interval": 0, "group_messages_per_minute": 0}


def update(chat_id, text, *, message_id=None, first_name="Camila", user_id=None, language_code=None):
    """`language_code`: the sender's, as a Telegram client gives it ("es"); None: not given."""
    message_id = message_id or next(_message_ids)
    body = {
        "update_id": next(_update_ids),
        "message": {
            "message_id": message_id, "date": int(time.time()), "text": text,
            "from": {"id": user_id or chat_id, "is_bot": False, "first_name": first_name},
            "chat": {"id": chat_id, "type": "private", "first_name": first_name},
        },
    }
    if language_code:
        body["message"]["from"]["language_code"] = language_code
    return body


def send(web, slug, chat_id, text, **kw):
    """POST one update to the webhook; returns the update."""
    body = update(chat_id, text, **kw)
    response = local_http.post(f"{web.url}/webhooks/telegram/{slug}/", json=body,
                          headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}, timeout=10)
    assert response.status_code == 200, response.text
    return body


def telegram_channel(make_channel, fake, slug="tg", mode="webhook", extra=None, **fields):
    """`extra`: more platform settings (UNPACED, say). Its groups answer every message
    (`group_replies`): tests of something else send group messages without a mention."""
    fields.setdefault("group_replies", "always")
    return make_channel(slug, kind="telegram", platform_settings={
        "bot_token": TOKEN, "webhook_secret": SECRET, "api_base": fake.url, "mode": mode, **(extra or {})}, **fields)


def operator_session(web, username, password):
    """An HTTP client logged in through the admin's login form, as a browser is (django-axes
    watches that form); its `cookies["csrftoken"]` goes with each POST."""
    client = httpx.Client(base_url=web.url, timeout=30)
    client.get("/admin/login/")
    response = client.post("/admin/login/", data={
        "username": username, "password": password, "next": "/admin/",
        "csrfmiddlewaretoken": client.cookies["csrftoken"]})
    assert response.status_code == 302, response.text
    return client
