"""Discord, as two local servers speaking its real protocols.

DiscordRest: the REST API under /api/v10 — GET /gateway/bot (the Gateway's URL), GET
/users/@me (the bot, what discord.py's login asks), PATCH /channels/{id}/messages/{id} (an
edit: a bucket of 5 per 5 s per channel of its own, 429 past it), DELETE of one (204;
Unknown Message 10008 when it is not there), POST /interactions/{id}/{token}/callback (a
tap's answer: once, for a known token), POST /channels/{id}/messages — JSON, or
multipart/form-data with `payload_json` and `files[n]` parts (each recorded with its
bytes; over `upload_limit`, 25 MiB as Discord's default, 413 Request entity too large,
40005; neither content nor a file 400, 50006) — POST /channels/{id}/typing, PUT and
DELETE /channels/{id}/messages/{id}/reactions/{emoji}/@me (the bot's reaction).
The CDN: `attachment(data, filename, content_type)` gives a MESSAGE_CREATE's attachment
object whose signed `url` (ex, is, hm) this server serves without a token, as Discord's
CDN does (a wrong signature 404; `download_delay` holds each answer); each download
recorded. `Authorization: Bot <token>`
or 401; an unknown channel 404 (code 10003), a forbidden one 403 (Missing Access, 50001),
content over 2,000 characters 400 (50035). The rate limits as Discord sends them: every
answer names its bucket (X-RateLimit-Bucket, -Limit, -Remaining, -Reset, -Reset-After;
a message bucket of 5 per 5 s per channel), a send past it is answered 429 with JSON
{"message", "retry_after", "global": false} and X-RateLimit-Scope; `flood_next` answers
the next sends 429 with `global: true` (X-RateLimit-Global); `fail_next` the next with a
status of the test's choosing.

DiscordGateway: a websockets server: Hello (op 10) with the heartbeat interval, op 11
for each heartbeat, IDENTIFY → READY (session_id, resume_gateway_url, the bot's user),
RESUME → the session's dispatches after the given sequence number, then RESUMED; an
unknown session → INVALID_SESSION (d: false); a wrong token → close 4004; a client's close
with 1000 or 1001 ends its session (a RESUME after it is refused). The test
dispatches events (`dispatch`), drops the socket without a close frame (`drop`), or
invalidates the session (`invalidate`). Dispatches made while no client is connected
are kept in the session and replayed on RESUME, as Discord does.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import hashlib
import itertools
import json
import re
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, unquote

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from tests.fakes.server import FakeServer, TrackedHandler

BOT_USER_ID = "900000000000000001"
BUCKET_SIZE, BUCKET_SECONDS = 5, 5.0  # messages into one channel
MESSAGES = re.compile(r"^/api/v10/channels/(\d+)/messages$")
TYPING = re.compile(r"^/api/v10/channels/(\d+)/typing$")
MESSAGE = re.compile(r"^/api/v10/channels/(\d+)/messages/(\d+)$")
REACTION = re.compile(r"^/api/v10/channels/(\d+)/messages/(\d+)/reactions/([^/]+)/@me$")
CDN = re.compile(r"^/attachments/(\d+)/(\d+)/([^/?]+)$")
UPLOAD_LIMIT = 25 * 1024 * 1024
CALLBACK = re.compile(r"^/api/v10/interactions/(\d+)/([^/]+)/callback$")


class DiscordRest(FakeServer):
    def __init__(self, token: str, gateway_url: str = "") -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.token, self.gateway_url = token, gateway_url
        self.messages: list[dict[str, Any]] = []  # accepted: {"channel_id", "content", "message_reference", "id"}
        self.sent_at: list[float] = []  # when each was accepted (time.monotonic())
        self.refused: list[tuple[int, dict[str, Any]]] = []  # (status, body)
        self.typing: list[str] = []  # channel ids
        self.unknown: set[str] = set()  # channel ids answered 404
        self.forbidden: set[str] = set()  # channel ids answered 403
        self.flood_next = 0  # the next this many sends: 429, global
        self.fail_next: list[int] = []  # the next sends answered with these statuses
        self.retry_after = 1.0
        self.interactions: dict[str, str] = {}  # interaction id → its token
        self.interaction_messages: dict[str, str] = {}  # interaction id → the tapped message
        self.answered: dict[str, Any] = {}  # interaction id → its callback's body
        self.edits: list[tuple[str, Any]] = []  # (message id, PATCH body)
        self.edits_refused = 0  # PATCHes answered 429 (the edit bucket)
        self.deleted: list[str] = []  # message ids
        self.reactions: dict[str, list[str]] = {}  # message id → the bot's reactions on it, in order
        self.reaction_calls: list[tuple[str, str, str]] = []  # (method, message id, emoji)
        self.upload_limit = UPLOAD_LIMIT
        self.files: dict[str, tuple[bytes, str, str]] = {}  # attachment id → (bytes, content type, signature)
        self.downloads: list[str] = []  # attachment ids served
        self.download_delay = 0.0  # seconds the CDN waits before it answers
        self._edit_buckets: dict[str, list[float]] = {}  # channel id → edit times in the window
        self._ids = itertools.count(1)
        self._buckets: dict[str, list[float]] = {}  # channel id → send times in the window

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/api/v10"

    def answer(self, method: str, path: str, headers: dict[str, str], body: Any,
               files: list[dict[str, Any]] | None = None) -> tuple[int, Any, dict[str, str]]:
        with self._cond:
            if headers.get("authorization") != f"Bot {self.token}":
                return 401, {"message": "401: Unauthorized", "code": 0}, {}
            if method == "GET" and path == "/api/v10/users/@me":
                return 200, {"id": BOT_USER_ID, "username": "agentbot", "bot": True}, {}
            if method == "GET" and path == "/api/v10/gateway/bot":
                return 200, {"url": self.gateway_url, "shards": 1, "session_start_limit": {
                    "total": 1000, "remaining": 999, "reset_after": 14400000, "max_concurrency": 1}}, {}
            if method == "POST" and (callback := CALLBACK.match(path)):
                return self._callback(callback.group(1), callback.group(2), body)
            if method == "PATCH" and (edited := MESSAGE.match(path)):
                return self._edit(edited.group(1), edited.group(2), body)
            if method == "DELETE" and (gone := MESSAGE.match(path)):
                return self._delete(gone.group(1), gone.group(2))
            if method in ("PUT", "DELETE") and (reaction := REACTION.match(path)):
                return self._reaction(method, reaction.group(2), unquote(reaction.group(3)))
            found = MESSAGES.match(path) or TYPING.match(path)
            if method != "POST" or not found:
                return 404, {"message": "404: Not Found", "code": 0}, {}
            channel = found.group(1)
            if channel in self.unknown:
                self.refused.append((404, body))
                return 404, {"message": "Unknown Channel", "code": 10003}, {}
            if channel in self.forbidden:
                self.refused.append((403, body))
                return 403, {"message": "Missing Access", "code": 50001}, {}
            if TYPING.match(path):
                self.typing.append(channel)
                return 204, None, {}
            return self._message(channel, body, files or [])

    def _message(self, channel: str, body: Any, files: list[dict[str, Any]]) -> tuple[int, Any, dict[str, str]]:
        if self.fail_next:
            status = self.fail_next.pop(0)
            self.refused.append((status, body))
            return status, {"message": "failed as told", "code": 0}, {}
        if self.flood_next:
            self.flood_next -= 1
            self.refused.append((429, body))
            return 429, {"message": "You are being rate limited.", "retry_after": self.retry_after, "global": True}, {
                "X-RateLimit-Global": "true", "X-RateLimit-Scope": "global", "Retry-After": str(int(self.retry_after)),
                "Via": "1.1 google"}
        if sum(len(item["data"]) for item in files) > self.upload_limit:
            self.refused.append((413, body))
            return 413, {"message": "Request entity too large", "code": 40005}, {}
        if not isinstance(body, dict) or not isinstance(body.get("content", ""), str) or len(body.get("content", "")) > 2000:
            return 400, {"message": "Invalid Form Body", "code": 50035}, {}
        if not body.get("content") and not files:
            return 400, {"message": "Cannot send an empty message", "code": 50006}, {}
        now = time.monotonic()
        window = [sent for sent in self._buckets.get(channel, []) if now - sent < BUCKET_SECONDS]
        reset_after = (window[0] + BUCKET_SECONDS - now) if window else BUCKET_SECONDS
        if len(window) >= BUCKET_SIZE:
            self.refused.append((429, body))
            return 429, {"message": "You are being rate limited.", "retry_after": round(reset_after, 3),
                         "global": False}, {**self._limits(0, reset_after), "X-RateLimit-Scope": "user",
                                            "Retry-After": str(int(reset_after) + 1), "Via": "1.1 google"}
        window.append(now)
        self._buckets[channel] = window
        sent = {"id": str(1_100_000_000_000_000_000 + next(self._ids)), "channel_id": channel,
                "content": body.get("content", ""), "message_reference": body.get("message_reference"),
                "components": body.get("components") or [],
                "attachments": [{"id": str(index), "filename": item["filename"], "content_type": item["content_type"],
                                 "size": len(item["data"]), "data": item["data"]} for index, item in enumerate(files)]}
        self.messages.append(sent)
        self.sent_at.append(now)
        self._cond.notify_all()
        return 200, _public(sent), self._limits(BUCKET_SIZE - len(window), reset_after)

    def _callback(self, interaction_id: str, token: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if self.interactions.get(interaction_id) != token:
            return 404, {"message": "Unknown interaction", "code": 10062}, {}
        if interaction_id in self.answered:
            return 400, {"message": "Interaction has already been acknowledged.", "code": 40060}, {}
        self.answered[interaction_id] = body
        if isinstance(body, dict) and body.get("type") == 7:
            message_id = self.interaction_messages.get(interaction_id, "")
            self._edit_stored(message_id, body.get("data") or {})
        return 204, None, {}

    def _edit(self, channel: str, message_id: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if not any(sent["id"] == message_id and sent["channel_id"] == channel for sent in self.messages):
            return 404, {"message": "Unknown Message", "code": 10008}, {}
        now = time.monotonic()
        window = [edited for edited in self._edit_buckets.get(channel, []) if now - edited < BUCKET_SECONDS]
        reset_after = (window[0] + BUCKET_SECONDS - now) if window else BUCKET_SECONDS
        if len(window) >= BUCKET_SIZE:
            self.edits_refused += 1
            return 429, {"message": "You are being rate limited.", "retry_after": round(reset_after, 3),
                         "global": False}, {**self._limits(0, reset_after, "fakebucketedits"), "X-RateLimit-Scope": "user"}
        window.append(now)
        self._edit_buckets[channel] = window
        self.edits.append((message_id, body))
        self._edit_stored(message_id, body if isinstance(body, dict) else {})
        self._cond.notify_all()
        return 200, _public(next(sent for sent in self.messages if sent["id"] == message_id)), \
            self._limits(BUCKET_SIZE - len(window), reset_after, "fakebucketedits")

    def _delete(self, channel: str, message_id: str) -> tuple[int, Any, dict[str, str]]:
        found = [sent for sent in self.messages if sent["id"] == message_id and sent["channel_id"] == channel]
        if not found:
            return 404, {"message": "Unknown Message", "code": 10008}, {}
        self.messages.remove(found[0])
        self.deleted.append(message_id)
        return 204, None, {}

    def _reaction(self, method: str, message_id: str, emoji: str) -> tuple[int, Any, dict[str, str]]:
        self.reaction_calls.append((method, message_id, emoji))
        on = self.reactions.setdefault(message_id, [])
        if method == "PUT" and emoji not in on:
            on.append(emoji)
        elif method == "DELETE" and emoji in on:
            on.remove(emoji)
        self._cond.notify_all()
        return 204, None, {}

    # --- the CDN ----------------------------------------------------------------------
    def attachment(self, data: bytes, filename: str, content_type: str, channel_id: str = "1") -> dict[str, Any]:
        """A MESSAGE_CREATE's attachment object for `data`, its URL signed and served here."""
        with self._cond:
            attachment_id = str(1_300_000_000_000_000_000 + next(self._ids))
            signature = hashlib.sha256(data + attachment_id.encode()).hexdigest()
            self.files[attachment_id] = (data, content_type, signature)
        query = f"ex={int(time.time()) + 86400:x}&is={int(time.time()):x}&hm={signature}&"
        return {"id": attachment_id, "filename": filename, "size": len(data), "content_type": content_type,
                "url": f"http://127.0.0.1:{self.server_address[1]}/attachments/{channel_id}/{attachment_id}/{filename}"
                       f"?{query}",
                "proxy_url": f"http://127.0.0.1:{self.server_address[1]}/attachments/{channel_id}/{attachment_id}/"
                             f"{filename}?{query}"}

    def download(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes, str]:
        found = CDN.match(path)
        with self._cond:
            held = self.files.get(found.group(2)) if found else None
            if held is None or query.get("hm") != [held[2]]:
                return 404, b"This content is no longer available.", "text/plain"
            self.downloads.append(found.group(2))  # type: ignore[union-attr]  # held implies found
            return 200, held[0], held[1]

    def _edit_stored(self, message_id: str, fields: dict[str, Any]) -> None:
        for sent in self.messages:
            if sent["id"] == message_id:
                sent.update({key: fields[key] for key in ("content", "components") if key in fields})

    def interaction(self, message_id: str, custom_id: str, user_id: str, channel_id: str) -> dict[str, Any]:
        """An INTERACTION_CREATE's `d` for a tap on a button of `message_id` (registered:
        its callback is accepted once, as Discord's)."""
        with self._cond:
            interaction_id = str(1_200_000_000_000_000_000 + next(self._ids))
            token = f"itoken-{interaction_id}"
            self.interactions[interaction_id], self.interaction_messages[interaction_id] = token, message_id
        return {"id": interaction_id, "application_id": BOT_USER_ID, "type": 3, "token": token, "version": 1,
                "channel_id": channel_id, "user": {"id": user_id, "username": "ana", "global_name": "Ana"},
                "message": {"id": message_id, "channel_id": channel_id},
                "data": {"custom_id": custom_id, "component_type": 2}}

    @staticmethod
    def _limits(remaining: int, reset_after: float, bucket: str = "fakebucketmessages") -> dict[str, str]:
        return {"X-RateLimit-Limit": str(BUCKET_SIZE), "X-RateLimit-Remaining": str(remaining),
                "X-RateLimit-Reset": f"{time.time() + reset_after:.3f}", "X-RateLimit-Reset-After": f"{reset_after:.3f}",
                "X-RateLimit-Bucket": bucket}


def _public(sent: dict[str, Any]) -> dict[str, Any]:
    """A message as the API answers it (its attachments without their bytes)."""
    return {**sent, "attachments": [{k: v for k, v in item.items() if k != "data"} for item in sent["attachments"]]}


class _Handler(TrackedHandler):
    server: DiscordRest

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path, _, query = self.path.partition("?")
        if method == "GET" and path.startswith("/attachments/"):
            time.sleep(self.server.download_delay)
            self._send(*self.server.download(path, parse_qs(query)))
            return
        try:
            body, files = self._body(raw)
            status, answer, headers = self.server.answer(method, path, {k.lower(): v for k, v in self.headers.items()},
                                                         body, files)
        except ValueError:
            status, answer, headers = 400, {"message": "400: Bad Request", "code": 50109}, {}
        self._send(status, json.dumps(answer).encode() if answer is not None else b"", "application/json", headers)

    def _body(self, raw: bytes) -> tuple[Any, list[dict[str, Any]]]:
        """JSON, or multipart/form-data: `payload_json` and the `files[n]` parts."""
        kind = self.headers.get("Content-Type") or ""
        if not kind.startswith("multipart/form-data"):
            return (json.loads(raw) if raw else None), []
        form = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            b"Content-Type: " + kind.encode() + b"\r\n\r\n" + raw)
        if not form.is_multipart():
            raise ValueError("a multipart body without parts")
        body, files = None, []
        for part in form.iter_parts():
            name = part.get_param("name", header="content-disposition")
            data = part.get_payload(decode=True) or b""
            if name == "payload_json":
                body = json.loads(data)
            elif isinstance(name, str) and re.fullmatch(r"files\[\d+\]", name):
                files.append({"field": name, "filename": part.get_filename() or "", "data": data,
                              "content_type": part.get_content_type()})
        return body, files

    def _send(self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {**(headers or {}), "Content-Type": content_type, "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


class DiscordGateway:
    """The Gateway, in a thread of its own (its own event loop)."""

    def __init__(self, token: str, heartbeat_ms: int = 1000) -> None:
        self.token, self.heartbeat_ms = token, heartbeat_ms
        self.identifies = 0
        self.resumes: list[tuple[str, int | None]] = []  # (session id, seq) asked
        self.heartbeats = 0
        self.connections = self.most_open = self.open = 0
        self.session_id = ""
        self.log: list[dict[str, Any]] = []  # the session's dispatches, by seq - 1
        self.ack_heartbeats = True
        self._socket: ServerConnection | None = None
        self._sessions: dict[int, str] = {}  # id(socket) → the session it identified or resumed
        self._ready, self._stopped = threading.Event(), None  # type: ignore[var-annotated]
        self._loop: asyncio.AbstractEventLoop | None = None
        self.url = ""
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> DiscordGateway:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stopped is not None
        self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(10)

    async def _main(self) -> None:
        self._loop, self._stopped = asyncio.get_running_loop(), asyncio.Event()
        async with serve(self._connection, "127.0.0.1", 0) as server:
            self.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self._ready.set()
            await self._stopped.wait()

    def _run(self, coroutine: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    # --- the test's side --------------------------------------------------------------
    def dispatch(self, event: str, data: dict[str, Any]) -> int:
        """Send a dispatch in the session (kept for a RESUME if no client is connected)."""
        return int(self._run(self._dispatch(event, data)))

    def dispatch_many(self, event: str, items: list[dict[str, Any]]) -> None:
        """Send dispatches one after the other in one call into the Gateway's loop (a
        benchmark's burst: `dispatch` waits for the loop once per event)."""

        async def every() -> None:
            for data in items:
                await self._dispatch(event, data)

        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(every(), self._loop).result(60)

    def drop(self) -> None:
        """The socket cut without a close frame, as a network failure does."""
        self._run(self._drop())

    def invalidate(self) -> None:
        """INVALID_SESSION (d: false) to the connected client; the session is forgotten."""
        self._run(self._invalidate())

    def connected(self) -> bool:
        return self._socket is not None

    # --- the server's side ------------------------------------------------------------
    async def _dispatch(self, event: str, data: dict[str, Any]) -> int:
        frame = {"op": 0, "t": event, "s": len(self.log) + 1, "d": data}
        self.log.append(frame)
        if self._socket is not None:
            try:
                await self._socket.send(json.dumps(frame))
            except ConnectionClosed:  # a client killed a moment ago: the frame waits in the log for its RESUME
                pass
        return int(frame["s"])

    async def _drop(self) -> None:
        if self._socket is not None:
            self._socket.transport.abort()
            self._socket = None

    async def _invalidate(self) -> None:
        self.session_id, self.log = "", []
        if self._socket is not None:
            try:
                await self._socket.send(json.dumps({"op": 9, "d": False}))
            except ConnectionClosed:
                pass  # the client left already: its RESUME is refused instead

    async def _connection(self, socket: ServerConnection) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            await socket.send(json.dumps({"op": 10, "d": {"heartbeat_interval": self.heartbeat_ms}}))
            async for frame in socket:
                await self._received(socket, json.loads(frame))
        except Exception:  # noqa: BLE001 - a client gone mid-frame is normal here
            pass
        finally:
            self.open -= 1
            if socket.close_code in (1000, 1001) and self._sessions.pop(id(socket), None) == self.session_id:
                self.session_id = ""  # Discord ends a session its client closed with 1000 or 1001
            if self._socket is socket:
                self._socket = None

    async def _received(self, socket: ServerConnection, message: dict[str, Any]) -> None:
        op, data = message.get("op"), message.get("d")
        if op == 1:
            self.heartbeats += 1
            if self.ack_heartbeats:
                await socket.send(json.dumps({"op": 11}))
        elif op in (2, 6) and data.get("token") != self.token:
            await socket.close(4004, "Authentication failed.")
        elif op == 2:
            self.identifies += 1
            self.session_id, self.log, self._socket = uuid.uuid4().hex, [], socket
            self._sessions[id(socket)] = self.session_id
            await self._dispatch("READY", {"v": 10, "session_id": self.session_id, "resume_gateway_url": self.url,
                                           "user": {"id": BOT_USER_ID, "username": "agentbot", "bot": True},
                                           "guilds": [], "application": {"id": BOT_USER_ID}})
        elif op == 6:
            self.resumes.append((data.get("session_id"), data.get("seq")))
            if not self.session_id or data.get("session_id") != self.session_id:
                await socket.send(json.dumps({"op": 9, "d": False}))
                return
            self._socket, self._sessions[id(socket)] = socket, self.session_id
            for frame in self.log[int(data.get("seq") or 0):]:
                await socket.send(json.dumps(frame))
            await socket.send(json.dumps({"op": 0, "t": "RESUMED", "s": len(self.log), "d": {}}))


def message(message_id: str, channel_id: str, text: str, *, author: str = "300000000000000001",
            guild_id: str = "", mentions: tuple[str, ...] = (),
            attachments: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    """A MESSAGE_CREATE's `d`, as Discord sends it."""
    data: dict[str, Any] = {
        "id": message_id, "channel_id": channel_id, "content": text, "type": 0, "tts": False,
        "timestamp": "2026-12-06T10:00:00.000000+00:00", "edited_timestamp": None, "attachments": list(attachments),
        "embeds": [],
        "author": {"id": author, "username": "ana", "global_name": "Ana", "bot": False},
        "mentions": [{"id": user, "username": "agentbot", "bot": True} for user in mentions]}
    if guild_id:
        data["guild_id"] = guild_id
    return data
