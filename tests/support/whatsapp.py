"""Helpers for the WhatsApp tests: a channel pointed at the local fake Graph API, and
notifications POSTed to the webhook the way Meta sends them (signed)."""

import json

from tests.fakes import graph_api

PHONE = "106540352242922"
TOKEN = "EAAGm0PX4ZCpsBAtest-token-1234567890"
APP_SECRET = "app-secret-5f2b9c0e7d"
VERIFY = "verify-me-8c1d"
USER = "5491165551234"  # the user's wa_id


def whatsapp_settings(fake=None, **overrides):
    values = {"phone_number_id": PHONE, "token": TOKEN, "app_secret": APP_SECRET, "verify_token": VERIFY}
    if fake is not None:
        values["api_base"] = fake.url
    return {**values, **overrides}


def whatsapp_channel(make_channel, fake=None, slug="wa", settings=None, **fields):
    return make_channel(slug, kind="whatsapp", platform_settings=settings or whatsapp_settings(fake), **fields)


def signed_post(client, body, *, slug="wa", secret=APP_SECRET, signature=None):
    """POST through Django's test client, signed unless `signature` says otherwise
    (False: no header at all)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {}
    if signature is not False:
        headers["HTTP_X_HUB_SIGNATURE_256"] = graph_api.signature(secret, raw) if signature is None else signature
    return client.post(f"/webhooks/whatsapp/{slug}/", data=raw, content_type="application/json", **headers)


def deliver(web, body, slug="wa"):
    """POST a notification to the real web server as Meta does; asserts the 200."""
    status, answer = graph_api.deliver(f"{web.url}/webhooks/whatsapp/{slug}/", body, APP_SECRET)
    assert status == 200, answer
    return json.loads(answer)


def send(web, text, *, wa_id=USER, slug="wa"):
    """One text message from `wa_id`, delivered; returns its wamid."""
    message = graph_api.text_message(wa_id, text)
    deliver(web, graph_api.webhook_body(PHONE, messages=[message]), slug)
    return message["id"]
