"""A local fake of Slack's Web API, speaking real HTTP as slack-sdk's AsyncWebClient
expects it, and Slack's side of the Events API and of interactivity (signed requests).

    with FakeSlackAPI(tokens=["xoxb-test"]) as fake:
        ...                                  # the worker sends through {fake.url}/api/
        [call] = fake.wait_for("chat.postMessage")
        assert call.body["thread_ts"] == ts

What it answers (POST /api/<method>, `Authorization: Bearer <token>`; the body JSON or
form-encoded, parameters in the query string too), as the Web API documents it: HTTP
200 with {"ok": true, …} or {"ok": false, "error": "<code>"}; every answer carries
`X-OAuth-Scopes` (the token's scopes):

- auth.test: {"ok", "url", "team", "user", "team_id", "user_id", "bot_id"};
- chat.postMessage: {"ok", "channel", "ts", "message"} (a new ts per message);
- chat.update: {"ok", "channel", "ts", "text"};
- chat.postEphemeral: {"ok", "message_ts"};
- chat.startStream (`channel`, `thread_ts`, `markdown_text`): {"ok", "channel", "ts"}, a
  message in streaming state; chat.appendStream (`ts`, `markdown_text`) appends to it and
  chat.stopStream (`ts`, optional `markdown_text`, appended) ends it, both {"ok",
  "channel", "ts"} or `message_not_in_streaming_state`; chat.update refuses a message
  still streaming (`cant_update_message`); chat.delete: {"ok", "channel", "ts"} or
  `message_not_found` (`deleted()`: the ts deleted);
- assistant.threads.setStatus: {"ok": true} (`missing_scope` without assistant:write);
- files.getUploadURLExternal: {"ok", "upload_url", "file_id"}; the bytes POSTed to that
  URL (answered "OK - <length>", text/plain, as files.slack.com does); then
  files.completeUploadExternal: {"ok", "files": [{"id", "title"}]}, the file shared
  (`shared_files()`: each with its bytes, channel, thread and comment).

Tests script the next answers of a method (`fail_next("chat.postMessage",
error="not_in_channel")`, `status=429, retry_after=3`, `status=500`), drop the
connection, hold calls (the request is in, no answer until released) or delay them,
and revoke a token (`token_revoked` from then on). With `channel_interval` (seconds) it
keeps chat.postMessage's documented limit, about one message a second into one channel:
a post sooner is answered HTTP 429 `ratelimited` with Retry-After (`floods` counts them).

Standard library only (http.server), like the other fakes here.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.server import FakeServer, TrackedHandler
from tests.fakes.slack_events import (  # noqa: F401 (Slack's side: the tests' requests)
    BOT_ID,
    BOT_USER,
    TEAM,
    _serial,
    block_actions,
    deleted_event,
    edited_event,
    envelope,
    message_event,
    new_ts,
    post,
    reaction_event,
    sign,
)

SCOPES = ("app_mentions:read,channels:history,chat:write,groups:history,im:history,mpim:history,"
          "reactions:read,reactions:write")
# Emoji names reactions.add knows (Slack's standard set is larger; any other is invalid_name).
EMOJI_NAMES = frozenset({"eyes", "white_check_mark", "+1", "-1", "thumbsup", "thumbsdown", "heart", "tada", "fire",
                         "ok_hand", "pray", "joy"})
MAX_TEXT = 40000


@dataclass(frozen=True)
class Call:
    method: str  # "chat.postMessage", …
    token: str
    body: dict
    at: float  # time.monotonic()
    wall: float  # time.time()


@dataclass
class _Rule:
    method: str
    times: int
    status: int = 200
    error: str = ""
    retry_after: float | None = None
    drop: bool = False  # close the connection without an answer


@dataclass
class Hold:
    fake: FakeSlackAPI
    method: str
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
                raise AssertionError(f"expected {count} held {self.method} call(s) within {timeout}s")
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
    revoked: set = field(default_factory=set)
    messages: dict = field(default_factory=dict)  # (channel, ts) -> text, as last posted or updated
    streaming: set = field(default_factory=set)  # (channel, ts) of messages still streaming
    deleted: list = field(default_factory=list)  # (channel, ts) deleted
    uploads: dict = field(default_factory=dict)  # file id -> {"name", "length", "data"}
    shared: list = field(default_factory=list)  # files shared by files.completeUploadExternal
    reactions: dict = field(default_factory=dict)  # (channel, ts) -> the app's reaction names on it


class FakeSlackAPI(FakeServer):

    def __init__(self, port: int = 0, *, tokens=(), scopes: str = SCOPES, channel_interval: float = 0.0):
        super().__init__(("127.0.0.1", port), _Handler)
        self._state = _State()
        self.tokens = set(tokens)  # empty: any token is accepted
        self.scopes = scopes
        self.channel_interval = channel_interval  # 0: no limit kept
        self.floods = 0  # posts answered 429 for the limit
        self.flood_times: list[float] = []  # when (time.monotonic())
        self._last_post: dict[str, float] = {}  # channel -> when its last post was accepted

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/api/"

    # --- recording ---------------------------------------------------------------------

    def calls(self, method: str | None = None) -> list[Call]:
        with self._cond:
            return [c for c in self._state.calls if method is None or c.method == method]

    def wait_for(self, method: str, count: int = 1, timeout: float = 5.0) -> list[Call]:
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.calls(method)) >= count, timeout):
                raise AssertionError(f"expected {count} {method} call(s) within {timeout}s, got "
                                     f"{len(self.calls(method))}; recorded: {[c.method for c in self._state.calls]}")
            return self.calls(method)

    def texts(self, channel: str | None = None) -> list[str]:
        """The texts posted (chat.postMessage), in order."""
        return [c.body.get("text", "") for c in self.calls("chat.postMessage")
                if channel is None or c.body.get("channel") == channel]

    def shared_files(self) -> list[dict]:
        with self._cond:
            return list(self._state.shared)

    def message(self, channel: str, ts: str) -> str | None:
        with self._cond:
            return self._state.messages.get((channel, ts))

    def messages(self, channel: str) -> dict:
        """ts -> text of the messages in `channel` now (posted, streamed, not deleted)."""
        with self._cond:
            return {ts: text for (where, ts), text in self._state.messages.items() if where == channel}

    def is_streaming(self, channel: str, ts: str) -> bool:
        with self._cond:
            return (channel, ts) in self._state.streaming

    def deleted(self) -> list:
        with self._cond:
            return [ts for _, ts in self._state.deleted]

    # --- scripted behaviour ----------------------------------------------------------------

    def fail_next(self, method: str = "chat.postMessage", *, error: str = "", status: int = 200,
                  retry_after: float | None = None) -> None:
        """The next call of `method` answers `error` (HTTP `status`; a 429 with Retry-After,
        a 5xx with an HTML page as Slack's edge sends)."""
        with self._cond:
            self._state.rules.append(_Rule(method, 1, status, error or ("ratelimited" if status == 429 else ""),
                                           retry_after))

    def drop_connection_next(self, method: str = "chat.postMessage", *, times: int = 1) -> None:
        with self._cond:
            self._state.rules.append(_Rule(method, times, drop=True))

    def hold(self, method: str = "chat.postMessage") -> Hold:
        hold = Hold(self, method)
        with self._cond:
            self._holds.append(hold)
        return hold

    def delay(self, method: str, seconds: float) -> None:
        with self._cond:
            self._state.delays[method] = seconds

    def revoke(self, token: str) -> None:
        with self._cond:
            self._state.revoked.add(token)

    # --- serving -----------------------------------------------------------------------

    def _serve(self, method: str, token: str, body: dict) -> tuple[int, dict, dict] | None:
        with self._cond:
            self._state.calls.append(Call(method, token, body, time.monotonic(), time.time()))
            self._cond.notify_all()
        if not token:
            return 200, {"ok": False, "error": "not_authed"}, {}
        if token in self._state.revoked:
            return 200, {"ok": False, "error": "token_revoked"}, {}
        if self.tokens and token not in self.tokens:
            return 200, {"ok": False, "error": "invalid_auth"}, {}
        self._wait_while_held(method)
        with self._cond:
            seconds = self._state.delays.get(method, 0)
        if seconds:
            self._stopping.wait(seconds)
        rule = self._take_rule(method)
        if rule is not None:
            if rule.drop:
                return None
            headers = {"Retry-After": f"{rule.retry_after:g}"} if rule.retry_after is not None else {}
            return rule.status, {"ok": False, "error": rule.error}, headers
        if method == "chat.postMessage" and self.channel_interval and self._too_soon(str(body.get("channel"))):
            return 429, {"ok": False, "error": "ratelimited"}, {"Retry-After": "1"}
        return 200, self._answer(method, body), {}

    def _too_soon(self, channel: str) -> bool:
        """A post into `channel` within `channel_interval` of its last (a tenth of slack, as
        Slack allows short bursts); otherwise the post is counted."""
        now = time.monotonic()
        with self._cond:
            if now - self._last_post.get(channel, -self.channel_interval) < self.channel_interval * 0.9:
                self.floods += 1
                self.flood_times.append(now)
                return True
            self._last_post[channel] = now
        return False

    def _answer(self, method: str, body: dict) -> dict:
        if method == "auth.test":
            return {"ok": True, "url": "https://agentloop.slack.com/", "team": "agentloop", "user": "agentbot",
                    "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install": False}
        if method == "assistant.threads.setStatus":
            if "assistant:write" not in self.scopes.split(","):
                return {"ok": False, "error": "missing_scope", "needed": "assistant:write", "provided": self.scopes}
            return {"ok": True} if body.get("channel_id") and body.get("thread_ts") else \
                {"ok": False, "error": "invalid_arguments"}
        if method.startswith("files."):
            return self._files(method, body)
        if method in ("reactions.add", "reactions.remove"):
            return self._reaction(method, body)
        if method == "chat.postEphemeral":
            ok = body.get("channel") and body.get("user") and body.get("text")
            return {"ok": True, "message_ts": new_ts()} if ok else {"ok": False, "error": "invalid_arguments"}
        if method in ("chat.startStream", "chat.appendStream", "chat.stopStream", "chat.delete"):
            return self._stream(method, body)
        if method not in ("chat.postMessage", "chat.update"):
            return {"ok": False, "error": "unknown_method"}
        text, channel = body.get("text"), body.get("channel")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        if not text and not body.get("blocks"):
            return {"ok": False, "error": "no_text"}
        if len(str(text or "")) > MAX_TEXT:
            return {"ok": False, "error": "msg_too_long"}
        if method == "chat.update":
            with self._cond:
                if (channel, body.get("ts")) not in self._state.messages:
                    return {"ok": False, "error": "message_not_found"}
                if (channel, body.get("ts")) in self._state.streaming:
                    return {"ok": False, "error": "cant_update_message"}
                self._state.messages[(channel, body["ts"])] = text
            return {"ok": True, "channel": channel, "ts": body["ts"], "text": text}
        ts = new_ts()
        with self._cond:
            self._state.messages[(channel, ts)] = text
        message = {"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "text": text, "ts": ts,
                   **({"thread_ts": body["thread_ts"]} if body.get("thread_ts") else {})}
        return {"ok": True, "channel": channel, "ts": ts, "message": message}

    def _stream(self, method: str, body: dict) -> dict:
        channel, ts, text = body.get("channel"), body.get("ts"), body.get("markdown_text") or ""
        with self._cond:
            if not channel:
                return {"ok": False, "error": "channel_not_found"}
            if method == "chat.startStream":
                if not body.get("thread_ts"):
                    return {"ok": False, "error": "invalid_arguments"}
                ts = new_ts()
                self._state.messages[(channel, ts)] = text
                self._state.streaming.add((channel, ts))
                return {"ok": True, "channel": channel, "ts": ts}
            if (channel, ts) not in self._state.messages:
                return {"ok": False, "error": "message_not_found"}
            if method == "chat.delete":
                del self._state.messages[(channel, ts)]
                self._state.streaming.discard((channel, ts))
                self._state.deleted.append((channel, ts))
                return {"ok": True, "channel": channel, "ts": ts}
            if (channel, ts) not in self._state.streaming:
                return {"ok": False, "error": "message_not_in_streaming_state"}
            if method == "chat.appendStream" and not text:
                return {"ok": False, "error": "invalid_arguments"}
            self._state.messages[(channel, ts)] += text
            if method == "chat.stopStream":
                self._state.streaming.discard((channel, ts))
            return {"ok": True, "channel": channel, "ts": ts}

    def _reaction(self, method: str, body: dict) -> dict:
        """reactions.add / reactions.remove as Slack answers them: reactions:write needed,
        `name` without colons, already_reacted / no_reaction for the app's own."""
        if "reactions:write" not in self.scopes.split(","):
            return {"ok": False, "error": "missing_scope", "needed": "reactions:write", "provided": self.scopes}
        channel, ts, name = body.get("channel"), body.get("timestamp"), str(body.get("name") or "")
        if not channel or not ts:
            return {"ok": False, "error": "no_item_specified"}
        if name.split("::")[0] not in EMOJI_NAMES:
            return {"ok": False, "error": "invalid_name"}
        with self._cond:
            names = self._state.reactions.setdefault((channel, ts), set())
            if method == "reactions.add":
                if name in names:
                    return {"ok": False, "error": "already_reacted"}
                names.add(name)
            else:
                if name not in names:
                    return {"ok": False, "error": "no_reaction"}
                names.discard(name)
        return {"ok": True}

    def reactions_on(self, channel: str, ts: str) -> set:
        """The app's reactions on a message now."""
        with self._cond:
            return set(self._state.reactions.get((channel, ts), ()))

    def _files(self, method: str, body: dict) -> dict:
        with self._cond:
            if method == "files.getUploadURLExternal":
                if not body.get("filename") or not str(body.get("length", "")).isdigit():
                    return {"ok": False, "error": "invalid_arguments"}
                file_id = f"F{next(_serial):010d}"
                self._state.uploads[file_id] = {"name": body["filename"], "length": int(body["length"]), "data": None}
                return {"ok": True, "upload_url": f"{self.url.removesuffix('/api/')}/upload/v1/{file_id}",
                        "file_id": file_id}
            if method != "files.completeUploadExternal":
                return {"ok": False, "error": "unknown_method"}
            files = json.loads(body.get("files") or "[]")
            found = [self._state.uploads.get(f.get("id")) for f in files]
            if not files or any(f is None or f["data"] is None for f in found):
                return {"ok": False, "error": "file_not_found"}
            for item, upload in zip(files, found):
                self._state.shared.append({"id": item["id"], "title": item.get("title"), "data": upload["data"],
                                           "channel": body.get("channel_id"), "thread_ts": body.get("thread_ts"),
                                           "comment": body.get("initial_comment")})
            return {"ok": True, "files": [{"id": f["id"], "title": f.get("title")} for f in files]}

    def _receive_upload(self, file_id: str, data: bytes) -> tuple[int, str]:
        with self._cond:
            self._state.calls.append(Call("upload", "", {"file_id": file_id, "length": len(data)}, time.monotonic(),
                                          time.time()))
            self._cond.notify_all()
            upload = self._state.uploads.get(file_id)
            if upload is None or upload["length"] != len(data):
                return 404, "file_not_found"
            upload["data"] = data
        return 200, f"OK - {len(data)}"

    def _wait_while_held(self, method):
        with self._cond:
            hold = next((h for h in self._holds if h.method == method), None)
            if hold is None:
                return
            hold.held += 1
            self._cond.notify_all()
            self._cond.wait_for(lambda: hold.released or self._stopping.is_set())
            hold.held -= 1

    def _take_rule(self, method):
        with self._cond:
            for rule in self._state.rules:
                if rule.method == method:
                    rule.times -= 1
                    if rule.times <= 0:
                        self._state.rules.remove(rule)
                    return rule
        return None


def _body(content_type: str, raw: bytes, query: str) -> dict:
    values: dict = dict(parse_qsl(query))
    if raw:
        if "json" in content_type:
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            values.update(data if isinstance(data, dict) else {})
        else:
            values.update(parse_qsl(raw.decode("utf-8", "replace")))
    return values


class _Handler(TrackedHandler):
    server: FakeSlackAPI

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        parts = urlsplit(self.path)
        method = parts.path.rsplit("/", 1)[-1]
        if parts.path.startswith("/upload/"):
            status, text = self.server._receive_upload(method, raw)
            self._write(status, text.encode(), "text/plain", {})
            return
        authorization = self.headers.get("Authorization", "")
        token = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        outcome = self.server._serve(method, token, _body(self.headers.get("Content-Type", ""), raw, parts.query))
        if outcome is None:
            self.close_connection = True
            return
        status, payload, headers = outcome
        if status >= 500:
            data, kind = b"<html><body>Internal Server Error</body></html>", "text/html"
        else:
            data, kind = json.dumps(payload).encode(), "application/json; charset=utf-8"
        self._write(status, data, kind, headers)

    def _write(self, status, data, kind, headers):
        try:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("X-OAuth-Scopes", self.server.scopes)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            self.close_connection = True


# --- Slack's side: Events API and interactivity requests ------------------------------------
