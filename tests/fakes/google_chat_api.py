"""Local fakes of Google's side of a Google Chat app, speaking the real wire protocols as
google-auth and the Chat API's clients expect them:

- the certificate endpoints: GET /certs/chat (chat@system.gserviceaccount.com's x509
  certificates, {key id: PEM}, as Google publishes them) and GET /certs/google (Google's
  OAuth 2 ones, the same format), with keys generated per fake;
- the OAuth 2 token endpoint: POST /token, grant_type jwt-bearer, the assertion checked
  against the service account key the fake issued (signature, `aud` Google's token URI
  as google-auth sends it, expiry): {"access_token", "expires_in", "token_type"}; a revoked key is answered 400
  invalid_grant;
- the Chat API: POST /v1/spaces/<s>/messages (spaces.messages.create; `thread.name` and
  messageReplyOption), PATCH /v1/spaces/<s>/messages/<m>?updateMask=… (patch) and DELETE
  (delete), each checking the bearer (401 UNAUTHENTICATED), and keeping Chat's documented
  write quotas (https://developers.google.com/workspace/chat/limits): 60 writes a minute
  into one space, kept as 1 write a second (`space_interval`), and `per_minute` (3,000)
  message writes a minute for the project, 429 RESOURCE_EXHAUSTED past either;
- media.download: GET /v1/media/<resourceName>?alt=media, the bytes of a file `attachment`
  put in an event (checking the bearer: 401; an unknown resource: 404 NOT_FOUND; without
  alt=media: the Media resource's JSON, as Google answers), optionally slow (`media_delay`).

And Google Chat's side of the endpoint: events (`message_event`, `card_clicked`) and the
bearer token Chat signs them with (`chat_token`), POSTed by `post`.

    with FakeGoogleChat() as fake:
        key = fake.service_account_key()     # the channel's setting
        [call] = fake.wait_for("create")

Standard library only for the server (http.server); google-auth signs and checks tokens.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt
from google.auth import jwt as google_jwt

from tests.fakes.server import FakeServer, TrackedHandler

CHAT_ISSUER = "chat@system.gserviceaccount.com"
PROJECT_NUMBER = "123456789012"
SPACE_INTERVAL = 1.0  # Chat: 60 writes a minute per space, one a second
PER_MINUTE = 3000  # Chat: 3,000 message writes a minute per project (one app)
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"


@dataclass(frozen=True)
class Call:
    method: str  # "create", "patch", "delete", "token", "download"
    token: str
    path: str
    query: dict[str, str]
    body: dict[str, Any]
    at: float  # the fake's clock (time.monotonic() unless a test stops it)


@dataclass
class _Rule:
    method: str
    times: int
    status: int
    retry_after: float | None = None


@dataclass
class _State:
    calls: list[Call] = field(default_factory=list)
    refused: list[Call] = field(default_factory=list)  # answered 429 by the quota or a rule
    rules: list[_Rule] = field(default_factory=list)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> the message
    deleted: list[str] = field(default_factory=list)  # message names deleted
    tokens: set[str] = field(default_factory=set)  # access tokens issued and valid
    revoked: set[str] = field(default_factory=set)  # service account emails
    last_in_space: dict[str, float] = field(default_factory=dict)
    minute: deque[float] = field(default_factory=deque)
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # resource name -> (bytes, type)


_keys: dict[str, rsa.RSAPrivateKey] = {}


def _rsa_key(name: str = "") -> rsa.RSAPrivateKey:
    """A new RSA key; with a `name`, the one this process made for it before (a fake's
    standing keys, reused: generating them is most of a test's setup)."""
    if not name:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if name not in _keys:
        _keys[name] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _keys[name]


def _pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _certificate(key: rsa.RSAPrivateKey, name: str) -> str:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2)).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


class Signer:
    """A key Google signs with, its id and its x509 certificate."""

    def __init__(self, name: str, standing: bool = False) -> None:
        self.key = _rsa_key(name if standing else "")
        self.kid = secrets.token_hex(20)
        self.cert = _certificate(self.key, name)
        # The key object itself: from its PEM, cryptography checked the key again each time
        # (44 ms of CPU per signer, 7 s of test_google_chat.py's 11 on each database).
        self.signer = crypt.RSASigner(self.key, self.kid)

    def sign(self, payload: dict[str, Any]) -> str:
        return google_jwt.encode(self.signer, payload).decode()


class FakeGoogleChat(FakeServer):
    def __init__(self, *, per_minute: int = PER_MINUTE, space_interval: float = SPACE_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self._state = _State()
        self.per_minute, self.space_interval = per_minute, space_interval
        self.clock = clock  # the quotas' time: a test that counts sends in a window stops it
        self.media_delay = 0.0  # seconds before a download's bytes start
        self.chat_signer = Signer(CHAT_ISSUER, standing=True)
        self.google_signer = Signer("accounts.google.com", standing=True)
        self.accounts: dict[str, Signer] = {}  # client_email -> its key
        self._names = itertools.count(1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def api_base(self) -> str:
        return f"{self.url}/v1/"

    @property
    def token_uri(self) -> str:
        return f"{self.url}/token"

    def certs_url(self, which: str = "chat") -> str:
        return f"{self.url}/certs/{which}"

    # --- Google's side: keys and tokens ---------------------------------------------------------
    def service_account_key(self, email: str = "agentloop@demo-project.iam.gserviceaccount.com") -> str:
        """A service account key file's JSON (its token_uri Google's: the channel points
        its token_uri setting here)."""
        account = self.accounts.get(email) or self.accounts.setdefault(email, Signer(email, standing=True))
        return json.dumps({"type": "service_account", "project_id": "demo-project", "private_key_id": account.kid,
                           "private_key": _pem(account.key), "client_email": email, "client_id": "1" * 21,
                           "token_uri": "https://oauth2.googleapis.com/token"})

    def revoke(self, email: str = "agentloop@demo-project.iam.gserviceaccount.com") -> None:
        """The key deleted in the console: the token endpoint refuses it, issued tokens die."""
        with self._cond:
            self._state.revoked.add(email)
            self._state.tokens.clear()

    def chat_token(self, audience: str = PROJECT_NUMBER, *, issuer: str = CHAT_ISSUER, expires_in: int = 3600,
                   signer: Signer | None = None, **claims: Any) -> str:
        """The bearer Chat sends: signed by chat@system.gserviceaccount.com (project number
        audience), or by Google with `email` chat@… (endpoint URL audience: issuer
        https://accounts.google.com, signer google_signer)."""
        now = int(time.time())
        payload = {"iss": issuer, "aud": audience, "iat": now - 5, "exp": now + expires_in, **claims}
        return (signer or self.chat_signer).sign(payload)

    # --- files people upload -----------------------------------------------------------------------
    def attachment(self, data: bytes, content_type: str = "image/jpeg", name: str = "foto.jpg") -> dict[str, Any]:
        """A file uploaded to Chat: its bytes kept for media.download, and the attachment
        as an event's message carries it (message_event names it after the message)."""
        resource = "ATT" + secrets.token_urlsafe(60)
        with self._cond:
            self._state.media[resource] = (data, content_type)
        return {"contentName": name, "contentType": content_type, "source": "UPLOADED_CONTENT",
                "thumbnailUri": f"https://chat.google.com/api/get_attachment_url?url_type=FIFE_URL&content_type="
                                f"{content_type}&attachment_token=x",
                "downloadUri": "https://chat.google.com/api/get_attachment_url?url_type=DOWNLOAD_URL&attachment_token=x",
                "attachmentDataRef": {"resourceName": resource}}

    def downloads(self) -> list[Call]:
        """The media.download calls answered with the file's bytes."""
        with self._cond:
            return [c for c in self._state.calls if c.method == "download" and c.body.get("served")]

    # --- scripting and inspection --------------------------------------------------------------------
    def fail_next(self, method: str = "create", status: int = 500, times: int = 1,
                  retry_after: float | None = None) -> None:
        with self._cond:
            self._state.rules.append(_Rule(method, times, status, retry_after))

    def calls(self, method: str = "create") -> list[Call]:
        with self._cond:
            return [c for c in self._state.calls if c.method == method]

    def refused(self) -> list[Call]:
        with self._cond:
            return list(self._state.refused)

    def texts(self) -> list[str]:
        """The texts of the messages created (not those refused), in order."""
        with self._cond:
            return [str(m["text"]) for m in self._state.messages.values()]

    def deleted(self) -> list[str]:
        with self._cond:
            return list(self._state.deleted)

    def message(self, name: str) -> dict[str, Any]:
        with self._cond:
            return dict(self._state.messages[name])

    def wait_for(self, method: str = "create", count: int = 1, timeout: float = 20.0) -> list[Call]:
        with self._cond:
            if not self._cond.wait_for(lambda: len([c for c in self._state.calls if c.method == method]) >= count,
                                       timeout):
                raise AssertionError(f"expected {count} {method} call(s) within {timeout}s, "
                                     f"got {len(self.calls(method))}")
            return [c for c in self._state.calls if c.method == method]

    # --- the server's answers -------------------------------------------------------------------------
    def answer(self, verb: str, path: str, query: dict[str, str], headers: Any,
               raw: bytes) -> tuple[int, dict[str, Any] | bytes, dict[str, str]]:
        if verb == "GET" and path.startswith("/certs/"):
            signer = self.chat_signer if path == "/certs/chat" else self.google_signer
            return 200, {signer.kid: signer.cert}, {"Cache-Control": "public, max-age=19000"}
        if verb == "POST" and path == "/token":
            return self._token(dict(parse_qsl(raw.decode())))
        if path.startswith("/v1/spaces/"):
            return self._chat(verb, path[len("/v1/"):], query, headers, raw)
        if verb == "GET" and path.startswith("/v1/media/"):
            return self._download(unquote(path[len("/v1/media/"):]), query, headers)
        return 404, {"error": {"code": 404, "message": "not found", "status": "NOT_FOUND"}}, {}

    def _download(self, resource: str, query: dict[str, str],
                  headers: Any) -> tuple[int, dict[str, Any] | bytes, dict[str, str]]:
        token = str(headers.get("Authorization") or "").removeprefix("Bearer ")
        with self._cond:
            found = self._state.media.get(resource)
            valid = token in self._state.tokens
            call = Call("download", token, resource, query, {"served": valid and found is not None
                                                             and query.get("alt") == "media"}, self.clock())
            self._state.calls.append(call)
            self._cond.notify_all()
        if not valid:
            return 401, _error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."), {}
        if found is None:
            return 404, _error(404, "NOT_FOUND", "Media not found."), {}
        if query.get("alt") != "media":
            return 200, {"resourceName": resource}, {}
        if self.media_delay:
            time.sleep(self.media_delay)
        return 200, found[0], {"Content-Type": found[1]}

    def _token(self, form: dict[str, str]) -> tuple[int, dict[str, Any], dict[str, str]]:
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return 400, {"error": "unsupported_grant_type"}, {}
        assertion = form.get("assertion", "")
        try:
            claims = google_jwt.decode(assertion, verify=False)
            account = self.accounts[str(claims.get("iss"))]
            # google-auth names Google's token endpoint as the audience whatever token_uri says.
            google_jwt.decode(assertion, certs={account.kid: account.cert}, audience=[GOOGLE_TOKEN_URI, self.token_uri])
        except (ValueError, KeyError) as exc:
            return 400, {"error": "invalid_grant", "error_description": f"Invalid JWT: {exc}"}, {}
        with self._cond:
            self._state.calls.append(Call("token", "", "/token", {}, {"iss": claims["iss"]}, self.clock()))
            if claims["iss"] in self._state.revoked:
                return 400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}, {}
            token = "ya29." + secrets.token_urlsafe(24)
            self._state.tokens.add(token)
        return 200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}, {}

    def _chat(self, verb: str, name: str, query: dict[str, str], headers: Any,
              raw: bytes) -> tuple[int, dict[str, Any], dict[str, str]]:
        token = str(headers.get("Authorization") or "").removeprefix("Bearer ")
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return 400, _error(400, "INVALID_ARGUMENT", "Invalid JSON payload received."), {}
        method = "create" if verb == "POST" and name.endswith("/messages") else \
            {"PATCH": "patch", "DELETE": "delete"}.get(verb, "") if "/messages/" in name else ""
        if not method:
            return 404, _error(404, "NOT_FOUND", "Method not found."), {}
        call = Call(method, token, name, query, body, self.clock())
        with self._cond:
            if token not in self._state.tokens:
                self._state.calls.append(call)
                self._cond.notify_all()
                return 401, _error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."), {}
            rule = next((r for r in self._state.rules if r.method == method and r.times > 0), None)
            if rule is not None:
                rule.times -= 1
                self._state.calls.append(call)
                self._cond.notify_all()
                if rule.status == 429:
                    self._state.refused.append(call)
                wait = {"Retry-After": f"{rule.retry_after:g}"} if rule.retry_after is not None else {}
                return rule.status, _error(rule.status, _STATUS.get(rule.status, "UNKNOWN"), "scripted"), wait
            space = name.rsplit("/messages", 1)[0]
            self._state.calls.append(call)
            self._cond.notify_all()
            if self._over_quota(call, space):
                return 429, _error(429, "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Write requests'"), {}
            if method == "create":
                return self._create(call, space)
            message = self._state.messages.get(name)
            if message is None:
                return 404, _error(404, "NOT_FOUND", "Message not found."), {}
            if method == "delete":
                self._state.deleted.append(self._state.messages.pop(name)["name"])
                return 200, {}, {}
            for path in (query.get("updateMask") or "").split(","):
                if path in ("text", "cardsV2"):
                    message[path] = body.get(path, "" if path == "text" else [])
            return 200, message, {}

    def _over_quota(self, call: Call, space: str) -> bool:
        """Under the lock: a write past the space's second or the project's minute (each
        write counts: creates, edits, deletions)."""
        state, now = self._state, call.at
        while state.minute and now - state.minute[0] >= 60:
            state.minute.popleft()
        too_soon = now - state.last_in_space.get(space, -self.space_interval) < self.space_interval * 0.9
        if too_soon or len(state.minute) >= self.per_minute:
            state.refused.append(call)
            return True
        state.last_in_space[space] = now
        state.minute.append(now)
        return False

    def _create(self, call: Call, space: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Under the lock, within the quotas: the message."""
        state = self._state
        number = next(self._names)
        thread = call.body.get("thread") if isinstance(call.body.get("thread"), dict) else None
        thread_name = str(thread["name"]) if thread and thread.get("name") else f"{space}/threads/t{number}"
        message = {"name": f"{space}/messages/m{number}", "text": call.body.get("text", ""),
                   "cardsV2": call.body.get("cardsV2", []), "thread": {"name": thread_name},
                   "space": {"name": space}, "createTime": dt.datetime.now(dt.UTC).isoformat()}
        state.messages[message["name"]] = message
        return 200, message, {}


_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def _error(code: int, status: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status}}


class _Handler(TrackedHandler):
    server: FakeGoogleChat

    def _serve(self, verb: str) -> None:
        parts = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, answer, headers = self.server.answer(verb, parts.path, dict(parse_qsl(parts.query)), self.headers, raw)
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        kind = {} if isinstance(answer, bytes) else {"Content-Type": "application/json; charset=UTF-8"}
        self.send_response(status)
        for name, value in {**headers, **kind, "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


# --- Google Chat's side of the app's endpoint ------------------------------------------------------
_serial = itertools.count(1)
USER = "users/110000000000000000001"
OTHER_USER = "users/110000000000000000002"
APP_USER = "users/app-0001"
DM_SPACE = "spaces/DMAAAAAAAAA"
ROOM = "spaces/ROOMAAAAAAA"


def message_event(text: str, *, space: str = DM_SPACE, user: str = USER, name: str = "", thread: str = "",
                  mention: bool = False, sender_type: str = "HUMAN", display_name: str = "Camila",
                  attachments: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A MESSAGE event as Chat POSTs it to an HTTP endpoint. In a space with `mention`,
    the text starts with the app's mention (an annotation) and argumentText is the rest.
    `attachments`: FakeGoogleChat.attachment's or drive_attachment's, named after the
    message (`…/attachments/<n>`); a message of only files has no text."""
    number = next(_serial)
    direct = space == DM_SPACE
    sender = {"name": user, "displayName": display_name, "type": sender_type}
    message: dict[str, Any] = {
        "name": name or f"{space}/messages/in{number}.{secrets.token_hex(3)}", "sender": sender,
        "createTime": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"), "text": text,
        "thread": {"name": thread or f"{space}/threads/th{number}"}, "space": {"name": space}}
    if mention:
        message["text"] = f"@Agentloop {text}"
        message["argumentText"] = f" {text}"
        message["annotations"] = [{"type": "USER_MENTION", "startIndex": 0, "length": 10, "userMention": {
            "type": "MENTION", "user": {"name": APP_USER, "displayName": "Agentloop", "type": "BOT"}}}]
    if attachments:
        message["attachment"] = [{"name": f"{message['name']}/attachments/A{i}", **item}
                                 for i, item in enumerate(attachments, start=1)]
    if not message["text"]:
        del message["text"]
    space_body = {"name": space, "type": "DM" if direct else "ROOM",
                  "spaceType": "DIRECT_MESSAGE" if direct else "SPACE", "singleUserBotDm": direct}
    return {"type": "MESSAGE", "eventTime": message["createTime"], "space": space_body, "message": message,
            "user": sender}


def drive_attachment(file_id: str, name: str = "Presupuesto.pdf",
                     content_type: str = "application/pdf") -> dict[str, Any]:
    """A Google Drive file attached to a message (driveDataRef: not downloadable by the app)."""
    return {"contentName": name, "contentType": content_type, "source": "DRIVE_FILE",
            "thumbnailUri": f"https://lh3.googleusercontent.com/d/{file_id}",
            "driveDataRef": {"driveFileId": file_id}}


def card_clicked(message_name: str, data: str, *, space: str = DM_SPACE, user: str = USER) -> dict[str, Any]:
    """A CARD_CLICKED event: a tap on a button whose action is `confirm` with `data`."""
    direct = space == DM_SPACE
    return {"type": "CARD_CLICKED", "eventTime": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
            "space": {"name": space, "type": "DM" if direct else "ROOM",
                      "spaceType": "DIRECT_MESSAGE" if direct else "SPACE"},
            "message": {"name": message_name, "space": {"name": space}},
            "user": {"name": user, "displayName": "Camila", "type": "HUMAN"},
            "action": {"actionMethodName": "confirm", "parameters": [{"key": "data", "value": data}]},
            "common": {"invokedFunction": "confirm", "parameters": {"data": data}}}


def post(url: str, event: dict[str, Any] | bytes, token: str | None) -> httpx.Response:
    """POST an event as Chat does (`Authorization: Bearer <token>`; None: no header)."""
    raw = event if isinstance(event, bytes) else json.dumps(event).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "Google-Dynamite"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(url, content=raw, headers=headers, timeout=15)
