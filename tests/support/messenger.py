"""Helpers for the Messenger and Instagram tests: channels pointed at the local fake Graph
API (tests/fakes/graph_messenger.py), and events POSTed to their webhooks as Meta sends
them (signed with the app secret)."""

import json

from tests.fakes import graph_api, graph_messenger

PAGE = "104519242345678"  # the Messenger channel's Page
IG = "17841400123456789"  # the Instagram channel's professional account
TOKEN = "EAAGm0PX4ZCpsBAmessenger-token-7890"
APP_SECRET = "meta-app-secret-3c9d1e"
VERIFY = "verify-messenger-51ab"
USER = "6645012345678901"  # a person's page-scoped id
IG_USER = "17850000012345678"  # a person's Instagram-scoped id
SLUGS = {"messenger": "fb", "instagram": "ig"}
ACCOUNTS = {"messenger": PAGE, "instagram": IG}


def meta_settings(fake=None, kind="messenger", **overrides):
    values = {"account_id": ACCOUNTS[kind], "token": TOKEN, "app_secret": APP_SECRET, "verify_token": VERIFY}
    if fake is not None:
        values["api_base"] = fake.url
    return {**values, **overrides}


def meta_channel(make_channel, fake=None, kind="messenger", settings=None, **fields):
    overrides = fields.pop("extra", {})
    return make_channel(SLUGS[kind], kind=kind, platform_settings=settings or meta_settings(fake, kind, **overrides),
                        **fields)


def url(web_or_none, kind="messenger"):
    base = web_or_none.url if web_or_none is not None else ""
    return f"{base}/webhooks/{kind}/{SLUGS[kind]}/"


def signed_post(client, body, *, kind="messenger", secret=APP_SECRET, signature=None):
    """POST through Django's test client, signed unless `signature` says otherwise
    (False: no header at all)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {}
    if signature is not False:
        headers["HTTP_X_HUB_SIGNATURE_256"] = graph_api.signature(secret, raw) if signature is None else signature
    return client.post(url(None, kind), data=raw, content_type="application/json", **headers)


def deliver(web, fake, *events, kind="messenger"):
    """POST events to the real web server as Meta does; asserts the 200, returns the tally."""
    body = graph_messenger.event_body(ACCOUNTS[kind], *events, kind=kind)
    status, answer = fake.deliver_events(url(web, kind), body, APP_SECRET)
    assert status == 200, answer
    return json.loads(answer)


def say(web, fake, text, *, psid=USER, kind="messenger"):
    """One text from `psid`, delivered; returns its mid."""
    event = graph_messenger.text_event(psid, ACCOUNTS[kind], text, kind=kind)
    deliver(web, fake, event, kind=kind)
    return event["message"]["mid"]
