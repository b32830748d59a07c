"""The local fake Graph API (tests/fakes/graph_api.py) extended with Meta's Send API for
Messenger and Instagram: one server speaks both WhatsApp's Cloud API and this, as
graph.facebook.com does (the product's transport talks to it with httpx)::

    with FakeMetaGraph(tokens=[TOKEN], accounts={PAGE: "messenger", IG: "instagram"}) as fake:
        ...
        [call] = fake.wait_for("send")
        assert call.body["message"]["text"] == "hola"

What it answers, as the Send API documents it (POST /{version}/{page or account id}/messages,
`Authorization: Bearer <token>` or `?access_token=`):

- a message (JSON: `recipient`, `messaging_type`, `message` {text ≤ 2,000 characters on
  Messenger, ≤ 1,000 bytes on Instagram; quick_replies ≤ 13, titles ≤ 20 characters;
  or an attachment by `url`, which the fake fetches as Meta does}, or multipart with
  `filedata`, Messenger only): 200 {"recipient_id", "message_id"} — "send" / "upload";
- a sender action (`typing_on`, `typing_off`, `mark_seen`): 200 {"recipient_id"} — "action";
- an error: the Graph envelope {"error": {"message", "type", "code", "error_subcode",
  "fbtrace_id"}}; a rate limit also carries X-Business-Use-Case-Usage with
  `estimated_time_to_regain_access` (minutes).

It keeps the platform's rules: the 24-hour window (a message to a person whose last
message is older fails with 10/2018278, 10/2534022 on Instagram, unless tagged
`MESSAGE_TAG` + `HUMAN_AGENT` within 7 days), people who blocked the account (551/1545041),
ids it does not know when `known` is given (100/2018001, 100/2534014), and with
`per_second` the account's send rate (613 past it). Calls are scripted as WhatsApp's are
(`fail_next("send", code=…, subcode=…)`, `hold`, `delay`, `drop_connection_next`).

Meta's side: `event_body` builds the documented webhook shapes and `deliver_events` POSTs
one signed with the app secret (graph_api.deliver), noting when each person wrote.
Attachments a person sends are served from the fake (`add_attachment`: a CDN URL).
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fakes import graph_api
from tests.fakes.graph_api import Call, FakeGraphAPI, GraphError, _Handler, _multipart, _Rule

ERRORS: dict[tuple[int, int | None], tuple[int, str]] = {
    (4, None): (400, "(#4) Application request limit reached"),
    (613, None): (400, "(#613) Calls to this api have exceeded the rate limit."),
    (32, None): (400, "(#32) Page request limit reached"),
    (2, None): (500, "An unexpected error has occurred. Please retry your request later."),
    (1200, None): (500, "Temporary send message failure. Please try again later"),
    (190, None): (400, "Invalid OAuth access token - Cannot parse access token"),
    (551, 1545041): (400, "This person isn't available right now."),
    (100, 2018001): (400, "No matching user found"),
    (100, 2534014): (400, "The requested user cannot be found."),
    (10, 2018278): (400, "(#10) This message is sent outside of allowed window."),
    (10, 2534022): (400, "(#10) This message is sent outside of allowed window."),
    (100, None): (400, "(#100) Invalid parameter"),
}
MAX_TEXT = {"messenger": 2000, "instagram": 1000}  # characters / bytes
TAGS = {"messenger": {"HUMAN_AGENT", "CONFIRMED_EVENT_UPDATE", "POST_PURCHASE_UPDATE", "ACCOUNT_UPDATE"},
        "instagram": {"HUMAN_AGENT"}}
WINDOW, TAGGED_WINDOW = 24 * 3600.0, 7 * 24 * 3600.0
CDN_PATH = "/v/t39.1997-6/"
_serial = itertools.count(1)


def graph_error(code: int, subcode: int | None = None, message: str = "", status: int | None = None) -> tuple:
    known = ERRORS.get((code, subcode)) or ERRORS.get((code, None)) or (400, f"(#{code}) Error")
    error: dict[str, Any] = {"message": message or known[1], "type": "OAuthException", "code": code,
                             "fbtrace_id": "A" + secrets.token_urlsafe(16)}
    if subcode is not None:
        error["error_subcode"] = subcode
    return status or known[0], {"error": error}


class _SendError(GraphError):
    """A scripted refusal in the Send API's envelope (no WhatsApp error_data)."""

    def __init__(self, code, subcode, message, status, regain_minutes):
        self.status, self.body = graph_error(code, subcode, message, status)
        self.code, self.subcode, self.regain_minutes = code, subcode, regain_minutes
        Exception.__init__(self, self.body["error"]["message"])

    def envelope(self) -> dict:
        return self.body


def new_mid(kind: str = "messenger") -> str:
    """A message id in each platform's shape: Messenger's "m_…" (~60 characters),
    Instagram's base64 record (~170: longer than a message id column)."""
    if kind == "instagram":
        record = f"ig_item:1:IGMessageID:17841400000000000:{secrets.randbits(120)}:{secrets.randbits(120)}"
        return base64.b64encode(record.encode()).decode().rstrip("=")
    return "m_" + secrets.token_urlsafe(42)


class _MessengerHandler(_Handler):
    def do_POST(self):
        server = self.server
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        served = server._messenger(self.command, self.path, self.headers.get("Authorization", ""), body,
                                   self.headers.get("Content-Type", ""))
        if served is False:  # WhatsApp's Cloud API
            outcome = server._serve(self.path, self.headers.get("Authorization", ""), body,
                                    self.headers.get("Content-Type", ""))
            served = None if outcome is None else (*outcome, {})
        if served is None:
            self.close_connection = True
            return
        status, payload, headers = served
        data, kind = payload if isinstance(payload, tuple) else (json.dumps(payload).encode(), "application/json")
        try:
            self.send_response(status)
            for name, value in {"Content-Type": kind, "Content-Length": str(len(data)), **headers}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def do_GET(self):
        self.do_POST()


class FakeMetaGraph(FakeGraphAPI):
    def __init__(self, *args, accounts: dict[str, str] | None = None, known=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.RequestHandlerClass = _MessengerHandler
        self.accounts = dict(accounts or {})  # account id -> "messenger" | "instagram"; others: messenger
        self.known = set(known) if known is not None else None  # None: every id is a person of the account
        self.blocked: set[str] = set()
        self.attachments: dict[str, tuple[bytes, str]] = {}  # CDN id -> (bytes, type)
        self.fetched: list[str] = []  # CDN ids fetched, in order
        self.received_files: list[dict] = []  # each file a message carried: {"type", "data", "via"}
        self.messenger_floods = 0
        self._sent_at: dict[str, list[float]] = {}

    def fail_next(self, what: str = "send", *, code: int, subcode: int | None = None, status: int | None = None,
                  message: str = "", times: int = 1, regain_minutes: int = 0) -> None:
        """Answer the next `times` calls of `what` with the Graph error (code, subcode); a
        rate limit's usage header estimates `regain_minutes`."""
        with self._cond:
            self._state.rules.append(_Rule(what, times, _SendError(code, subcode, message, status, regain_minutes)))

    # --- the platform's rules ---------------------------------------------------------------
    def block(self, psid: str) -> None:
        with self._cond:
            self.blocked.add(psid)

    def add_attachment(self, data: bytes, mime: str = "image/jpeg") -> str:
        """A file a person sent: the signed CDN URL an event carries."""
        cdn = str(next(_serial) + 10**12)
        with self._cond:
            self.attachments[cdn] = (data, mime)
        return f"{self.url}{CDN_PATH}{cdn}_n.jpg?_nc_cat=1&oh={secrets.token_hex(8)}&oe={int(time.time()) + 3600:x}"

    def deliver_events(self, url: str, body: dict, app_secret: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """POST a webhook body as Meta does (signed), noting when each person last wrote."""
        for entry in body.get("entry") or []:
            for event in entry.get("messaging") or []:
                if "message" in event and not event["message"].get("is_echo"):
                    self.user_wrote(event["sender"]["id"], event["timestamp"] / 1000)
        return graph_api.deliver(url, body, app_secret, timeout)

    def sent(self, to: str | None = None) -> list[dict]:
        """The message objects accepted (to one person), in order."""
        return [c.body["message"] for c in self.calls() if c.what in ("send", "upload") and c.body.get("ok")
                and (to is None or c.body["recipient"].get("id") == to)]

    def texts(self, to: str | None = None) -> list[str]:
        return [m["text"] for m in self.sent(to) if "text" in m]

    # --- serving ---------------------------------------------------------------------------
    def _messenger(self, method: str, path: str, authorization: str, body: bytes, content_type: str):
        parts = urlsplit(path)
        if parts.path.startswith(CDN_PATH):
            return self._serve_cdn(parts.path[len(CDN_PATH):].split("_", 1)[0])
        match = graph_api._PATH.match(parts.path)
        multipart = content_type.startswith("multipart/")
        try:
            data = _multipart(content_type, body) if multipart else json.loads(body or b"{}")
        except ValueError:
            data = None
        if match is None or not isinstance(data, dict) or "recipient" not in data:
            return False
        account, kind = match["phone"], self.accounts.get(match["phone"], "messenger")
        token = authorization[7:].strip() if authorization.lower().startswith("bearer ") else \
            dict(parse_qsl(parts.query)).get("access_token", "")
        if multipart:
            upload = data.pop("filedata", None)
            data = {k: _json(v) for k, v in data.items()}
            data["filedata"] = upload
        what = "action" if "sender_action" in data else "upload" if multipart else "send"
        record = {k: v for k, v in data.items() if k != "filedata"}
        with self._cond:
            self._state.calls.append(Call(what, match["version"], account, token, record, time.monotonic(),
                                          time.time()))
            self._cond.notify_all()
        if not token:
            return (*graph_error(190, message="An active access token must be used"), {})
        if self.tokens and token not in self.tokens:
            return (*graph_error(190), {})
        self._wait_while_held(what)
        self._sleep_if_delayed(what)
        rule = self._take_rule(what)
        if rule is not None:
            return None if rule.error is None else (rule.error.status, rule.error.envelope(), self._usage(rule.error))
        problem = _invalid(data, kind, what)
        if problem:
            return (*graph_error(100, message=f"(#100) {problem}"), {})
        psid = data["recipient"]["id"]
        refused = self._refusal(data, kind, psid, what)
        if refused is not None:
            return refused
        if what == "action":
            return 200, {"recipient_id": psid}, {}
        received = self._file_of(data)
        if isinstance(received, tuple):
            return received
        if self.per_second and self._over_rate(account):
            return (*graph_error(613), {"X-Business-Use-Case-Usage": json.dumps({account: [
                {"type": "messenger", "call_count": 100, "total_cputime": 10, "total_time": 10,
                 "estimated_time_to_regain_access": 1}]})})
        with self._cond:
            record["ok"] = True
            if received:
                self.received_files.append(received)
        return 200, {"recipient_id": psid, "message_id": new_mid(kind)}, {}

    def _usage(self, error) -> dict:
        if error.code not in (4, 17, 32, 613, 80006):
            return {}
        return {"X-Business-Use-Case-Usage": json.dumps({"1": [{
            "type": "messenger", "call_count": 100, "total_cputime": 10, "total_time": 10,
            "estimated_time_to_regain_access": getattr(error, "regain_minutes", 0)}]})}

    def _refusal(self, data: dict, kind: str, psid: str, what: str):
        ig = kind == "instagram"
        if self.known is not None and psid not in self.known:
            return (*graph_error(100, 2534014 if ig else 2018001), {})
        if psid in self.blocked:
            return (*graph_error(551, 1545041), {})
        if what == "action":
            return None
        with self._cond:
            last = self._state.last_wrote.get(psid)
        if last is None and not self.strict_window:
            return None
        age = time.time() - last if last is not None else float("inf")
        tagged = data.get("messaging_type") == "MESSAGE_TAG" and data.get("tag") == "HUMAN_AGENT"
        if age > (TAGGED_WINDOW if tagged else WINDOW):
            return (*graph_error(10, 2534022 if ig else 2018278), {})
        return None

    def _file_of(self, data: dict):
        """The file a message carries: uploaded, or fetched from its URL as Meta does."""
        attachment = (data.get("message") or {}).get("attachment")
        if not attachment:
            return {}
        if data.get("filedata"):
            raw, mime = data["filedata"]
            if not raw or len(raw) > 25 * 1024 * 1024:
                return (*graph_error(100, 2018294, "(#100) Upload attachment failure."), {})
            return {"type": attachment["type"], "data": raw, "mime": mime, "via": "upload"}
        url = attachment["payload"]["url"]
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return {"type": attachment["type"], "data": response.read(), "via": "url",
                        "mime": response.headers.get("Content-Type", "")}
        except (urllib.error.URLError, OSError, ValueError):
            return (*graph_error(100, 2018008, "(#100) Failed to fetch the file from the url"), {})

    def _over_rate(self, account: str) -> bool:
        now = time.monotonic()
        with self._cond:
            times = [t for t in self._sent_at.get(account, []) if now - t < 1.0]
            self._sent_at[account] = times
            if len(times) >= self.per_second:
                self.messenger_floods += 1
                return True
            times.append(now)
        return False

    def _serve_cdn(self, cdn: str):
        with self._cond:
            found = self.attachments.get(cdn)
            if found is not None:
                self.fetched.append(cdn)
        if found is None:
            return 404, (b"URL signature expired", "text/plain"), {}
        return 200, found, {}


def _json(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _invalid(data: dict, kind: str, what: str) -> str:
    """What the Send API would refuse in this body, "" when nothing."""
    recipient = data.get("recipient")
    if not isinstance(recipient, dict) or not isinstance(recipient.get("id"), str) or not recipient["id"]:
        return "param recipient must be non-empty."
    if what == "action":
        if "message" in data:
            return "sender_action cannot be sent with message"
        return "" if data["sender_action"] in ("typing_on", "typing_off", "mark_seen") else \
            "param sender_action must be one of {MARK_SEEN, TYPING_ON, TYPING_OFF}"
    kind_of = data.get("messaging_type")
    if kind_of not in ("RESPONSE", "UPDATE", "MESSAGE_TAG"):
        return "param messaging_type must be one of {RESPONSE, UPDATE, MESSAGE_TAG}"
    if kind_of == "MESSAGE_TAG" and data.get("tag") not in TAGS[kind]:
        return "param tag must be a valid message tag"
    message = data.get("message")
    if not isinstance(message, dict) or ("text" in message) == ("attachment" in message):
        return "param message must have exactly one of text or attachment"
    if what == "upload" and kind == "instagram":
        return "attachment upload is not supported on Instagram: send a url"
    if "text" in message:
        text = message["text"]
        size = len(text.encode()) if kind == "instagram" else len(text) if isinstance(text, str) else 0
        if not isinstance(text, str) or not text or size > MAX_TEXT[kind]:
            return f"Length of param message[text] must be less than or equal to {MAX_TEXT[kind]}"
    else:
        attachment = message["attachment"]
        if not isinstance(attachment, dict) or attachment.get("type") not in ("image", "video", "audio", "file"):
            return "param message[attachment][type] must be one of {image, video, audio, file}"
        payload = attachment.get("payload")
        if not isinstance(payload, dict) or (what == "send" and not isinstance(payload.get("url"), str)):
            return "param message[attachment][payload][url] is required"
    replies = message.get("quick_replies")
    if replies is not None:
        if not isinstance(replies, list) or not 0 < len(replies) <= 13:
            return "param message[quick_replies] must have between 1 and 13 elements"
        for reply in replies:
            if not isinstance(reply, dict) or reply.get("content_type") != "text" or \
                    not isinstance(reply.get("title"), str) or not 0 < len(reply["title"]) <= 20 or \
                    not isinstance(reply.get("payload"), str) or len(reply["payload"]) > 1000:
                return "param message[quick_replies] has an invalid element (title ≤ 20, payload ≤ 1000)"
    return ""


# --- Meta's side of the webhook ------------------------------------------------------------

OBJECTS = {"messenger": "page", "instagram": "instagram"}


def event(psid: str, account: str, *, timestamp: int | None = None, **content) -> dict:
    return {"sender": {"id": psid}, "recipient": {"id": account},
            "timestamp": timestamp or int(time.time() * 1000), **content}


def text_event(psid: str, account: str, text: str, *, mid: str | None = None, kind: str = "messenger",
               timestamp: int | None = None, **extra) -> dict:
    return event(psid, account, timestamp=timestamp, message={"mid": mid or new_mid(kind), "text": text, **extra})


def quick_reply_event(psid: str, account: str, title: str, payload: str, **kw) -> dict:
    return text_event(psid, account, title, quick_reply={"payload": payload}, **kw)


def attachment_event(psid: str, account: str, url: str, kind_of: str = "image", *, kind: str = "messenger",
                     text: str = "") -> dict:
    message = {"mid": new_mid(kind), "attachments": [{"type": kind_of, "payload": {"url": url}}]}
    if text:
        message["text"] = text
    return event(psid, account, message=message)


def story_reply_event(psid: str, account: str, text: str, story_url: str) -> dict:
    return text_event(psid, account, text, kind="instagram",
                      reply_to={"story": {"url": story_url, "id": str(next(_serial) + 10**16)}})


def story_mention_event(psid: str, account: str, url: str) -> dict:
    return attachment_event(psid, account, url, "story_mention", kind="instagram")


def echo_event(account: str, psid: str, text: str, kind: str = "messenger") -> dict:
    """A message the account sent, echoed back (`message_echoes`): sender is the account."""
    return event(account, psid, message={"mid": new_mid(kind), "text": text, "is_echo": True, "app_id": 1517})


def reaction_event(psid: str, account: str, mid: str, emoji: str = "❤", action: str = "react") -> dict:
    reaction = {"mid": mid, "action": action, **({"reaction": "love", "emoji": emoji} if action == "react" else {})}
    return event(psid, account, reaction=reaction)


def postback_event(psid: str, account: str, title: str, payload: str, kind: str = "messenger") -> dict:
    return event(psid, account, postback={"mid": new_mid(kind), "title": title, "payload": payload})


def event_body(account: str, *events: dict, kind: str = "messenger") -> dict:
    """One notification: one entry per event, as Meta batches them."""
    return {"object": OBJECTS[kind], "entry": [{"id": account, "time": int(time.time() * 1000), "messaging": [e]}
                                               for e in events]}
