"""Local fakes of Microsoft's side of a Teams bot, speaking the real wire protocols:

- the identity provider the Bot Connector's tokens come from: GET /openid (the OpenID
  metadata document: issuer https://api.botframework.com, jwks_uri) and GET /keys (the
  JSON Web Key Set, each key endorsed for "msteams"), keys generated per process;
- the token endpoint the bot asks for its own token: POST /<tenant>/oauth2/v2.0/token
  (OAuth 2 client credentials: client_id, client_secret, scope
  https://api.botframework.com/.default) → {"token_type", "expires_in", "access_token"};
  a wrong secret is answered 401 invalid_client;
- the Bot Connector: POST /v3/conversations/<id>/activities[/<replyTo>] (a message or a
  typing activity), PUT and DELETE /v3/conversations/<id>/activities/<activity>, each
  served at its root (the channel's service URL setting) and under a region
  (`region_url`: /amer/v3/…, the serviceUrl its activities carry; each call records which),
  and POST /v3/conversations (a person's personal chat: its id, 130 characters as Teams'
  are), each checking the bearer (401), keeping Teams' documented limits for one bot — per thread
  (conversation) 7 in 1 s, 8 in 2 s, 60 in 30 s, 1800 in an hour; 50 a second across all
  its conversations — and answering 429 with Retry-After past any of them; and Teams'
  streaming (typing activities with a streaminfo entity, then the final message) in
  personal chats only, as "Stream bot messages" documents it;
- the images people paste: GET /v3/attachments/<id>/views/original, with the bot's token;
- the files people send in a personal chat (OneDrive's side): GET
  /files/<id>/download.aspx?tempauth=… (pre-authorised: no token wanted; a wrong tempauth
  401), and the upload sessions a file consent's accept gives the bot: PUT /upload/<id>
  with Content-Range the whole file, answered 201 with the item; a completed session is
  gone (404), as OneDrive's are.

And the Connector's side of the bot's endpoint: activities (`message_activity`,
`update_activity`, `delete_activity`, `invoke_activity`, `consent_invoke`) and the token it signs them with
(`connector_token`), POSTed by `post`.

    with FakeTeams() as fake:
        settings = teams_settings(fake)          # tests/support/teams.py
        [call] = fake.wait_for("create")

Standard library only for the server (http.server); PyJWT signs and checks tokens, the
Agents SDK's Activity model reads what the bot sends, and its FileConsentCard and
FileInfoCard models the file cards in it (the product writes them as plain JSON).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import itertools
import json
import re
import secrets
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from microsoft_agents.activity import Activity
from microsoft_agents.activity.teams import FileConsentCard, FileInfoCard

from tests.fakes.server import FakeServer, TrackedHandler

ISSUER = "https://api.botframework.com"
APP_ID = "00000000-0000-0000-0000-00000000a990"
APP_PASSWORD = "teams-client-secret-0123456789"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
# Teams' documented limits per bot per thread: (messages, seconds); and per bot in all.
THREAD_LIMITS = ((7, 1.0), (8, 2.0), (60, 30.0), (1800, 3600.0))
BOT_PER_SECOND = 50
# The serviceUrl the activities carry (and the Connector's tokens claim) when no fake is
# running: a real region's. While one is (entered with `with`), its region_url(): replies
# go to the serviceUrl of the chat's last activity (its conversation reference).
ACTIVITY_SERVICE_URL = "https://smba.trafficmanager.net/amer/"
_serving: list[str] = []  # the region URLs of the fakes entered, the latest last


def activity_service_url() -> str:
    return _serving[-1] if _serving else ACTIVITY_SERVICE_URL


@dataclass(frozen=True)
class Call:
    method: str  # "create", "typing", "stream" (a streaming update or final), "update", "delete", "token",
    # "conversation" (a personal chat asked for)
    token: str
    conversation: str
    activity_id: str  # the path's: replied to (create) or changed (update, delete)
    body: dict[str, Any]
    at: float  # the fake's clock (time.monotonic() unless a test stops it)
    service: str = ""  # the serviceUrl it was called on: "" the root, else its region ("amer")


@dataclass
class _Rule:
    method: str
    times: int
    status: int
    retry_after: float | None = None
    code: str = ""


@dataclass
class _State:
    calls: list[Call] = field(default_factory=list)
    refused: list[Call] = field(default_factory=list)  # answered 429
    rules: list[_Rule] = field(default_factory=list)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)  # activity id -> the activity
    streams: dict[str, dict[str, Any]] = field(default_factory=dict)  # stream id -> its state (open, sequence, chat)
    deleted: list[str] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    in_thread: dict[str, deque[float]] = field(default_factory=lambda: defaultdict(deque))
    in_second: deque[float] = field(default_factory=deque)
    attachments: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # id -> (bytes, content type)
    downloads: list[tuple[str, str]] = field(default_factory=list)  # (attachment id, the Authorization sent)
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # a sent file's id -> (bytes, tempauth)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)  # upload session -> {name, done, data}
    uploads: list[dict[str, Any]] = field(default_factory=list)  # each PUT: session, range, size, authorization


_keys: dict[str, rsa.RSAPrivateKey] = {}


def _rsa_key(name: str = "") -> rsa.RSAPrivateKey:
    """A new RSA key; with a `name`, the one this process made for it before (generating
    keys is most of a test's setup)."""
    if not name:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if name not in _keys:
        _keys[name] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _keys[name]


class Signer:
    """A key the Connector signs with: its id, its JWK (endorsed for `endorsements`)."""

    def __init__(self, name: str = "", endorsements: tuple[str, ...] = ("msteams",)) -> None:
        self.key = _rsa_key(name)
        self.kid = secrets.token_urlsafe(16)
        self.jwk: dict[str, Any] = {**jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key(), as_dict=True),
                                    "kid": self.kid, "use": "sig", "endorsements": list(endorsements)}

    def sign(self, payload: dict[str, Any], alg: str = "RS256") -> str:
        return jwt.encode(payload, self.key, algorithm=alg, headers={"kid": self.kid})


class FakeTeams(FakeServer):
    def __init__(self, *, thread_limits: tuple[tuple[int, float], ...] = THREAD_LIMITS,
                 bot_per_second: int = BOT_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._state = _State()
        self.thread_limits, self.bot_per_second = thread_limits, bot_per_second
        # The limits' time: a test that counts sends in a window stops it, so a slow
        # machine does not spread eight sends over more than Teams' one second.
        self.clock = clock
        self.signer = Signer("botframework")
        self.apps = {APP_ID: APP_PASSWORD}
        self._ids = itertools.count(1_700_000_000_000)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def openid_url(self) -> str:
        return f"{self.url}/openid"

    @property
    def service_url(self) -> str:
        return f"{self.url}/"

    def region_url(self, region: str = "amer") -> str:
        """A regional serviceUrl of the Connector (Teams': https://smba.trafficmanager.net/amer/)."""
        return f"{self.url}/{region}/"

    def __enter__(self) -> FakeTeams:
        entered: FakeTeams = super().__enter__()
        _serving.append(self.region_url())
        return entered

    def __exit__(self, *exc_info: object) -> None:
        if self.region_url() in _serving:
            _serving.remove(self.region_url())
        super().__exit__(*exc_info)

    def token_url(self, tenant: str = TENANT) -> str:
        return f"{self.url}/{tenant}/oauth2/v2.0/token"

    # --- the Connector's tokens -------------------------------------------------------------------
    def connector_token(self, audience: str = APP_ID, *, service_url: str | None = None, issuer: str = ISSUER,
                        expires_in: int = 3600, signer: Signer | None = None, **claims: Any) -> str:
        """The bearer the Connector sends with an activity: signed by its published key,
        `aud` the bot's app id, `serviceUrl` the activity's."""
        now = int(time.time())
        payload = {"iss": issuer, "aud": audience, "iat": now - 5, "nbf": now - 5, "exp": now + expires_in,
                   "serviceUrl": activity_service_url() if service_url is None else service_url, **claims}
        return (signer or self.signer).sign(payload)

    # --- scripting and inspection --------------------------------------------------------------------
    def fail_next(self, method: str = "create", status: int = 500, times: int = 1, retry_after: float | None = None,
                  code: str = "") -> None:
        with self._cond:
            self._state.rules.append(_Rule(method, times, status, retry_after, code))

    def calls(self, method: str = "create") -> list[Call]:
        with self._cond:
            return [c for c in self._state.calls if c.method == method]

    def refused(self) -> list[Call]:
        with self._cond:
            return list(self._state.refused)

    def texts(self) -> list[str]:
        """What the messages kept show, in order: their text, or their card's first TextBlock."""
        with self._cond:
            return [shown(m) for m in self._state.messages.values()]

    def message(self, activity_id: str) -> dict[str, Any]:
        with self._cond:
            return dict(self._state.messages[activity_id])

    def deleted(self) -> list[str]:
        with self._cond:
            return list(self._state.deleted)

    def wait_for(self, method: str = "create", count: int = 1, timeout: float = 20.0) -> list[Call]:
        with self._cond:
            if not self._cond.wait_for(lambda: len([c for c in self._state.calls if c.method == method]) >= count,
                                       timeout):
                raise AssertionError(f"expected {count} {method} call(s) within {timeout}s, "
                                     f"got {len(self.calls(method))}")
            return [c for c in self._state.calls if c.method == method]

    # --- the server's answers -------------------------------------------------------------------------
    def answer(self, verb: str, path: str, headers: Any, raw: bytes, query: str = "") -> tuple[int, Any, dict[str, str]]:
        if verb == "GET" and path == "/openid":
            return 200, {"issuer": ISSUER, "authorization_endpoint": "https://invalid.botframework.com",
                         "jwks_uri": f"{self.url}/keys", "id_token_signing_alg_values_supported": ["RS256"],
                         "token_endpoint_auth_methods_supported": ["private_key_jwt"]}, {}
        if verb == "GET" and path == "/keys":
            return 200, {"keys": [self.signer.jwk]}, {}
        if verb == "GET" and path.startswith("/v3/attachments/"):
            return self._attachment(path.split("/")[3], str(headers.get("Authorization") or ""))
        if verb == "GET" and path.startswith("/files/"):
            return self._file(path.split("/")[2], dict(parse_qsl(query)), str(headers.get("Authorization") or ""))
        if verb == "PUT" and path.startswith("/upload/"):
            return self._upload(path.split("/")[2], headers, raw)
        if verb == "POST" and path.endswith("/oauth2/v2.0/token"):
            return self._token(dict(parse_qsl(raw.decode())))
        region = ""
        if _REGION.match(path):
            region, path = path.split("/")[1], path[len(path.split("/")[1]) + 1:]
        if verb == "POST" and path.rstrip("/") == "/v3/conversations":
            return self._create_conversation(headers, raw, region)
        if path.startswith("/v3/conversations/"):
            return self._connector(verb, path, headers, raw, region)
        return 404, _error("NotFound", "not found"), {}

    def _token(self, form: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        with self._cond:
            self._state.calls.append(Call("token", "", "", "", {"client_id": form.get("client_id", ""),
                                                                "scope": form.get("scope", "")}, self.clock()))
            self._cond.notify_all()
            if form.get("grant_type") != "client_credentials":
                return 400, {"error": "unsupported_grant_type"}, {}
            if self.apps.get(form.get("client_id", "")) != form.get("client_secret") or not form.get("client_secret"):
                return 401, {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret "
                                                                             "provided."}, {}
            if form.get("scope") != "https://api.botframework.com/.default":
                return 400, {"error": "invalid_scope"}, {}
            token = "eyJ0eXAi." + secrets.token_urlsafe(24)
            self._state.tokens.add(token)
        return 200, {"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token}, {}

    def add_attachment(self, data: bytes, content_type: str = "image/png") -> str:
        """An image a person pasted: its contentUrl (GET with the bot's token)."""
        attachment_id = "0-cus-d4-" + secrets.token_hex(16)
        with self._cond:
            self._state.attachments[attachment_id] = (data, content_type)
        return f"{self.url}/v3/attachments/{attachment_id}/views/original"

    def add_file(self, data: bytes, name: str = "informe.pdf") -> dict[str, Any]:
        """A file a person sends in a personal chat: its `file.download.info` attachment
        (the downloadUrl pre-authorised by a tempauth of its own, as SharePoint's are)."""
        file_id, tempauth = secrets.token_hex(8), "v1." + secrets.token_urlsafe(600)
        unique = "1a1e50e2-" + secrets.token_hex(4) + "-4e7a-a1a8-" + secrets.token_hex(6)
        with self._cond:
            self._state.files[file_id] = (data, tempauth)
        url = f"{self.url}/files/{file_id}/download.aspx?UniqueId={unique}&Translate=false&tempauth={tempauth}"
        return {"contentType": "application/vnd.microsoft.teams.file.download.info",
                "contentUrl": f"https://contoso-my.sharepoint.com/personal/camila/Documents/{name}", "name": name,
                "content": {"downloadUrl": url, "uniqueId": unique, "fileType": name.rsplit(".", 1)[-1]}}

    def _file(self, file_id: str, query: dict[str, str], authorization: str) -> tuple[int, Any, dict[str, str]]:
        with self._cond:
            self._state.downloads.append((file_id, authorization))
            held = self._state.files.get(file_id)
        if held is None:
            return 404, _error("itemNotFound", "The resource could not be found."), {}
        if query.get("tempauth") != held[1]:
            return 401, _error("unauthenticated", "Invalid tempauth"), {}
        return 200, held[0], {"Content-Type": "application/octet-stream"}

    def upload_info(self, name: str = "cita.ics") -> dict[str, Any]:
        """What Teams gives the bot when the person accepts a file: a new upload session in
        their OneDrive ("Send and receive files using bot": uploadInfo)."""
        session, unique = secrets.token_urlsafe(12), "{" + secrets.token_hex(16) + "}"
        with self._cond:
            self._state.sessions[session] = {"name": name, "done": False, "data": b""}
        return {"name": name, "uploadUrl": f"{self.url}/upload/{session}?tempauth={secrets.token_urlsafe(24)}",
                "contentUrl": f"https://contoso-my.sharepoint.com/personal/camila/Documents/Applications/{name}",
                "uniqueId": unique, "fileType": name.rsplit(".", 1)[-1]}

    def uploads(self) -> list[dict[str, Any]]:
        with self._cond:
            return [dict(u) for u in self._state.uploads]

    def uploaded(self, name: str) -> bytes | None:
        """The bytes a completed session of that name holds."""
        with self._cond:
            return next((s["data"] for s in self._state.sessions.values() if s["name"] == name and s["done"]), None)

    def _upload(self, session: str, headers: Any, raw: bytes) -> tuple[int, Any, dict[str, str]]:
        """PUT a file's bytes into an upload session: one range, the whole file (what the
        bot sends), answered 201 with the driveItem; a completed session is gone (404)."""
        given = str(headers.get("Content-Range") or "")
        with self._cond:
            self._state.uploads.append({"session": session, "range": given, "size": len(raw),
                                        "authorization": str(headers.get("Authorization") or "")})
            self._cond.notify_all()
            held = self._state.sessions.get(session)
            if held is None or held["done"]:
                return 404, _error("itemNotFound", "The upload session was not found."), {}
            if given != f"bytes 0-{len(raw) - 1}/{len(raw)}" or not raw:
                return 416, _error("invalidRange", "The Content-Range does not match the body."), {}
            held.update(done=True, data=raw)
        return 201, {"id": "01" + secrets.token_hex(16).upper(), "name": held["name"], "size": len(raw),
                     "file": {}}, {}

    def downloads(self) -> list[tuple[str, str]]:
        with self._cond:
            return list(self._state.downloads)

    def _attachment(self, attachment_id: str, authorization: str) -> tuple[int, Any, dict[str, str]]:
        with self._cond:
            self._state.downloads.append((attachment_id, authorization))
            if authorization.removeprefix("Bearer ") not in self._state.tokens:
                return 401, _error("Unauthorized", "Authorization has been denied for this request."), {}
            held = self._state.attachments.get(attachment_id)
        if held is None:
            return 404, _error("NotFound", "no such attachment"), {}
        return 200, held[0], {"Content-Type": held[1]}

    def _create_conversation(self, headers: Any, raw: bytes, region: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        """POST /v3/conversations for the bot and one person: their personal chat's id
        (the same every time, as Teams answers for a chat that exists)."""
        token = str(headers.get("Authorization") or "").removeprefix("Bearer ")
        try:
            body = json.loads(raw or b"{}")
            [member] = body["members"]
            user, bot = str(member["id"]), str(body["bot"]["id"])
        except (ValueError, KeyError, TypeError):
            return 400, _error("BadArgument", "members and bot are required"), {}
        with self._cond:
            self._state.calls.append(Call("conversation", token, "", "", body, self.clock(), region))
            self._cond.notify_all()
            if token not in self._state.tokens:
                return 401, _error("Unauthorized", "Authorization has been denied for this request."), {}
            rule = next((r for r in self._state.rules if r.method == "conversation" and r.times > 0), None)
            if rule is not None:
                rule.times -= 1
                return rule.status, _error(rule.code or _CODES.get(rule.status, "ServiceError"), "scripted"), {}
        if bot != BOT or body.get("isGroup") or not user.startswith("29:"):
            return 400, _error("BadArgument", "a personal conversation is between the bot and one user"), {}
        return 201, {"id": personal_conversation(user)}, {}

    def _connector(self, verb: str, path: str, headers: Any, raw: bytes,
                   region: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        parts = path[len("/v3/conversations/"):].split("/")
        if len(parts) not in (2, 3) or parts[1] != "activities":
            return 404, _error("NotFound", "no such operation"), {}
        conversation, activity_id = unquote(parts[0]), unquote(parts[2]) if len(parts) == 3 else ""
        token = str(headers.get("Authorization") or "").removeprefix("Bearer ")
        try:
            body = json.loads(raw or b"{}") if verb != "DELETE" else {}
            if verb != "DELETE":
                Activity.model_validate(body)  # what the bot sends must be an activity
                _file_cards(body)
        except ValueError as exc:
            return 400, _error("BadSyntax", f"not an activity: {str(exc)[:100]}"), {}
        stream = _stream_info(body) if verb == "POST" else None
        method = {"POST": "stream" if stream is not None else "typing" if body.get("type") == "typing" else "create",
                  "PUT": "update", "DELETE": "delete"}.get(verb, "")
        if not method or (method in ("update", "delete") and not activity_id):
            return 405, _error("MethodNotAllowed", "method not allowed"), {}
        call = Call(method, token, conversation, activity_id, body, self.clock(), region)
        with self._cond:
            self._state.calls.append(call)
            self._cond.notify_all()
            if token not in self._state.tokens:
                return 401, _error("Unauthorized", "Authorization has been denied for this request."), {}
            rule = next((r for r in self._state.rules if r.method == method and r.times > 0), None)
            if rule is not None:
                rule.times -= 1
                if rule.status == 429:
                    self._state.refused.append(call)
                wait = {"Retry-After": f"{rule.retry_after:g}"} if rule.retry_after is not None else {}
                return rule.status, _error(rule.code or _CODES.get(rule.status, "ServiceError"), "scripted"), wait
            wait_for = self._over_limits(call)
            if wait_for:
                self._state.refused.append(call)
                return 429, _error("TooManyRequests", "Too many requests"), {"Retry-After": f"{wait_for:g}"}
            if method == "typing":
                return 200, {}, {}
            if method == "stream":
                return self._stream(call, stream or {})
            if method == "create":
                new = str(next(self._ids))
                self._state.messages[new] = {**body, "id": new, "conversation": {"id": conversation},
                                             "timestamp": dt.datetime.now(dt.UTC).isoformat()}
                return 201, {"id": new}, {}
            if activity_id not in self._state.messages:
                return 404, _error("ActivityNotFoundInConversation", "The activity was not found."), {}
            if method == "delete":
                self._state.messages.pop(activity_id)
                self._state.deleted.append(activity_id)
                return 200, {}, {}
            self._state.messages[activity_id] = {**body, "id": activity_id, "conversation": {"id": conversation}}
            return 200, {"id": activity_id}, {}

    def _stream(self, call: Call, info: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Under the lock, within the limits: a streaming update or the final, as Teams
        takes them ("Stream bot messages"): personal chats only; the first update's
        streamSequence 1 and no streamId, answered 201 with the stream's id (its
        message's); later ones the stream's id and a higher sequence (202; an older one
        is dropped, 202 too); the final a `message` with streamType final and no sequence.
        A stream ended takes nothing more (403 ContentStreamNotAllowed)."""
        state, body = self._state, call.body
        not_allowed = 403, _error("ContentStreamNotAllowed", "Content stream is not allowed"), {}
        if not call.conversation.startswith("a:"):
            return not_allowed
        stream_id, sequence, kind = str(info.get("streamId") or ""), info.get("streamSequence"), info.get("streamType")
        final = body.get("type") == "message"
        if final != (kind == "final") or (final and sequence is not None) or (not final and not body.get("text")):
            return 400, _error("BadRequest", "Start streaming activities should include text"), {}
        if not stream_id:
            if final or sequence != 1:
                return 400, _error("BadRequest", "the first streaming request's streamSequence must be 1"), {}
            new = str(next(self._ids))
            state.streams[new] = {"open": True, "sequence": 1, "chat": call.conversation, "updates": 1}
            state.messages[new] = {**body, "id": new, "conversation": {"id": call.conversation}}
            return 201, {"id": new}, {}
        held = state.streams.get(stream_id)
        if held is None or not held["open"] or held["chat"] != call.conversation:
            return 403, _error("ContentStreamNotAllowed", "Content stream is not allowed on an already completed "
                                                          "streamed message"), {}
        if final:
            held["open"] = False
            state.messages[stream_id] = {**body, "id": stream_id, "conversation": {"id": call.conversation}}
            return 202, {}, {}
        if not isinstance(sequence, int) or sequence <= held["sequence"]:
            return 202, _error("ContentStreamSequenceOrderPreConditionFailed", "PreCondition failed exception "
                                                                                "when processing streaming activity."), {}
        held["sequence"], held["updates"] = sequence, held["updates"] + 1
        state.messages[stream_id] = {**body, "id": stream_id, "conversation": {"id": call.conversation}}
        return 202, {}, {}

    def stream(self, stream_id: str) -> dict[str, Any]:
        with self._cond:
            return dict(self._state.streams[stream_id])

    def _over_limits(self, call: Call) -> float:
        """Under the lock: the seconds until the call would be within Teams' limits (0: it
        is, and it is counted). Every activity counts: messages, typing, edits, deletions."""
        now = call.at
        sent = self._state.in_thread[call.conversation]
        longest = max((seconds for _count, seconds in self.thread_limits), default=0.0)
        while sent and now - sent[0] >= longest:
            sent.popleft()
        wait = 0.0
        for count, seconds in self.thread_limits:
            recent = [at for at in sent if now - at < seconds]
            if len(recent) >= count:
                wait = max(wait, seconds - (now - recent[-count]))
        second = self._state.in_second
        while second and now - second[0] >= 1.0:
            second.popleft()
        if self.bot_per_second and len(second) >= self.bot_per_second:
            wait = max(wait, 1.0 - (now - second[0]))
        if wait:
            return max(round(wait, 2), 0.01)
        sent.append(now)
        second.append(now)
        return 0.0


_REGION = re.compile(r"^/[a-z]+/v3/conversations(/|$)")
_CODES = {400: "BadArgument", 401: "Unauthorized", 403: "BotNotInConversationRoster", 404: "ConversationNotFound",
          412: "PreconditionFailed", 413: "MessageSizeTooBig", 429: "TooManyRequests", 500: "ServiceError",
          502: "BadGateway", 503: "ServiceUnavailable"}


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


def _stream_info(activity: dict[str, Any]) -> dict[str, Any] | None:
    for entity in activity.get("entities") or []:
        if isinstance(entity, dict) and entity.get("type") == "streaminfo":
            return entity
    return None


def shown(activity: dict[str, Any]) -> str:
    """What a message shows: its text, else its card's first TextBlock."""
    if activity.get("text"):
        return str(activity["text"])
    for attachment in activity.get("attachments") or []:
        for block in (attachment.get("content") or {}).get("body") or []:
            if block.get("type") == "TextBlock":
                return str(block.get("text") or "")
    return ""


class _Handler(TrackedHandler):
    server: FakeTeams

    def _serve(self, verb: str) -> None:
        parts = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, answer, headers = self.server.answer(verb, parts.path, self.headers, raw, parts.query)
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        self.send_response(status)
        for name, value in {"Content-Type": "application/json; charset=utf-8", **headers,
                            "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


# --- the Connector's side of the bot's endpoint ------------------------------------------------------
_serial = itertools.count(1)
USER = "29:1hGdH7Wz-user-one-aad-object-0001"
OTHER_USER = "29:1hGdH7Wz-user-two-aad-object-0002"
BOT = f"28:{APP_ID}"


def personal_conversation(user: str) -> str:
    """A personal chat's conversation id, as long as Teams' are (130 characters)."""
    digest = b"".join(hashlib.sha256(f"{user}:{n}".encode()).digest() for n in range(3))
    return "a:1" + base64.urlsafe_b64encode(digest).decode()[:127]


PERSONAL = personal_conversation(USER)
GROUP_CHAT = "19:meeting_group_chat_0001@thread.v2"
TEAM_CHANNEL = "19:general0000channel0001@thread.tacv2"


def _conversation(kind: str, conversation_id: str) -> dict[str, Any]:
    found: dict[str, Any] = {"conversationType": kind, "tenantId": TENANT, "id": conversation_id}
    if kind != "personal":
        found["isGroup"] = True
    return found


def message_activity(text: str, *, kind: str = "personal", conversation: str = "", user: str = USER,
                     name: str = "Camila", activity_id: str = "", mention: bool = False, service_url: str = "",
                     reply_to: str = "", images: tuple[str, ...] = (),
                     files: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A message activity as the Connector POSTs it. In a channel, a new post's
    conversation id carries its own id (`;messageid=`): the thread a reply goes into.
    With `mention`, the text starts with the bot's `<at>` mention and a mention entity."""
    number = next(_serial)
    activity_id = activity_id or f"17{number:011d}"
    if not conversation:
        conversation = {"personal": PERSONAL, "groupChat": GROUP_CHAT}.get(kind) or \
            f"{TEAM_CHANNEL};messageid={reply_to or activity_id}"
    activity: dict[str, Any] = {
        "type": "message", "id": activity_id, "timestamp": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        "localTimestamp": dt.datetime.now(dt.UTC).isoformat(), "serviceUrl": service_url or activity_service_url(),
        "channelId": "msteams", "from": {"id": user, "name": name, "aadObjectId": secrets.token_hex(8)},
        "conversation": _conversation(kind, conversation), "recipient": {"id": BOT, "name": "Agentloop"},
        "textFormat": "plain", "locale": "es-CL", "text": text,
        "entities": [{"type": "clientInfo", "locale": "es-CL", "country": "CL", "platform": "Web"}],
        "channelData": {"tenant": {"id": TENANT}}}
    if mention:
        activity["text"] = f"<at>Agentloop</at> {text}"
        activity["entities"].append({"type": "mention", "text": "<at>Agentloop</at>",
                                     "mentioned": {"id": BOT, "name": "Agentloop"}})
    if reply_to:
        activity["replyToId"] = reply_to
    if images:  # pasted images: each its Connector URL, and the message's HTML rendition beside them
        activity["attachments"] = [
            *({"contentType": "image/*", "contentUrl": url, "name": "image.png"} for url in images),
            {"contentType": "text/html", "content": f"<p>{text}</p>"}]
    if files:  # files sent in a personal chat: each its download info (FakeTeams.add_file)
        activity["attachments"] = [*files, *activity.get("attachments", [])]
    if kind == "channel":
        activity["channelData"].update(teamsChannelId=TEAM_CHANNEL, teamsTeamId="19:team0001@thread.tacv2")
    return activity


def update_activity(original: dict[str, Any], text: str) -> dict[str, Any]:
    """The messageUpdate Teams sends when the person edits `original`."""
    return {**original, "type": "messageUpdate", "text": text,
            "channelData": {**original.get("channelData", {}), "eventType": "editMessage"}}


def delete_activity(original: dict[str, Any]) -> dict[str, Any]:
    """The messageDelete Teams sends when the person deletes `original`."""
    found = {key: value for key, value in original.items() if key not in ("text", "entities")}
    return {**found, "type": "messageDelete", "channelData": {**original.get("channelData", {}),
                                                              "eventType": "softDeleteMessage"}}


def invoke_activity(data: str, *, reply_to: str = "", kind: str = "personal", conversation: str = "",
                    user: str = USER, service_url: str = "", verb: str = "confirm") -> dict[str, Any]:
    """The invoke a tap on an Action.Execute sends (name adaptiveCard/action)."""
    base = message_activity("", kind=kind, conversation=conversation, user=user, service_url=service_url)
    base.pop("text")
    return {**base, "type": "invoke", "name": "adaptiveCard/action", "replyToId": reply_to,
            "value": {"action": {"type": "Action.Execute", "verb": verb, "data": {"data": data}}, "trigger": "manual"}}


def _file_cards(body: dict[str, Any]) -> None:
    """The file cards in an activity read with the SDK's models (ValueError if one does
    not fit). Its FileInfoCard requires an etag, which Teams' documented card has not."""
    for attachment in body.get("attachments") or []:
        kind, content = attachment.get("contentType"), attachment.get("content")
        if kind == "application/vnd.microsoft.teams.card.file.consent":
            FileConsentCard.model_validate(content)
        elif kind == "application/vnd.microsoft.teams.card.file.info":
            FileInfoCard.model_validate({"etag": None, **content} if isinstance(content, dict) else content)


def consent_invoke(context: Any, action: str = "accept", upload: dict[str, Any] | None = None, *,
                   user: str = USER, service_url: str = "") -> dict[str, Any]:
    """The invoke a tap on a file consent card sends (name fileConsent/invoke): the card's
    acceptContext or declineContext, and on accept the upload session Teams made."""
    base = message_activity("", user=user, service_url=service_url)
    base.pop("text")
    value: dict[str, Any] = {"type": "fileUpload", "action": action, "context": context}
    if upload is not None:
        value["uploadInfo"] = upload
    return {**base, "type": "invoke", "name": "fileConsent/invoke", "value": value}


def post(url: str, activity: dict[str, Any] | bytes, token: str | None) -> httpx.Response:
    """POST an activity as the Connector does (`Authorization: Bearer <token>`; None: none)."""
    raw = activity if isinstance(activity, bytes) else json.dumps(activity).encode()
    headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "Microsoft-SkypeBotApi"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url, content=raw, headers=headers, timeout=15)
