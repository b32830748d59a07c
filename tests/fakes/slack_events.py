"""Slack's side of the Events API and of interactivity, for the tests: requests signed as
Slack signs them (v0, HMAC-SHA256 over `v0:timestamp:body`), the events Slack sends
(messages, edits, envelopes, block actions), POSTed to a real server. Re-exported by
tests.fakes.slack_api (its home before the fake grew Slack's streaming methods)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import secrets
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

BOT_USER, BOT_ID, TEAM = "U0AGENTBOT", "B0AGENTBOT", "T0AGENTLOOP"
_serial = itertools.count(1)


def new_ts() -> str:
    """A message's ts: seconds since the epoch, a dot, six digits (unique in the fake)."""
    return f"{int(time.time())}.{next(_serial) % 1_000_000:06d}"


def sign(secret: str, body: bytes, timestamp: int | None = None) -> dict:
    """The two headers Slack signs a request with."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), b"v0:" + stamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": f"v0={digest}"}


def message_event(user: str, text: str, *, kind: str = "message", **fields) -> dict:
    """A `message` (or `app_mention`) event; `fields`: channel, channel_type, ts, thread_ts,
    subtype, bot_id… (a DM of the user's by default)."""
    ts = fields.pop("ts", None) or new_ts()
    event = {"type": kind, "user": user, "text": text, "ts": ts, "channel": "D0USERDM01", "channel_type": "im",
             "client_msg_id": secrets.token_hex(16), "team": TEAM, "event_ts": ts, **fields}
    if kind == "app_mention":
        event.pop("channel_type")
    if not event.get("thread_ts"):
        event.pop("thread_ts", None)
    return event


def edited_event(event: dict, text: str) -> dict:
    """message_changed for `event` (a message of ours to the fake user), its text now `text`."""
    message = {**{k: v for k, v in event.items() if k not in ("channel", "channel_type", "event_ts")},
               "text": text, "edited": {"user": event["user"], "ts": new_ts()}}
    return {"type": "message", "subtype": "message_changed", "channel": event["channel"],
            "channel_type": event.get("channel_type", "channel"), "message": message, "hidden": True,
            "previous_message": {k: v for k, v in event.items() if k != "channel"}, "ts": new_ts(),
            "event_ts": new_ts()}


def deleted_event(event: dict) -> dict:
    """message_deleted for `event` (a person's message): Slack's hidden message event with
    the deleted message's ts in `deleted_ts` and the message itself in `previous_message`."""
    return {"type": "message", "subtype": "message_deleted", "hidden": True, "channel": event["channel"],
            "channel_type": event.get("channel_type", "channel"), "ts": new_ts(), "deleted_ts": event["ts"],
            "event_ts": new_ts(), "previous_message": {k: v for k, v in event.items()
                                                       if k not in ("channel", "channel_type", "event_ts")}}


def reaction_event(user: str, name: str, channel: str, ts: str, *, item_user: str = "",
                   removed: bool = False) -> dict:
    """reaction_added (or _removed) by `user` on the message `ts` in `channel`: Slack's
    shape — the emoji's name without colons, the item reacted to, its author."""
    return {"type": "reaction_removed" if removed else "reaction_added", "user": user, "reaction": name,
            "item": {"type": "message", "channel": channel, "ts": ts}, "item_user": item_user or BOT_USER,
            "event_ts": new_ts()}


def envelope(event: dict, *, event_id: str | None = None) -> dict:
    return {"token": "legacy-verification-token", "team_id": TEAM, "api_app_id": "A0AGENTLOOP",
            "event": event, "type": "event_callback", "event_id": event_id or "Ev" + secrets.token_hex(5).upper(),
            "event_time": int(time.time()), "event_context": secrets.token_hex(12),
            "authorizations": [{"enterprise_id": None, "team_id": TEAM, "user_id": BOT_USER, "is_bot": True,
                                "is_enterprise_install": False}], "is_ext_shared_channel": False}


def block_actions(user: str, channel: str, message_ts: str, value: str, thread_ts: str = "") -> bytes:
    """A click on a button of the message `message_ts`, form-encoded as Slack posts it."""
    container = {"type": "message", "message_ts": message_ts, "channel_id": channel, "is_ephemeral": False,
                 **({"thread_ts": thread_ts} if thread_ts else {})}
    payload = {"type": "block_actions", "user": {"id": user, "username": "camila", "name": "camila",
                                                 "team_id": TEAM},
               "api_app_id": "A0AGENTLOOP", "token": "legacy", "container": container,
               "trigger_id": secrets.token_hex(8), "team": {"id": TEAM, "domain": "agentloop"},
               "channel": {"id": channel, "name": "directmessage"},
               "message": {"type": "message", "ts": message_ts, "bot_id": BOT_ID,
                           **({"thread_ts": thread_ts} if thread_ts else {})},
               "response_url": "https://hooks.slack.invalid/actions/x",
               "actions": [{"action_id": "agentloop_confirm_0", "block_id": "agentloop_confirm", "value": value,
                            "type": "button", "action_ts": f"{time.time():.6f}"}]}
    return urlencode({"payload": json.dumps(payload)}).encode()


def post(url: str, body: dict | bytes, secret: str, *, retry_num: int | None = None,
         timestamp: int | None = None) -> tuple[int, bytes]:
    """POST as Slack does: signed, JSON (an envelope) or form-encoded (bytes: a click)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    kind = "application/x-www-form-urlencoded" if isinstance(body, bytes) else "application/json"
    headers = {"Content-Type": kind, "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)",
               **sign(secret, raw, timestamp)}
    if retry_num is not None:
        headers.update({"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": "http_timeout"})
    request = urllib.request.Request(url, data=raw, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10.0) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()

