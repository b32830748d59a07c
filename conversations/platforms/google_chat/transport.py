"""Sending to Google Chat: POST {api_base}{space}/messages (spaces.messages.create) with
`Authorization: Bearer <access token>`, the token the service account's key obtains from
its token URI (google-auth's service_account.Credentials, scope chat.bot), kept until it
nears its expiry. One overall deadline per call (Transport.exchange); the token's fetch
has its own (TOKEN_DEADLINE) and, failing, sends nothing.

In a space the reply goes into the user's thread (`thread.name`, with
messageReplyOption=REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD: a thread gone starts a new one).

Outcomes, from the HTTP status (Google's error `status` agrees):

| answer | outcome |
|---|---|
| 2xx with the message's `name` | delivered (the name is the platform message id) |
| 429 RESOURCE_EXHAUSTED (Chat's per-space and per-project write quotas) | flood: resent after Retry-After, else FLOOD_BACKOFF |
| 401 UNAUTHENTICATED; the token URI refusing the key | channel blocked: its replies wait, no attempt spent |
| 403 PERMISSION_DENIED, 404 NOT_FOUND (the app is not in the space, the space is gone) | permanent, the chat unreachable |
| 400 INVALID_ARGUMENT | permanent ("rejected"), the chat not marked |
| 408, 5xx | temporary |
| no connection, no token (the token URI unreachable) | not sent: resent unlabelled |
| no answer after the request went out | ambiguous |

Files in replies: not uploaded. Chat's media.upload takes a user's authentication
(scopes chat.messages.create / chat.messages), which an app posting as its service
account does not have, so this transport keeps Transport.send_files as it is: each file
of a reply is named in a message (`📎 booking.ics`, the caption above), threaded like any
reply, and Transport.capabilities() lists no FILES.

Chat has no typing indicator (the API offers none to apps). A streamed reply shows as one
preview message in the chat, edited as it grows (spaces.messages.patch, updateMask=text)
and edited into the final by the ledger (delivery.ledger.sending.send_over_preview); a
stale preview is deleted (spaces.messages.delete). Each edit is a write Chat counts
against the space's quota: previews go at most every PREVIEW_INTERVAL seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from typing import Any

import httpx
from django.conf import settings
from google.auth import exceptions as google_exceptions
from google.auth import transport
from google.oauth2 import service_account

from agentloop.core.caches import BoundedCache
from agentloop.core.tls import shared_tls_context
from delivery import chunks
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.previews import EditedPreview, Preview
from delivery.transports import LoopClients, SendResult, Target, Transport

MAX_UNITS = 4096  # a message's text
SCOPES = ["https://www.googleapis.com/auth/chat.bot"]
# Google's documented answer to RESOURCE_EXHAUSTED is a truncated exponential backoff whose
# first wait is 1 s plus up to 1 s of jitter: what a 429 without Retry-After waits. That
# clears the per-space quota (1 write a second, which a preview's edit also spends); a
# resend that meets the per-minute one again is refused again and waits again (a flood
# wait spends no attempt).
FLOOD_BACKOFF = 2.0
TOKEN_DEADLINE = 10.0
REPLY_OPTION = "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
FUNCTION = "confirm"  # a question's buttons' action
PREVIEW_INTERVAL = 1.5  # seconds between two preview writes: Chat takes 1 write a second into a space


def deadline() -> float:
    """Each call's whole deadline: the one every outbound HTTP call of a channel uses."""
    return float(settings.AGENTLOOP_CALLBACK_TIMEOUT)


class TokenRefused(Exception):
    """The token URI refused the key (revoked, deleted, wrong): the channel is blocked."""


class TokenUnavailable(Exception):
    """No token could be had (the token URI unreachable or failing): nothing was sent."""


def key_of(channel: Any) -> dict[str, Any]:
    """The channel's service account key, {} when it has none or it cannot be read."""
    raw = channel.setting("service_account_key")
    try:
        found = json.loads(raw) if isinstance(raw, str) and raw else raw
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def client_email(channel: Any) -> str:
    return str(key_of(channel).get("client_email") or "")


# The service account's credentials per channel and key (its token kept inside until it
# nears expiry). Bounded; a changed key or token URI is another entry.
_credentials: BoundedCache[tuple[int, str], service_account.Credentials] = BoundedCache(maxsize=256)


def _credentials_key(channel: Any) -> tuple[int, str]:
    material = f"{channel.setting('service_account_key')}\n{channel.setting('token_uri')}"
    return int(channel.pk or 0), hashlib.sha256(material.encode()).hexdigest()


def credentials_for(channel: Any) -> service_account.Credentials:
    cache_key = _credentials_key(channel)
    held = _credentials.get(cache_key)
    if held is None:
        info = key_of(channel)
        if channel.setting("token_uri"):
            info = {**info, "token_uri": channel.setting("token_uri")}
        try:
            held = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]  # google-auth
                info, scopes=SCOPES)
        except (ValueError, KeyError) as exc:
            raise TokenRefused(f"the service account key cannot be used: {type(exc).__name__}") from None
        _credentials.set(cache_key, held)
    return held


def forget_token(channel: Any) -> None:
    """The access token was refused: the next send asks for a new one."""
    _credentials.pop(_credentials_key(channel))


def access_token(channel: Any, limit: float = TOKEN_DEADLINE) -> str:
    """A valid access token for the channel's service account (blocking: the token URI
    is asked, within `limit` seconds in all, when the one held is near its expiry).
    Raises TokenRefused or TokenUnavailable."""
    credentials = credentials_for(channel)
    if credentials.valid:
        return str(credentials.token)
    try:
        credentials.refresh(_Exchange(limit))  # type: ignore[no-untyped-call]  # google-auth: untyped
    except google_exceptions.RefreshError as exc:
        if getattr(exc, "retryable", False):
            raise TokenUnavailable(f"the token URI failed: {str(exc)[:200]}") from None
        raise TokenRefused(f"the token URI refused the service account key: {str(exc)[:200]}") from None
    except (google_exceptions.TransportError, httpx.HTTPError, OSError) as exc:
        raise TokenUnavailable(f"the token URI could not be reached: {type(exc).__name__}") from None
    return str(credentials.token)


class GoogleChatTransport(Transport):
    max_units = MAX_UNITS
    supports_typing = False  # Chat has no typing indicator

    def endpoint(self, space: str) -> str:
        return f"{str(self.channel.setting('api_base')).rstrip('/')}/{space}/messages"

    async def token(self) -> str | SendResult:
        """The access token, or the failed SendResult (never ambiguous: no message left)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(access_token, self.channel), TOKEN_DEADLINE + 1)
        except TokenRefused as exc:
            return self.failed(Outcome.CHANNEL_BLOCKED, str(exc))
        except (TokenUnavailable, TimeoutError) as exc:
            return self.failed(Outcome.NOT_SENT, str(exc) or f"no access token within {TOKEN_DEADLINE:g} s")

    async def send_text(self, target: Target, text: str) -> SendResult:
        if not key_of(self.channel):  # (an empty one never gets here: Channel.send_blocked)
            return self.failed(Outcome.CHANNEL_BLOCKED, "the channel's service account key cannot be read")
        last: SendResult = SendResult.delivered("")
        # The ledger sends a long reply chunk by chunk (delivery.chunks); this split only
        # guards a text that reaches the transport whole. Buttons go under the last chunk.
        pieces = chunks.split(text, MAX_UNITS)
        for number, piece in enumerate(pieces):
            body: dict[str, Any] = {"text": piece}
            if target.buttons and number == len(pieces) - 1:
                body["cardsV2"] = [question_card(target.buttons)]
            last = await self.create(target, body)
            if not last.ok:
                return last
        return last

    async def create(self, target: Target, body: dict[str, Any]) -> SendResult:
        """spaces.messages.create: one message into the target's space (and thread)."""
        params = {}
        if target.thread_id:
            body = {**body, "thread": {"name": target.thread_id}}
            params["messageReplyOption"] = REPLY_OPTION
        return await self.call("POST", self.endpoint(target.chat_id), body, params)

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        """spaces.messages.patch (updateMask=text): a message of ours, its text replaced
        (a question's card put under it: the final of a preview may be one)."""
        body: dict[str, Any] = {"text": text[:MAX_UNITS]}
        mask = "text"
        if target.buttons:
            body["cardsV2"], mask = [question_card(target.buttons)], "text,cardsV2"
        result = await self.call("PATCH", self.message_url(message_id), body, {"updateMask": mask})
        return SendResult.delivered(message_id) if result.ok else result

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        """spaces.messages.delete: delivered once it is gone (also when it was already)."""
        result = await self.call("DELETE", self.message_url(message_id), None, {})
        if result.outcome == Outcome.PERMANENT and "404" in result.error:
            return SendResult.delivered(message_id)
        return result

    def message_url(self, name: str) -> str:
        return f"{str(self.channel.setting('api_base')).rstrip('/')}/{name}"

    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        """One preview message, edited as the reply grows (`message_id`: one an earlier
        run of the turn left in the chat, reused)."""
        return MessagePreview(self, target, message_id)

    async def call(self, method: str, url: str, body: dict[str, Any] | None, params: dict[str, str]) -> SendResult:
        token = await self.token()
        if isinstance(token, SendResult):
            return token
        limit = deadline()

        async def request(extensions: dict[str, Any]) -> httpx.Response:
            return await chat_client().request(method, url, json=body, params=params, timeout=limit,
                                               extensions=extensions, headers={"Authorization": f"Bearer {token}"})

        exchanged = await self.exchange(request, url.split("/")[2], limit)
        if isinstance(exchanged, SendResult):
            return exchanged
        return self.outcome(exchanged)

    def outcome(self, response: httpx.Response) -> SendResult:
        """The HTTP answer's outcome (see the module's table)."""
        try:
            answer: Any = response.json()
        except ValueError:
            answer = None
        status = response.status_code
        if 200 <= status < 300:
            name = answer.get("name") if isinstance(answer, dict) else None
            if name or response.request.method == "DELETE":
                return SendResult.delivered(str(name or ""))
            return self.failed(Outcome.AMBIGUOUS, f"HTTP {status} without a message name: it may have been sent")
        error: dict[str, Any] = answer["error"] if isinstance(answer, dict) and isinstance(answer.get("error"), dict) else {}
        said = f"HTTP {status}" + (f" {error.get('status')}" if error.get("status") else "") + \
            (f": {error.get('message')}" if error.get("message") else "")
        if status == 429 or error.get("status") == "RESOURCE_EXHAUSTED":
            wait = retry_after(response.headers.get("Retry-After"))
            return self.failed(Outcome.FLOOD, f"quota exceeded, retried in {wait:g} s: {said}", wait)
        if status == 401:
            forget_token(self.channel)
            return self.failed(Outcome.CHANNEL_BLOCKED, f"the access token was refused (check the key): {said}")
        if status in (403, 404):
            return self.failed(Outcome.PERMANENT, f"the app cannot post in this space (not a member, or it is "
                                                  f"gone): {said}")
        if status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, said)
        return self.failed(Outcome.PERMANENT, f"rejected: {said}", chat_unreachable=False)

    def pace(self, chat_id: str) -> Pace | None:
        """The service account's writes (the project's quota), and one space's."""
        return self.paced(f"google_chat:{client_email(self.channel)}", str(chat_id),
                          float(self.channel.setting("chat_interval") or 0))


class MessagePreview(EditedPreview):
    """A streamed reply's preview: one message (into the user's thread), then edits."""

    interval = PREVIEW_INTERVAL
    transport: GoogleChatTransport

    async def first(self, text: str) -> SendResult:
        return await self.transport.create(self.target, {"text": text[:MAX_UNITS]})


def question_card(buttons: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """A cards v2 card holding a question's buttons (label, data): each button's action
    `confirm` with the data as its `data` parameter (cards.py takes the tap)."""
    return {"cardId": "confirmation", "card": {"sections": [{"widgets": [{"buttonList": {"buttons": [
        {"text": label, "onClick": {"action": {"function": FUNCTION, "parameters": [{"key": "data", "value": data}]}}}
        for label, data in buttons]}}]}]}}


def retry_after(value: str | None) -> float:
    try:
        wait = float(value) if value else FLOOD_BACKOFF
    except ValueError:
        wait = FLOOD_BACKOFF
    return wait if wait > 0 else FLOOD_BACKOFF


class _Exchange(transport.Request):
    """google-auth's HTTP requests for one token (its own retries included), through httpx,
    all within one deadline."""

    def __init__(self, limit: float) -> None:
        self.ends = time.monotonic() + limit

    def __call__(self, url: str, method: str = "GET", body: Any = None, headers: Any = None,
                 timeout: Any = None, **kwargs: Any) -> _Answer:
        left = self.ends - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError("the token's deadline passed")
            return bounded(method, url, left, content=body, headers=headers)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise google_exceptions.TransportError(type(exc).__name__) from None  # type: ignore[no-untyped-call]


class _Answer(transport.Response):
    """A whole HTTP answer, read by `bounded`."""

    def __init__(self, status: int, headers: dict[str, str], data: bytes) -> None:
        self._status, self._headers, self._data = status, headers, data

    @property
    def status(self) -> int:
        return self._status

    @property
    def headers(self) -> dict[str, str]:
        return self._headers

    @property
    def data(self) -> bytes:
        return self._data


MAX_ANSWER_BYTES = 1024 * 1024


def bounded(method: str, url: str, limit: float, **request: Any) -> _Answer:
    """One blocking HTTP exchange (the token's, a question's update from outside the
    worker's loop) read within `limit` seconds in all, at most MAX_ANSWER_BYTES of it.
    Raises httpx.HTTPError, or TimeoutError past the deadline."""
    ends = time.monotonic() + limit
    data = b""
    with httpx.Client(timeout=limit, verify=shared_tls_context()) as client, \
            client.stream(method, url, **request) as response:
        for piece in response.iter_bytes():
            data += piece
            if time.monotonic() > ends or len(data) > MAX_ANSWER_BYTES:
                raise TimeoutError(f"{url.split('/')[2]} gave no whole answer within {limit:g} s")
        return _Answer(response.status_code, dict(response.headers), data)


_clients = LoopClients()  # one httpx client per event loop (delivery.transports)


def chat_client() -> httpx.AsyncClient:
    return _clients.get()


async def close_clients() -> None:
    await _clients.close()
