"""Sending to Discord: its REST API, `Authorization: Bot <token>`, one overall deadline
per call (Transport.exchange). A reply is `POST /channels/{id}/messages` with
`message_reference` to the user's message (threaded; `fail_if_not_exists: false`, so a
deleted original does not lose the reply); "typing…" is `POST /channels/{id}/typing`
(it shows for 10 s, or until our message).

Files: `POST /channels/{id}/messages` as multipart/form-data, the message's JSON in
`payload_json` and each file a `files[n]` part (named in `attachments`); one file a
message (`max_album = 1`: Discord takes 25 MiB a request, and the ledger groups images
without weighing them); a file over 25 MiB is refused before anything leaves (permanent,
the chat not marked). A streamed reply is one preview message (`POST`, threaded like
the reply), edited as it grows (`PATCH /channels/{id}/messages/{id}`, at most every
PREVIEW_INTERVAL s: edits have a bucket of their own), edited into the final by the
ledger, deleted when stale (`DELETE`, an Unknown Message counting as gone). Status
reactions: `PUT`/`DELETE /channels/{id}/messages/{id}/reactions/{emoji}/@me`.

The rate limits, as Discord documents them: every answer names its bucket
(`X-RateLimit-Bucket`) and what is left in it (`X-RateLimit-Remaining`,
`X-RateLimit-Reset-After`); a bucket left empty is waited out before the next send into
it (a flood, nothing sent: the ledger resends plain after the wait). A 429 carries
`retry_after` (seconds) in its JSON and `global: true` when the bot's global limit (50
requests a second) was hit rather than the route's: a flood either way, the whole bot
paused for that long (the ledger's pause is per bot). The pacing budget (delivery.pacing)
keeps the sends below both across processes, so 429s stay the exception.

| answer | outcome |
|---|---|
| 2xx | delivered (the message id kept) |
| 429 (`retry_after`, `global`) | flood after `retry_after` |
| 401 (the token refused) | channel blocked: replies wait for a new token, no attempt spent |
| 403 (Missing Access, 50001/50013), 404 (Unknown Channel 10003) | permanent: the chat cannot be reached |
| 404 Unknown Message (10008), Unknown Emoji (10014) | permanent, the chat not marked (a delete: done) |
| other 4xx (a body refused: 50035; 413 a file too large: 40005) | permanent, the chat not marked |
| 5xx, 408 | temporary |
| no answer after the request went out | ambiguous |
| the request never went out | not sent |

Why httpx and not discord.py's HTTPClient: its `request` retries 5xx answers and 429s
itself (sleeping inside the send), so a reply Discord may have posted before a 502 is
posted again unlabelled — behind the ledger, whose outcomes decide every resend — and its
address is the process-wide `Route.BASE`, not a channel's setting.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx

from agentloop.core.caches import BoundedCache
from conversations.platforms.discord.buttons import components
from delivery import attachments, chunks
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.previews import CURSOR, EditedPreview, Preview
from delivery.retry_after import clamp_retry_after
from delivery.transports import LoopClients, SendResult, Target, Transport

if TYPE_CHECKING:  # for annotations only
    from delivery.attachments import OutboundFile

DEADLINE = 10.0  # one call, as a whole
UPLOAD_DEADLINE = 60.0  # one message with a file (up to 25 MiB), as a whole
MAX_UNITS = 2000  # a message's content (characters; UTF-16 units never undercount them)
MAX_UPLOAD_BYTES = 25 * 1024 * 1024  # Discord's default limit on one request's files
UNREACHABLE_STATUSES = (403, 404)  # Missing Access / Missing Permissions, Unknown Channel
UNKNOWN_MESSAGE, UNKNOWN_EMOJI = 10008, 10014
PREVIEW_INTERVAL = 1.2  # seconds between two preview writes: about 5 edits per 5 s into a channel

_clients = LoopClients()  # one httpx client per event loop (delivery.transports)
# Buckets Discord said are empty, by (token's channel, bucket, chat): until when (monotonic).
_empty: BoundedCache[tuple[int, str], float] = BoundedCache(maxsize=10_000, max_age=600)
_routes: BoundedCache[tuple[int, str], str] = BoundedCache(maxsize=10_000, max_age=3600)  # route key → bucket


def client() -> httpx.AsyncClient:
    return _clients.get()


async def close_clients() -> None:
    await _clients.close()


class DiscordAnswer(Exception):
    """A typing call refused (raised: the typing loop logs it once per fault)."""

    def __init__(self, result: SendResult) -> None:
        super().__init__(result.error)
        self.retry_after = result.retry_after if result.outcome == Outcome.FLOOD else None


class DiscordTransport(Transport):
    supports_typing = True
    typing_refresh = 8.0  # Discord shows it for 10 s: refreshed before it lapses
    max_units = MAX_UNITS
    max_album = 1  # one file a message: see the module's docstring
    caption_units = MAX_UNITS
    status_reactions = ("👀", "✅")

    def base(self) -> str:
        return str(self.channel.setting("api_base")).rstrip("/")

    def message_body(self, target: Target, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {"content": text, "allowed_mentions": {"parse": []}}
        if target.buttons:
            body["components"] = components(target.buttons)
        if target.reply_target:
            body["message_reference"] = {"message_id": target.reply_target, "fail_if_not_exists": False}
        return body

    async def send_text(self, target: Target, text: str) -> SendResult:
        answered = await self.call("POST", f"/channels/{target.chat_id}/messages", self.message_body(target, text))
        return self.sent(answered)

    def sent(self, answered: Any) -> SendResult:
        """A message's POST answered: delivered with its id, or the failure."""
        if isinstance(answered, SendResult):
            return answered
        message_id = answered.get("id") if isinstance(answered, dict) else None
        if not message_id:
            return self.failed(Outcome.AMBIGUOUS, "Discord answered 2xx without a message id: it may have been sent")
        return SendResult.delivered(str(message_id))

    async def send_files(self, target: Target, files: list[OutboundFile], caption: str) -> SendResult:
        """The file as a message's attachment (multipart: `payload_json` and `files[0]`),
        `caption` its content, threaded like a reply."""
        item = files[0]
        if item.size > MAX_UPLOAD_BYTES:
            return self.too_large(item.name, item.size)
        try:
            data = await asyncio.to_thread(attachments.read, item.file)
        except OSError as exc:
            return self.failed(Outcome.TEMPORARY, f"the file could not be read from storage: {type(exc).__name__}")
        if len(data) > MAX_UPLOAD_BYTES:
            return self.too_large(item.name, len(data))
        body = {**self.message_body(target, caption), "attachments": [{"id": 0, "filename": item.name}]}
        upload = [("files[0]", (item.name, data, item.type or "application/octet-stream"))]
        return self.sent(await self.call("POST", f"/channels/{target.chat_id}/messages", body, upload))

    def too_large(self, name: str, size: int) -> SendResult:
        return self.failed(Outcome.PERMANENT, f"{name} is {size / 1048576:.1f} MiB, over the 25 MiB Discord takes "
                                              "in one message (not sent)", chat_unreachable=False)

    # --- previews: one message, edited as the reply grows (delivery.previews) --------------
    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        """One preview message, threaded like the reply, edited as it grows
        (`message_id`: one an earlier run of the turn left in the chat, reused)."""
        return MessagePreview(self, target, message_id)

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        """PATCH of a message of ours: its content replaced, the question's buttons put
        under it (a preview's final may be one) or none."""
        body = {"content": text[:MAX_UNITS], "components": components(target.buttons) if target.buttons else [],
                "allowed_mentions": {"parse": []}}
        answered = await self.call("PATCH", f"/channels/{target.chat_id}/messages/{message_id}", body)
        return answered if isinstance(answered, SendResult) else SendResult.delivered(message_id)

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        """DELETE of a message of ours; delivered once it is gone (also when it was)."""
        answered = await self.call("DELETE", f"/channels/{target.chat_id}/messages/{message_id}", None)
        if isinstance(answered, SendResult) and not gone(answered, UNKNOWN_MESSAGE):
            return answered
        return SendResult.delivered(message_id)

    # --- status reactions (conversations/worker/reactions.py) ---------------------------
    async def set_reaction(self, target: Target, message_id: str, emoji: str, previous: str = "") -> None:
        """Ours removed (`DELETE …/reactions/{emoji}/@me`), the new one added (`PUT`):
        one already gone, or the message gone, is what was wanted."""
        path = f"/channels/{target.chat_id}/messages/{message_id}/reactions"
        if previous:
            answered = await self.call("DELETE", f"{path}/{quote(previous, safe='')}/@me", None)
            if isinstance(answered, SendResult) and not gone(answered, UNKNOWN_MESSAGE, UNKNOWN_EMOJI):
                raise DiscordAnswer(answered)
        if emoji:
            answered = await self.call("PUT", f"{path}/{quote(emoji, safe='')}/@me", None)
            if isinstance(answered, SendResult):
                raise DiscordAnswer(answered)

    async def send_typing(self, target: Target) -> None:
        answered = await self.call("POST", f"/channels/{target.chat_id}/typing", None)
        if isinstance(answered, SendResult):
            raise DiscordAnswer(answered)

    async def call(self, method: str, path: str, body: dict[str, Any] | None,
                   files: list[tuple[str, tuple[str, bytes, str]]] | None = None) -> Any:
        """One REST call: its JSON answer (None for 204), or the failed SendResult. With
        `files`: multipart/form-data, the body as `payload_json`."""
        if not self.channel.setting("bot_token"):
            return self.failed(Outcome.CHANNEL_BLOCKED, "the channel has no bot_token")
        route = f"{method} {path}"
        waiting = self.bucket_wait(route)
        if waiting > 0:
            return self.failed(Outcome.FLOOD, f"the rate-limit bucket of {route} is empty for {waiting:.2f} s "
                                              "(not sent)", waiting)
        url = self.base() + path
        headers = {"Authorization": f"Bot {self.channel.setting('bot_token')}"}
        limit = UPLOAD_DEADLINE if files else DEADLINE
        content: dict[str, Any] = {"data": {"payload_json": json.dumps(body)}, "files": files} if files else \
            {"json": body}
        exchanged = await self.exchange(
            lambda extensions: client().request(method, url, headers=headers, timeout=limit, extensions=extensions,
                                                **content),
            urlsplit(url).netloc, limit)
        if isinstance(exchanged, SendResult):
            return exchanged
        self.note_bucket(route, exchanged)
        answer = _json(exchanged)
        if exchanged.status_code < 300:
            return answer
        return self.outcome(exchanged.status_code, answer, exchanged.headers)

    def outcome(self, status: int, answer: Any, headers: httpx.Headers) -> SendResult:
        """A refusal's outcome (the module's table)."""
        answer = answer if isinstance(answer, dict) else {}
        said = f"HTTP {status}" + (f", code {answer['code']}" if answer.get("code") is not None else "") + \
            (f": {answer.get('message')}" if answer.get("message") else "")
        if status == 429:
            wait = clamp_retry_after(answer.get("retry_after") or headers.get("retry-after"))
            scope = "global" if answer.get("global") or headers.get("x-ratelimit-global") else \
                str(headers.get("x-ratelimit-scope") or "route")
            return self.failed(Outcome.FLOOD, f"rate limited ({scope}), retried in {wait:g} s: {said}", wait)
        if status == 401:
            return self.failed(Outcome.CHANNEL_BLOCKED, f"the bot token was refused (replace it): {said}")
        if answer.get("code") in (UNKNOWN_MESSAGE, UNKNOWN_EMOJI):
            return self.failed(Outcome.PERMANENT, f"gone: {said}", chat_unreachable=False)
        if status in UNREACHABLE_STATUSES:
            return self.failed(Outcome.PERMANENT, f"the channel cannot be reached: {said}")
        if status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, said)
        return self.failed(Outcome.PERMANENT, f"rejected: {said}", chat_unreachable=False)

    # --- the buckets (X-RateLimit-*) ------------------------------------------------------
    def bucket_wait(self, route: str) -> float:
        bucket = _routes.get((self.channel.pk, _route_key(route)))
        until = _empty.get((self.channel.pk, f"{bucket}:{_major(route)}")) if bucket else None
        return max(0.0, until - time.monotonic()) if until else 0.0

    def note_bucket(self, route: str, response: httpx.Response) -> None:
        bucket = response.headers.get("x-ratelimit-bucket")
        if not bucket:
            return
        _routes.set((self.channel.pk, _route_key(route)), bucket)
        if response.headers.get("x-ratelimit-remaining") == "0" and response.status_code != 429:
            try:
                reset_after = float(response.headers.get("x-ratelimit-reset-after") or 0)
            except ValueError:
                return
            _empty.set((self.channel.pk, f"{bucket}:{_major(route)}"), time.monotonic() + min(reset_after, 60.0))

    def pace(self, chat_id: str) -> Pace | None:
        """The bot's sends across every worker, and the channel's chat interval."""
        return self.paced(f"discord:{self.channel.pk}", str(chat_id), float(self.channel.setting("chat_interval") or 0))


def gone(result: SendResult, *codes: int) -> bool:
    """Whether a refusal says the message (or the reaction) is not there (Discord's code)."""
    return result.outcome == Outcome.PERMANENT and any(f"code {code}:" in result.error for code in codes)


def _route_key(route: str) -> str:
    """A route without its major parameter: `POST /channels/{}/messages`."""
    method, path = route.split(" ", 1)
    parts = path.split("/")
    return f"{method} " + "/".join("{}" if (index == 2 and parts[1] == "channels") or (index > 2 and part.isdigit())
                                   else part for index, part in enumerate(parts))


def _major(route: str) -> str:
    """The route's major parameter (a bucket is per channel id)."""
    parts = route.split(" ", 1)[1].split("/")
    return parts[2] if len(parts) > 2 and parts[1] == "channels" else ""


def _json(response: httpx.Response) -> Any:
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None


class MessagePreview(EditedPreview):
    """A streamed reply's preview: one message (threaded like the reply), then edits."""

    interval = PREVIEW_INTERVAL

    def fit(self, text: str) -> str:
        if chunks.units(text) > MAX_UNITS:  # its first message's worth (the final, chunked, says the rest)
            return chunks.split(text, MAX_UNITS - chunks.units(CURSOR))[0] + CURSOR
        return text
