"""Sending to Matrix: the client-server API of the channel's homeserver, `Authorization:
Bearer <access token>`, one overall deadline per call (Transport.exchange).

A reply is `PUT /rooms/{room}/send/m.room.message/{txnId}`: an `m.text` answering the
person's message (`m.in_reply_to`), inside its thread when it came in one (`m.thread`,
with the reply fallback for clients without threads). The transaction id is the ledger
row's and the chunk's (`Target.key`), the same on every attempt: Synapse answers a send
repeated with a transaction id it has seen from the same user and device with the first
send's event id and posts nothing (it keeps them for 24 h; scoped by device since
MSC3970, so a new access token of the same login is the same device, a new login is not).
A resend after a crash between the send and its record is then no second message.

Previews of a streamed reply: one message, edited (`m.replace`, with `m.new_content`) as
it grows, at most every PREVIEW_INTERVAL s; the ledger edits the final into it; a stale
one is redacted. "typing…" is `PUT /rooms/{room}/typing/{user}` (shown for 10 s,
refreshed every 7; Synapse does not end it at our message, so it lasts up to 10 s more). Status reactions are `m.reaction` annotations (the one replaced is
redacted).

| answer | outcome |
|---|---|
| 200 with an `event_id` | delivered (the event id kept) |
| 429 `M_LIMIT_EXCEEDED` (`retry_after_ms`) | flood after that wait |
| 401 `M_UNKNOWN_TOKEN` / `M_MISSING_TOKEN` | channel blocked: replies wait for a new token |
| 403 `M_FORBIDDEN` (not in the room, no power to post), 404 `M_NOT_FOUND` (unknown room) | permanent: the room cannot be reached |
| other 4xx (`M_TOO_LARGE`, `M_BAD_JSON`) | permanent, the room not marked |
| 5xx, 408 | temporary |
| no answer after the request went out | ambiguous |
| the request never went out | not sent |

Why httpx and not matrix-nio's AsyncClient for sending: nio's `_send` waits out a 429
and retries a timeout itself (inside the send, behind the ledger that decides every
resend), and it cannot tell a request that never left from one that went unanswered.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from agentloop.core.caches import BoundedCache
from delivery import chunks
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.previews import CURSOR, EditedPreview, Preview
from delivery.retry_after import clamp_retry_after
from delivery.transports import LoopClients, SendResult, Target, Transport

DEADLINE = 10.0  # one call, as a whole
MAX_UNITS = 16_000  # a message's body; a whole event is at most 65,536 bytes (JSON, UTF-8)
PREVIEW_INTERVAL = 1.0  # seconds between two preview edits
TYPING_MS = 10_000  # how long one typing notice shows
TOKEN_REFUSED = ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN")
UNREACHABLE = ("M_FORBIDDEN", "M_NOT_FOUND")

_clients = LoopClients()
_users: BoundedCache[int, str] = BoundedCache(maxsize=1000, max_age=3600)  # channel → the token's user id
_reactions: BoundedCache[tuple[int, str, str], str] = BoundedCache(maxsize=10_000, max_age=86_400)


async def close_clients() -> None:
    await _clients.close()


class MatrixAnswer(Exception):
    """A typing or reaction call refused (raised: the caller logs it once per fault)."""

    def __init__(self, result: SendResult) -> None:
        super().__init__(result.error)
        self.retry_after = result.retry_after if result.outcome == Outcome.FLOOD else None


class MatrixTransport(Transport):
    supports_typing = True
    # Shown for TYPING_MS and refreshed before it lapses. Short: Synapse does not end a
    # typing notice when the user's message arrives, so it outlives the reply by up to that.
    typing_refresh = 7.0
    max_units = MAX_UNITS
    status_reactions = ("👀", "✅")

    def base(self) -> str:
        return str(self.channel.setting("homeserver")).rstrip("/") + "/_matrix/client/v3"

    def content(self, target: Target, text: str) -> dict[str, Any]:
        body: dict[str, Any] = {"msgtype": "m.text", "body": text, "m.mentions": {}}
        if target.thread_id:
            body["m.relates_to"] = {"rel_type": "m.thread", "event_id": target.thread_id, "is_falling_back": True,
                                    "m.in_reply_to": {"event_id": target.reply_target or target.thread_id}}
        elif target.reply_target:
            body["m.relates_to"] = {"m.in_reply_to": {"event_id": target.reply_target}}
        return body

    async def send_text(self, target: Target, text: str) -> SendResult:
        return await self.send_event(target.chat_id, "m.room.message", self.content(target, text), target.key)

    async def send_event(self, room: str, event_type: str, content: dict[str, Any], key: str = "") -> SendResult:
        """One event; `key`: its transaction id (a fresh one when none is given)."""
        txn = quote(f"agentloop.{key}" if key else f"agentloop.{uuid.uuid4().hex}", safe="")
        answered = await self.call("PUT", f"/rooms/{quote(room, safe='')}/send/{event_type}/{txn}", content)
        if isinstance(answered, SendResult):
            return answered
        event_id = answered.get("event_id") if isinstance(answered, dict) else None
        if not event_id:
            return self.failed(Outcome.AMBIGUOUS, "the homeserver answered 200 without an event id: it may be sent")
        return SendResult.delivered(str(event_id))

    # --- previews: one message, edited as the reply grows (delivery.previews) ---------------
    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        return MessagePreview(self, target, message_id)

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        """An `m.replace` of a message of ours: its text becomes `text`."""
        body = text[:MAX_UNITS]
        new: dict[str, Any] = {"msgtype": "m.text", "body": body, "m.mentions": {}}
        content = {**new, "body": "* " + body, "m.new_content": new,
                   "m.relates_to": {"rel_type": "m.replace", "event_id": message_id}}
        result = await self.send_event(target.chat_id, "m.room.message", content)
        return SendResult.delivered(message_id) if result.ok else result

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        """A redaction of a message of ours; delivered once it is gone (also when it was)."""
        txn = f"agentloop.{uuid.uuid4().hex}"
        answered = await self.call("PUT", f"/rooms/{quote(target.chat_id, safe='')}/redact/"
                                          f"{quote(message_id, safe='')}/{txn}", {})
        if isinstance(answered, SendResult) and not (answered.outcome == Outcome.PERMANENT
                                                     and "M_NOT_FOUND" in answered.error):
            return answered
        return SendResult.delivered(message_id)

    # --- status reactions and typing ----------------------------------------------------
    async def set_reaction(self, target: Target, message_id: str, emoji: str, previous: str = "") -> None:
        """Ours replaced: the previous annotation redacted (when this process sent it), the
        new one sent."""
        if previous:
            ours = _reactions.get((self.channel.pk, message_id, previous))
            if ours:
                removed = await self.delete_message(target, ours)
                if not removed.ok:
                    raise MatrixAnswer(removed)
        if emoji:
            sent = await self.send_event(target.chat_id, "m.reaction", {"m.relates_to": {
                "rel_type": "m.annotation", "event_id": message_id, "key": emoji}})
            if not sent.ok:
                raise MatrixAnswer(sent)
            _reactions.set((self.channel.pk, message_id, emoji), sent.platform_message_id)

    async def send_typing(self, target: Target) -> None:
        user = await self.user_id()
        answered = await self.call("PUT", f"/rooms/{quote(target.chat_id, safe='')}/typing/{quote(user, safe='')}",
                                   {"typing": True, "timeout": TYPING_MS})
        if isinstance(answered, SendResult):
            raise MatrixAnswer(answered)

    async def user_id(self) -> str:
        """The access token's user (whoami, asked once per process and channel)."""
        known = _users.get(self.channel.pk) or str((self.channel.poll_session or {}).get("user_id") or "")
        if known:
            return known
        answered = await self.call("GET", "/account/whoami", None)
        if isinstance(answered, SendResult):
            raise MatrixAnswer(answered)
        user = str((answered or {}).get("user_id") or "")
        _users.set(self.channel.pk, user)
        return user

    async def call(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        """One call: its JSON answer, or the failed SendResult."""
        token = str(self.channel.setting("access_token") or "")
        if not token:
            return self.failed(Outcome.CHANNEL_BLOCKED, "the channel has no access_token")
        url = self.base() + path
        headers = {"Authorization": f"Bearer {token}"}
        exchanged = await self.exchange(
            lambda extensions: _clients.get().request(method, url, headers=headers, json=body, timeout=DEADLINE,
                                                      extensions=extensions),
            urlsplit(url).netloc, DEADLINE)
        if isinstance(exchanged, SendResult):
            return exchanged
        try:
            answer = exchanged.json()
        except ValueError:
            answer = None
        if exchanged.status_code < 300:
            return answer
        return self.outcome(exchanged.status_code, answer if isinstance(answer, dict) else {}, exchanged.headers)

    def outcome(self, status: int, answer: dict[str, Any], headers: httpx.Headers) -> SendResult:
        """A refusal's outcome (the module's table)."""
        code = str(answer.get("errcode") or "")
        said = f"HTTP {status}" + (f" {code}" if code else "") + (f": {answer['error']}" if answer.get("error") else "")
        if status == 429 or code == "M_LIMIT_EXCEEDED":
            wait_ms = answer.get("retry_after_ms")
            wait = clamp_retry_after(wait_ms / 1000 if isinstance(wait_ms, int | float) else headers.get("retry-after"))
            return self.failed(Outcome.FLOOD, f"rate limited, retried in {wait:g} s: {said}", wait)
        if status == 401 or code in TOKEN_REFUSED:
            return self.failed(Outcome.CHANNEL_BLOCKED, f"the access token was refused (replace it): {said}")
        if code in UNREACHABLE or status in (403, 404):
            return self.failed(Outcome.PERMANENT, f"the room cannot be reached: {said}")
        if status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, said)
        return self.failed(Outcome.PERMANENT, f"rejected: {said}", chat_unreachable=False)

    def pace(self, chat_id: str) -> Pace | None:
        """The bot's sends across every worker (the homeserver's rc_message), and the chat interval."""
        return self.paced(f"matrix:{self.channel.pk}", str(chat_id), float(self.channel.setting("chat_interval") or 0))


class MessagePreview(EditedPreview):
    """A streamed reply's preview: one message (answering the person's), then edits."""

    interval = PREVIEW_INTERVAL

    def fit(self, text: str) -> str:
        if chunks.units(text) > MAX_UNITS:
            return chunks.split(text, MAX_UNITS - chunks.units(CURSOR))[0] + CURSOR
        return text
