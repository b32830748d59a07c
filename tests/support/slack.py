"""Helpers for the Slack tests: a channel pointed at the local fake Web API, and Events
API requests POSTed to it the way Slack sends them (signed)."""

import json

from tests.fakes import slack_api

TOKEN = "xoxb-1111111111-2222222222222-AbCdEfGhIjKlMnOpQrStUvWx"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
USER = "U0CAMILA01"
DM = "D0USERDM01"
CHANNEL = "C0GENERAL1"


def slack_settings(fake=None, **overrides):
    values = {"bot_token": TOKEN, "signing_secret": SIGNING_SECRET}
    if fake is not None:
        values["api_base"] = fake.url
    return {**values, **overrides}


def slack_channel(make_channel, fake=None, slug="sl", settings=None, **fields):
    return make_channel(slug, kind="slack", platform_settings=settings or slack_settings(fake), **fields)


def signed_post(client, body, *, secret=SIGNING_SECRET, headers=None, path="sl/"):
    """POST through Django's test client to /webhooks/slack/<path>, signed unless
    `headers` says otherwise."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = slack_api.sign(secret, raw) if headers is None else headers
    kind = "application/x-www-form-urlencoded" if isinstance(body, bytes) else "application/json"
    return client.post(f"/webhooks/slack/{path}", data=raw, content_type=kind,
                       headers={k: v for k, v in sent.items()})


def deliver(web, body, slug="sl", **options):
    """POST an envelope to the real web server as Slack does; asserts the 200."""
    status, answer = slack_api.post(f"{web.url}/webhooks/slack/{slug}/", body, SIGNING_SECRET, **options)
    assert status == 200, answer
    return json.loads(answer)


def send(web, text, *, user=USER, channel=DM, **event):
    """One message event, delivered to the `sl` channel; returns the event (its ts, channel…)."""
    message = slack_api.message_event(user, text, channel=channel, **event)
    deliver(web, slack_api.envelope(message))
    return message
