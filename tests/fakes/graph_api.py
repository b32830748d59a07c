"""A local fake of Meta's Graph API for the WhatsApp Cloud API, speaking real HTTP.

The product's transport talks to it with its real client (httpx), so the whole HTTP
path (headers, JSON bodies, status codes, the error envelope, timeouts) is exercised::

    with FakeGraphAPI(tokens=["EAAG-test"]) as fake:
        ...                                  # the worker sends through {fake.url}
        [call] = fake.wait_for("message")
        assert call.body["text"]["body"] == "hola"

What it answers, as the Cloud API documents it (POST /{version}/{phone number id}/messages
with `Authorization: Bearer <token>`):

- a message: 200 {"messaging_product": "whatsapp", "contacts": [{"input", "wa_id"}],
  "messages": [{"id": "wamid.…"}]};
- a read receipt, with or without a typing indicator: 200 {"success": true};
- an error: the Graph envelope {"error": {"message", "type", "code", "error_subcode",
  "error_data", "fbtrace_id"}} with the HTTP status the platform uses for that code.

It keeps the platform's 24-hour rule: a free-form message (text, image, document) to a
user whose last message is more than 24 hours old fails with 131047; a `type: template`
message goes at any time, but only for a template registered here (`add_template`: its
name, language and body parameter count) — 132001 for an unknown name or language,
132000 for another parameter count, 132018 for a parameter with a new line, a tab or
more than 4 spaces in a row. The fake learns when a user last wrote from the
notifications it delivers itself (`FakeGraphAPI.deliver`) or from `user_wrote`; a user
it never heard from is taken to have written just now (tests that post notifications
another way keep working), unless `strict_window=True`.

With `per_second`, it keeps the Cloud API's throughput limit (80 messages a second per
business number by default): a message past it is answered 130429 (`floods` counts them).

Calls are recorded by what they are ("message", "typing", "read"); tests script the next
answers of one of them (`fail_next(code=…)`), hold them (the request is in, no answer
comes until released: a send that never answers), delay them, or drop the connection.

It is also "Meta" the other way: `webhook_body` builds the documented notification
shapes and `deliver` POSTs one to a webhook signed with the app secret, as Meta does.

Standard library only (http.server), like tests/fakes/telegram_api.py.
"""

from __future__ import annotations

import base64
import email.parser
import email.policy
import hashlib
import hmac
import itertools
import json
import re
import secrets
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.server import FakeServer, TrackedHandler

# The documented error codes the product maps, with the HTTP status, the type, the title
# and the details Meta sends for each (the message is "(#<code>) <title>").
ERRORS: dict[int, tuple[int, str, str, str]] = {
    0: (401, "OAuthException", "AuthException", "We were unable to authenticate the app user."),
    1: (500, "OAuthException", "API Unknown", "Invalid request or possible server error."),
    2: (503, "OAuthException", "API Service", "Temporary due to downtime or due to being overloaded."),
    4: (400, "OAuthException", "API Too Many Calls", "The app has reached its API call rate limit."),
    100: (400, "OAuthException", "Invalid parameter", "The request included one or more unsupported or "
                                                      "misspelled parameters."),
    190: (401, "OAuthException", "Access token has expired", "Error validating access token: Session has "
                                                              "expired."),
    80007: (400, "OAuthException", "Rate limit issues", "The WhatsApp Business Account has reached its rate "
                                                        "limit."),
    130429: (400, "OAuthException", "Rate limit hit", "Cloud API message throughput has been reached."),
    131000: (500, "OAuthException", "Something went wrong", "Message failed to send due to an unknown error."),
    131021: (400, "OAuthException", "Recipient cannot be sender", "Sender and recipient phone number is the "
                                                                  "same."),
    131026: (400, "OAuthException", "Message Undeliverable", "Unable to deliver message."),
    131047: (400, "OAuthException", "Re-engagement message", "Message failed to send because more than 24 "
                                                             "hours have passed since the customer last "
                                                             "replied to this number."),
    131051: (400, "OAuthException", "Unsupported message type", "Message type is not currently supported."),
    132000: (400, "OAuthException", "Number of parameters does not match the expected number of params",
             "body: number of localizable_params ({sent}) does not match the expected number of params "
             "({expected})"),
    132001: (404, "OAuthException", "Template name does not exist in the translation",
             "template name ({name}) does not exist in {language}"),
    132018: (400, "OAuthException", "There was an issue with the parameters in your template.",
             "Param text cannot have new-line/tab characters or more than 4 consecutive spaces"),
    131056: (400, "OAuthException", "(Business Account, Consumer Account) pair rate limit hit",
             "Too many messages sent from the sender phone number to the same recipient phone number in a "
             "short period of time."),
}

MAX_TEXT = 4096  # a text message's body, characters
_PATH = re.compile(r"^/(?P<version>v\d+\.\d+)/(?P<phone>[^/]+)/messages/?$")
_UPLOAD_PATH = re.compile(r"^/(?P<version>v\d+\.\d+)/(?P<phone>[^/]+)/media/?$")
# The Cloud API's upload limits: an image (JPEG or PNG) up to 5 MB, a document up to 100 MB.
UPLOAD_LIMITS = {"image/jpeg": 5 * 1024 * 1024, "image/png": 5 * 1024 * 1024}
DOCUMENT_MAX_BYTES = 100 * 1024 * 1024
# A media id's metadata (GET), and the download its `url` names (Meta's lookaside host).
_MEDIA_PATH = re.compile(r"^/(?P<version>v\d+\.\d+)/(?P<media>\d+)/?$")
_DOWNLOAD_PATH = "/whatsapp_business/attachments/"


@dataclass(frozen=True)
class Call:
    """One request as the fake received it."""

    what: str  # "message", "typing", "read" ("invalid" for a body it could not place)
    version: str
    phone_number_id: str
    token: str  # the bearer token ("" when none was sent)
    body: dict
    at: float  # time.monotonic()
    wall: float  # time.time()


class GraphError(Exception):
    """An error answer in the Graph envelope."""

    def __init__(self, code: int, *, status: int | None = None, message: str = "", subcode: int | None = None,
                 details: str = ""):
        known = ERRORS.get(code, (400, "OAuthException", "Error", ""))
        self.code = code
        self.status = status or known[0]
        self.type = known[1]
        self.message = message or f"(#{code}) {known[2]}"
        self.subcode = subcode
        self.details = details or known[3]
        super().__init__(self.message)

    def envelope(self) -> dict:
        error = {"message": self.message, "type": self.type, "code": self.code,
                 "error_data": {"messaging_product": "whatsapp", "details": self.details},
                 "fbtrace_id": "A" + secrets.token_urlsafe(16)}
        if self.subcode is not None:
            error["error_subcode"] = self.subcode
        return {"error": error}


@dataclass
class _Rule:
    what: str
    times: int
    error: GraphError | None  # None: close the connection without answering


@dataclass
class Hold:
    """Blocks calls of one kind (after they are recorded) until released."""

    fake: FakeGraphAPI
    what: str
    released: bool = False
    held: int = 0

    def release(self) -> None:
        with self.fake._cond:
            self.released = True
            if self in self.fake._holds:
                self.fake._holds.remove(self)
            self.fake._cond.notify_all()

    def wait_held(self, count: int = 1, timeout: float = 5.0) -> int:
        with self.fake._cond:
            if not self.fake._cond.wait_for(lambda: self.held >= count, timeout):
                raise AssertionError(f"expected {count} held {self.what!r} call(s) within {timeout}s, {self.held} held")
            return self.held

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


@dataclass
class _State:
    calls: list = field(default_factory=list)
    rules: list = field(default_factory=list)
    delays: dict = field(default_factory=dict)
    media: dict = field(default_factory=dict)  # media id -> {"data", "mime"}
    templates: dict = field(default_factory=dict)  # (name, language code) -> body parameter count
    last_wrote: dict = field(default_factory=dict)  # wa_id -> time.time() of the user's last message
    accepted: list = field(default_factory=list)  # the message bodies answered 200, in order
    downloads: list = field(default_factory=list)  # media ids downloaded, in order
    reactions: dict = field(default_factory=dict)  # (wa_id, wamid) -> the business's emoji on it now


_serial = itertools.count(1)


def new_wamid(wa_id: str) -> str:
    """A message id in the shape WhatsApp gives them: "wamid." and base64 of a record
    naming the recipient and a random id (~60 characters)."""
    record = f"\x18\x0b{wa_id}\x15\x02\x00\x11\x18\x12{secrets.token_hex(9).upper()}\x00".encode()
    return "wamid." + base64.b64encode(record).decode()


class FakeGraphAPI(FakeServer):

    WINDOW = 24 * 3600.0  # seconds: the customer-service window

    def __init__(self, port: int = 0, *, host: str = "127.0.0.1", tokens=(), phone_number_ids=(),
                 strict_window: bool = False, per_second: int = 0):
        super().__init__((host, port), _Handler)
        self._state = _State()
        self.per_second = per_second  # messages a second per number; 0: no limit kept
        self.floods = 0  # messages answered 130429 for it
        self.flood_times: list[float] = []  # when (time.monotonic())
        self._sent: dict[str, list[float]] = {}  # phone number id -> its accepted messages' times
        # Empty: any token / number is accepted.
        self.tokens = set(tokens)
        self.phone_number_ids = set(phone_number_ids)
        self.strict_window = strict_window  # a user never heard from is outside the window

    # --- the platform's rules ------------------------------------------------------------

    def add_template(self, name: str, language: str, parameters: int = 1) -> None:
        """An approved template: its name, language code and body parameter count."""
        with self._cond:
            self._state.templates[(name, language)] = parameters

    def user_wrote(self, wa_id: str, at: float | None = None) -> None:
        """The user's last message was at `at` (time.time(); default now)."""
        with self._cond:
            self._state.last_wrote[wa_id] = time.time() if at is None else at

    def deliver(self, url: str, body: dict, app_secret: str, timeout: float = 10.0) -> tuple[int, bytes]:
        """`deliver` (Meta's side), noting each user's message time (its `timestamp`) first."""
        for entry in body.get("entry") or []:
            for change in entry.get("changes") or []:
                for message in (change.get("value") or {}).get("messages") or []:
                    self.user_wrote(message["from"], float(message.get("timestamp") or time.time()))
        return deliver(url, body, app_secret, timeout)

    def templates_sent(self, to: str | None = None) -> list[dict]:
        """The template messages accepted (to one recipient): each its `template` object."""
        with self._cond:
            return [body["template"] for body in self._state.accepted
                    if body.get("type") == "template" and (to is None or body.get("to") == to)]

    def _window_or_template_error(self, data) -> GraphError | None:
        """The platform's refusal of a message that is well formed, or None."""
        if data.get("type") == "template":
            return self._template_error(data["template"])
        with self._cond:
            last = self._state.last_wrote.get(data["to"])
        if last is None and not self.strict_window:
            return None
        if last is None or time.time() - last > self.WINDOW:
            return GraphError(131047)
        return None

    def _template_error(self, template) -> GraphError | None:
        name, language = template["name"], template["language"]["code"]
        with self._cond:
            expected = self._state.templates.get((name, language))
        if expected is None:
            return GraphError(132001, details=ERRORS[132001][3].format(name=name, language=language))
        values = [p for c in template.get("components") or [] if c.get("type") == "body"
                  for p in c.get("parameters") or []]
        if len(values) != expected:
            return GraphError(132000, details=ERRORS[132000][3].format(sent=len(values), expected=expected))
        if any(re.search(r"[\n\t]| {5,}", str(p.get("text") or "")) for p in values):
            return GraphError(132018)
        return None

    # --- lifecycle --------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    # --- recording ----------------------------------------------------------------------

    def calls(self, what: str | None = None) -> list[Call]:
        with self._cond:
            return [c for c in self._state.calls if what is None or c.what == what]

    def wait_for(self, what: str, count: int = 1, timeout: float = 5.0) -> list[Call]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls(what)) >= count, timeout):
                raise AssertionError(f"expected {count} {what!r} call(s) within {timeout}s, got "
                                     f"{len(self.calls(what))}; recorded: {[c.what for c in self._state.calls]}")
            return self.calls(what)

    def texts(self, to: str | None = None) -> list[str]:
        """The text bodies of the messages sent (to one recipient)."""
        return [c.body["text"]["body"] for c in self.calls("message")
                if c.body.get("type") == "text" and (to is None or c.body.get("to") == to)]

    # --- scripted behaviour ----------------------------------------------------------------

    def fail_next(self, what: str = "message", *, code: int, status: int | None = None, message: str = "",
                  subcode: int | None = None, times: int = 1) -> None:
        """Answer the next `times` calls of `what` with the Graph error `code`."""
        with self._cond:
            self._state.rules.append(_Rule(what, times, GraphError(code, status=status, message=message,
                                                                   subcode=subcode)))

    def drop_connection_next(self, what: str = "message", *, times: int = 1) -> None:
        """Close the socket without an answer (the request was received)."""
        with self._cond:
            self._state.rules.append(_Rule(what, times, None))

    def hold(self, what: str = "message") -> Hold:
        hold = Hold(self, what)
        with self._cond:
            self._holds.append(hold)
        return hold

    def delay(self, what: str, seconds: float) -> None:
        with self._cond:
            self._state.delays[what] = seconds

    # --- serving -----------------------------------------------------------------------

    def add_media(self, data: bytes, mime: str = "image/jpeg") -> str:
        """A file a user sent: its media id, as a notification carries it."""
        media_id = str(next(_serial) + 10**15)
        with self._cond:
            self._state.media[media_id] = {"data": data, "mime": mime}
        return media_id

    @property
    def downloads(self) -> list[str]:
        with self._cond:
            return list(self._state.downloads)

    def _serve_media(self, parts, token: str) -> tuple[int, dict | tuple[bytes, str]]:
        """GET /{version}/{media id}: {url, mime_type, sha256, file_size, id}; GET of that
        url: the bytes — both with the bearer token, as the Cloud API documents."""
        metadata = _MEDIA_PATH.match(parts.path)
        what = "media" if metadata else "download"
        media_id = metadata["media"] if metadata else dict(parse_qsl(parts.query)).get("mid", "")
        with self._cond:
            self._state.calls.append(Call(what, metadata["version"] if metadata else "", media_id, token, {},
                                          time.monotonic(), time.time()))
            self._cond.notify_all()
        if not token:
            return 400, GraphError(104, message="An access token is required to request this resource.").envelope()
        if self.tokens and token not in self.tokens:
            return 401, GraphError(190, message="Invalid OAuth access token - Cannot parse access token").envelope()
        rule = self._take_rule(what)
        if rule is not None and rule.error is not None:
            return rule.error.status, rule.error.envelope()
        with self._cond:
            found = self._state.media.get(media_id)
            if found is not None and not metadata:
                self._state.downloads.append(media_id)
        if found is None:
            if not metadata:
                return 404, {}
            return 400, GraphError(100, subcode=33, message=f"Unsupported get request. Object with ID "
                                                            f"'{media_id}' does not exist").envelope()
        if not metadata:
            return 200, (found["data"], found["mime"])
        return 200, {"messaging_product": "whatsapp", "id": media_id, "mime_type": found["mime"],
                     "sha256": hashlib.sha256(found["data"]).hexdigest(), "file_size": len(found["data"]),
                     "url": f"{self.url}{_DOWNLOAD_PATH}?mid={media_id}&ext={int(time.time())}"
                            f"&hash={secrets.token_urlsafe(12)}"}

    def _serve_upload(self, match, token: str, content_type: str, body: bytes) -> tuple[int, dict] | None:
        """POST /{version}/{phone number id}/media (multipart: messaging_product, type,
        file): the uploaded file's media id, which a message then names."""
        fields = _multipart(content_type, body)
        upload = fields.get("file")
        with self._cond:
            self._state.calls.append(Call("upload", match["version"], match["phone"], token,
                                          {k: v for k, v in fields.items() if k != "file"}, time.monotonic(),
                                          time.time()))
            self._cond.notify_all()
        if not token:
            return 400, GraphError(104, message="An access token is required to request this resource.").envelope()
        if self.tokens and token not in self.tokens:
            return 401, GraphError(190, message="Invalid OAuth access token - Cannot parse access token").envelope()
        rule = self._take_rule("upload")
        if rule is not None:  # an error, or no answer at all (None: the connection dropped)
            return None if rule.error is None else (rule.error.status, rule.error.envelope())
        if fields.get("messaging_product") != "whatsapp" or not isinstance(upload, tuple):
            return 400, GraphError(100, message="(#100) The parameter file is required.").envelope()
        data, mime = upload
        if not data or len(data) > UPLOAD_LIMITS.get(mime, DOCUMENT_MAX_BYTES):
            return 400, GraphError(131053, message="Media upload error").envelope()
        return 200, {"id": self.add_media(data, mime)}

    def _serve(self, path: str, authorization: str, body: bytes, content_type: str = "") -> tuple[int, dict] | None:
        parts = urlsplit(path)
        upload = _UPLOAD_PATH.match(parts.path)
        if upload is not None:
            return self._serve_upload(upload, authorization[7:].strip() if authorization.lower().startswith("bearer ")
                                      else "", content_type, body)
        if _MEDIA_PATH.match(parts.path) or parts.path == _DOWNLOAD_PATH:
            token = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
            return self._serve_media(parts, token)
        match = _PATH.match(parts.path)
        if match is None:
            return 400, GraphError(100, message="Unsupported post request. Object does not exist, cannot be "
                                                "loaded due to missing permissions, or does not support this "
                                                "operation").envelope()
        token = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            data = None
        what = _what(data)
        with self._cond:
            self._state.calls.append(Call(what, match["version"], match["phone"], token,
                                          data if isinstance(data, dict) else {}, time.monotonic(), time.time()))
            self._cond.notify_all()
        if not token:
            return 400, GraphError(104, message="An access token is required to request this resource.").envelope()
        if self.tokens and token not in self.tokens:
            return 401, GraphError(190, message="Invalid OAuth access token - Cannot parse access token").envelope()
        if self.phone_number_ids and match["phone"] not in self.phone_number_ids:
            return 400, GraphError(100, subcode=33, message=f"Unsupported post request. Object with ID "
                                                            f"'{match['phone']}' does not exist").envelope()
        self._wait_while_held(what)
        self._sleep_if_delayed(what)
        rule = self._take_rule(what)
        if rule is not None:
            return None if rule.error is None else (rule.error.status, rule.error.envelope())
        problem = _invalid(data, what) or self._unknown_media(data)
        if problem:
            return 400, GraphError(100, message=f"(#100) {problem}").envelope()
        if what in ("typing", "read"):
            return 200, {"success": True}
        refused = self._window_or_template_error(data)
        if refused is not None:
            return refused.status, refused.envelope()
        if self.per_second and self._over_throughput(match["phone"]):
            return 400, GraphError(130429).envelope()
        with self._cond:
            self._state.accepted.append(data)
            if data.get("type") == "reaction":  # one per sender and message; "" takes it away
                self._state.reactions[(data["to"], data["reaction"]["message_id"])] = data["reaction"]["emoji"]
        return 200, {"messaging_product": "whatsapp", "contacts": [{"input": data["to"], "wa_id": data["to"]}],
                     "messages": [{"id": new_wamid(data["to"])}]}

    def _over_throughput(self, phone: str) -> bool:
        """A message past `per_second` in the last second from this number; otherwise counted."""
        now = time.monotonic()
        with self._cond:
            times = self._sent.setdefault(phone, [])
            while times and now - times[0] >= 1.0:
                times.pop(0)
            if len(times) >= self.per_second:
                self.floods += 1
                self.flood_times.append(now)
                return True
            times.append(now)
        return False

    def _unknown_media(self, data) -> str:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in ("image", "document"):
            return ""
        with self._cond:
            known = str((data.get(kind) or {}).get("id")) in self._state.media
        return "" if known else f"Invalid parameter: {kind}['id'] names no uploaded media"

    def reaction_on(self, wa_id: str, wamid: str) -> str | None:
        """The business's reaction on a message now ("" once taken away; None: never any)."""
        with self._cond:
            return self._state.reactions.get((wa_id, wamid))

    def file_messages(self, to: str | None = None) -> list[dict]:
        """The image and document messages sent, each with its media's bytes (`data`)."""
        found = []
        for call in self.calls("message"):
            kind = call.body.get("type")
            if kind in ("image", "document") and (to is None or call.body.get("to") == to):
                with self._cond:
                    media = self._state.media.get(str(call.body[kind].get("id")), {})
                found.append({"type": kind, **call.body[kind], "data": media.get("data")})
        return found

    def _wait_while_held(self, what):
        with self._cond:
            hold = next((h for h in self._holds if h.what == what), None)
            if hold is None:
                return
            hold.held += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: hold.released or self._stopping.is_set())
            hold.held -= 1

    def _sleep_if_delayed(self, what):
        with self._cond:
            seconds = self._state.delays.get(what, 0)
        if seconds:
            self._stopping.wait(seconds)

    def _take_rule(self, what):
        with self._cond:
            for rule in self._state.rules:
                if rule.what == what:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._state.rules.remove(rule)
                    return rule
        return None


def _what(data) -> str:
    if not isinstance(data, dict):
        return "invalid"
    if data.get("status") == "read":
        return "typing" if "typing_indicator" in data else "read"
    return "message" if "to" in data or "type" in data else "invalid"


def _invalid(data, what) -> str:
    """What the Cloud API would refuse in this body, "" when nothing."""
    if not isinstance(data, dict):
        return "The parameter messaging_product is required."
    if data.get("messaging_product") != "whatsapp":
        return "The parameter messaging_product is required."
    if what in ("typing", "read"):
        if not isinstance(data.get("message_id"), str) or not data["message_id"].startswith("wamid."):
            return "Invalid parameter: message_id"
        if what == "typing" and data["typing_indicator"] != {"type": "text"}:
            return "Invalid parameter: typing_indicator"
        return ""
    if not isinstance(data.get("to"), str) or not data["to"]:
        return "The parameter to is required."
    if data.get("type") in ("image", "document"):
        return _invalid_media(data)
    if data.get("type") == "template":
        return _invalid_template(data.get("template"))
    if data.get("type") == "reaction":
        return _invalid_reaction(data.get("reaction"))
    if data.get("type", "text") != "text":
        return f"Param type '{data.get('type')}' is not supported by this fake"
    body = (data.get("text") or {}).get("body")
    if not isinstance(body, str) or not body:
        return "The parameter text['body'] is required."
    if len(body) > MAX_TEXT:
        return f"Param text['body'] must be at most {MAX_TEXT} characters long."
    context = data.get("context")
    if context is not None and not (isinstance(context, dict) and isinstance(context.get("message_id"), str)):
        return "Invalid parameter: context"
    return ""


def _invalid_reaction(reaction) -> str:
    """The Cloud API's reaction: the wamid of the message reacted to and one emoji ("" removes ours)."""
    if not isinstance(reaction, dict) or not isinstance(reaction.get("message_id"), str) \
            or not reaction["message_id"].startswith("wamid."):
        return "Invalid parameter: reaction['message_id']"
    emoji = reaction.get("emoji")
    if not isinstance(emoji, str) or (emoji and (len(emoji) > 8 or any(c.isascii() for c in emoji))):
        return "Invalid parameter: reaction['emoji'] must be one emoji"
    return ""


def _invalid_template(template) -> str:
    """The shape of a template message's `template` (its name and language known or not
    is the platform's rule: FakeGraphAPI._template_error)."""
    if not isinstance(template, dict) or not isinstance(template.get("name"), str) or not template["name"]:
        return "The parameter template['name'] is required."
    language = template.get("language")
    if not isinstance(language, dict) or not isinstance(language.get("code"), str) or not language["code"]:
        return "The parameter template['language']['code'] is required."
    components = template.get("components", [])
    if not isinstance(components, list) or not all(isinstance(c, dict) and c.get("type") for c in components):
        return "Invalid parameter: template['components']"
    for component in components:
        for value in component.get("parameters") or []:
            if not isinstance(value, dict) or value.get("type") != "text" or not isinstance(value.get("text"), str):
                return "Invalid parameter: a text parameter needs type 'text' and its text"
            if not value["text"]:
                return "Param text cannot be empty"
    return ""


def _invalid_media(data) -> str:
    media = data.get(data["type"])
    if not isinstance(media, dict) or not media.get("id"):
        return f"The parameter {data['type']}['id'] is required."
    if len(str(media.get("caption") or "")) > 1024:
        return "Param caption must be at most 1024 characters long."
    return ""


def _multipart(content_type: str, body: bytes) -> dict:
    """A multipart form's fields: text as str, a file as (bytes, its declared type)."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    fields = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name and part.get_filename() is not None:
            fields[name] = (payload, part.get_content_type())
        elif name:
            fields[name] = payload.decode("utf-8", "replace")
    return fields


class _Handler(TrackedHandler):
    server: FakeGraphAPI

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        outcome = self.server._serve(self.path, self.headers.get("Authorization", ""), body,
                                     self.headers.get("Content-Type", ""))
        if outcome is None:
            self.close_connection = True
            return
        status, payload = outcome
        data, kind = payload if isinstance(payload, tuple) else (json.dumps(payload).encode(),
                                                                 "application/json; charset=UTF-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True

    def do_GET(self):
        self.do_POST()


# --- Meta's side of the webhook ------------------------------------------------------------


def signature(app_secret: str, body: bytes) -> str:
    """X-Hub-Signature-256 as Meta computes it."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def text_message(wa_id: str, text: str, *, wamid: str | None = None, timestamp: int | None = None) -> dict:
    return {"from": wa_id, "id": wamid or new_wamid(wa_id), "timestamp": str(timestamp or int(time.time())),
            "type": "text", "text": {"body": text}}


def reaction_message(wa_id: str, message_id: str, emoji: str, *, wamid: str | None = None) -> dict:
    """A person's reaction on `message_id` as the webhook carries it (`emoji` "": taken back,
    and Meta then leaves the field out)."""
    reaction = {"message_id": message_id, **({"emoji": emoji} if emoji else {})}
    return {"from": wa_id, "id": wamid or new_wamid(wa_id), "timestamp": str(int(time.time())),
            "type": "reaction", "reaction": reaction}


def media_message(wa_id: str, kind: str = "image", caption: str = "", *, wamid: str | None = None,
                  media_id: str | None = None, mime: str = "image/jpeg", **fields) -> dict:
    """`media_id`: one the fake serves (FakeGraphAPI.add_media); `fields`: `voice`, `filename`…"""
    media = {"mime_type": mime, "sha256": secrets.token_hex(32), "id": media_id or str(next(_serial) + 10**15),
             **fields}
    if caption:
        media["caption"] = caption
    return {"from": wa_id, "id": wamid or new_wamid(wa_id), "timestamp": str(int(time.time())),
            "type": kind, kind: media}


def status(wamid: str, state: str, wa_id: str, *, error_code: int | None = None) -> dict:
    """A `statuses` entry: sent, delivered, read or failed (with the error Meta reports)."""
    entry = {"id": wamid, "status": state, "timestamp": str(int(time.time())), "recipient_id": wa_id}
    if state in ("sent", "delivered"):
        entry["conversation"] = {"id": secrets.token_hex(16), "origin": {"type": "service"}}
        entry["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "service"}
    if error_code is not None:
        known = ERRORS.get(error_code, (400, "", "Error", ""))
        entry["errors"] = [{"code": error_code, "title": known[2], "message": known[2],
                            "error_data": {"details": known[3]}}]
    return entry


def webhook_body(phone_number_id: str, *, messages=(), statuses=(), contacts=None, field_name="messages",
                 display_phone_number="15550001111", waba_id="102290129340398") -> dict:
    """One notification with one entry and one change, in the documented shape."""
    value: dict[str, Any] = {"messaging_product": "whatsapp",
                             "metadata": {"display_phone_number": display_phone_number,
                                          "phone_number_id": phone_number_id}}
    if messages:
        senders = {m["from"] for m in messages}
        value["contacts"] = contacts if contacts is not None else [
            {"profile": {"name": "Camila Rojas"}, "wa_id": wa_id} for wa_id in sorted(senders)]
        value["messages"] = list(messages)
    if statuses:
        value["statuses"] = list(statuses)
    return {"object": "whatsapp_business_account",
            "entry": [{"id": waba_id, "changes": [{"value": value, "field": field_name}]}]}


def deliver(url: str, body: dict | bytes, app_secret: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """POST a notification to a webhook the way Meta does (signed); returns (status, body)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=raw, method="POST", headers={
        "Content-Type": "application/json", "X-Hub-Signature-256": signature(app_secret, raw),
        "User-Agent": "facebookexternalua"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
