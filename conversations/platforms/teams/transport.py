"""Sending to Teams through the Bot Connector REST API: POST
{serviceUrl}/v3/conversations/{conversation}/activities (a new message; `/{activity id}`
after it: a reply to that activity), PUT …/activities/{id} (an edit), DELETE
…/activities/{id}, each with `Authorization: Bearer <token>`: the app's token from its
token endpoint (OAuth 2 client credentials, scope https://api.botframework.com/.default),
kept per channel until REFRESH_BEFORE seconds before it expires. The activities are the
Agents SDK's model (microsoft_agents.activity.Activity), serialised as the wire has them.
One overall deadline per call (Transport.exchange); the token's fetch has its own
(TOKEN_DEADLINE) and, failing, sends nothing.

Where: the chat's conversation reference — the serviceUrl and conversation id of its
last activity, kept per chat by intake (conversations.addresses; activities.reference).
A chat no activity came from yet (a proactive first message) goes to the channel's
`service_url` setting: a channel or group chat by its id, a personal chat (the person's
id) by the conversation the Connector's "create conversation" answers for the bot and
the person (asked once per process).

Outcomes, from the HTTP status (the Connector's `error.code` in the text):

| answer | outcome |
|---|---|
| 2xx with the activity's `id` | delivered (the id is the platform message id) |
| 429 (Teams' per-thread and per-bot limits) | flood: resent after Retry-After, else FLOOD_BACKOFF |
| 401; the token endpoint refusing the app's secret | channel blocked: its replies wait, no attempt spent |
| 403 (the bot removed, blocked by the user or disabled), 404 (the conversation gone) | permanent, the chat unreachable |
| 400, 413 (over the message size) and other refusals | permanent ("rejected"), the chat not marked |
| 408, 5xx | temporary |
| no connection, no token (the token endpoint unreachable or failing) | not sent: resent unlabelled |
| no answer after the request went out | ambiguous |

Files (one a message): in a personal chat a FileConsentCard, the upload once the person
accepts (files.py); in group chats and channels, where a bot uploads only through
SharePoint and Graph, the files are named in the text.

Typing: a `typing` activity, refreshed every TYPING_REFRESH seconds. A streamed reply:
Teams' native streaming in a personal chat (streaming.py), one message edited in place
(PUT) elsewhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx
from django.conf import settings
from microsoft_agents.activity import Activity

from agentloop.core.caches import BoundedCache
from agentloop.core.tls import shared_tls_context
from conversations import addresses
from conversations.platforms.teams.consent import consent_card
from conversations.platforms.teams.streaming import TeamsStream, can_stream, finish, streaming
from conversations.platforms.teams.wire import activities_url, is_user, message, personal_conversation, wire
from delivery import chunks
from delivery.attachments import OutboundFile
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.previews import EditedPreview, Preview
from delivery.transports import LoopClients, SendResult, Target, Transport

# Teams takes a message of about 28 KB, the whole activity ("Format your bot messages":
# "the message size limit is ~28 KB"; beyond it the Connector answers 413). A UTF-16 unit
# is at most 3 bytes of UTF-8, so 8,000 of them stay under 24 KB and leave room for the
# activity around the text (a question's card included).
MAX_UNITS = 8000
SCOPE = "https://api.botframework.com/.default"
# Teams answers 429 with Retry-After; without one, Microsoft's guidance is an exponential
# backoff from a couple of seconds (a flood wait spends no attempt).
FLOOD_BACKOFF = 2.0
TOKEN_DEADLINE = 10.0
REFRESH_BEFORE = 300.0  # seconds before the token's expiry it is asked for again
TYPING_REFRESH = 3.0  # Teams shows a typing activity for a few seconds
PREVIEW_INTERVAL = 1.5  # seconds between two preview writes (a thread takes 8 in 2 s, 60 in 30 s)
MAX_ANSWER_BYTES = 1024 * 1024


TOKEN_HOST = "https://login.microsoftonline.com"


def token_url_for(tenant_id: str, configured: str = "") -> str:
    """Where the app's token is asked for: the setting, else the tenant's Entra endpoint
    (a single-tenant bot; botframework.com for a multi-tenant one, retired for new bots)."""
    return configured or f"{TOKEN_HOST}/{tenant_id or 'botframework.com'}/oauth2/v2.0/token"


def deadline() -> float:
    """Each call's whole deadline: the one every outbound HTTP call of a channel uses."""
    return float(settings.AGENTLOOP_CALLBACK_TIMEOUT)


class TokenRefused(Exception):
    """The token endpoint refused the app id or secret: the channel is blocked."""


class TokenUnavailable(Exception):
    """No token could be had (the endpoint unreachable or failing): nothing was sent."""


# The app's token per channel and credentials: (token, when to ask again, on the monotonic
# clock). Bounded; a changed secret or token URL is another entry.
_tokens: BoundedCache[tuple[int, str], tuple[str, float]] = BoundedCache(maxsize=256)
_asking = threading.Lock()
# A person's personal chat, by (app id, service URL, user id): its conversation id (asked
# only where no activity of the chat gave its conversation reference).
_conversations: BoundedCache[tuple[str, str, str], str] = BoundedCache(maxsize=4096, max_age=86400.0)


def _conversation_key(channel: Any, user: str) -> tuple[str, str, str]:
    return str(channel.setting("app_id") or ""), str(channel.setting("service_url") or ""), user


def conversation_id(channel: Any, chat_id: str, limit: float = TOKEN_DEADLINE) -> str:
    """Blocking (a question's update from outside the worker's loop): the conversation
    `chat_id` names, a personal chat's asked of the Connector once per process. Raises
    TokenRefused, TokenUnavailable, httpx.HTTPError or TimeoutError; ValueError when the
    Connector gives none."""
    if not is_user(chat_id):
        return chat_id
    held = _conversations.get(_conversation_key(channel, chat_id))
    if held:
        return held
    url, body = personal_conversation(channel, chat_id)
    status, _headers, answer = bounded("POST", url, limit, json=body,
                                       headers={"Authorization": f"Bearer {access_token(channel, limit)}"})
    found = answer.get("id") if isinstance(answer, dict) and status < 300 else None
    if not found:
        raise ValueError(f"the Connector gave no conversation for the personal chat (HTTP {status})")
    return _conversations.set(_conversation_key(channel, chat_id), str(found))


def reference(found: Mapping[str, str] | None) -> tuple[str, str] | None:
    """(serviceUrl, conversation id) of a stored conversation reference, if it has both."""
    service, conversation = (found or {}).get("serviceUrl", ""), (found or {}).get("conversationId", "")
    return (service, conversation) if service.startswith(("https://", "http://")) and conversation else None


def reply_url(channel: Any, chat_id: str, activity_id: str = "", limit: float = TOKEN_DEADLINE) -> str:
    """Blocking: the activities URL of `chat_id`'s conversation (and of one activity in
    it): by its conversation reference, else as the transport's fallback (conversation_id)."""
    known = reference(addresses.address_for(channel, Target(chat_id)))
    if known is not None:
        return activities_url(channel, known[1], activity_id, service_url=known[0])
    return activities_url(channel, conversation_id(channel, chat_id, limit), activity_id)


def _token_key(channel: Any) -> tuple[int, str]:
    material = "\n".join(str(channel.setting(name) or "") for name in ("app_id", "app_password", "tenant_id",
                                                                         "token_url"))
    return int(channel.pk or 0), hashlib.sha256(material.encode()).hexdigest()


def forget() -> None:
    """Drop the tokens and personal chats this process holds (tests: a fake's port used
    again under a channel id used again would find another fake's token)."""
    for cache in (_tokens, _conversations):
        cache.clear()


def forget_token(channel: Any) -> None:
    """The token was refused: the next send asks for a new one."""
    _tokens.pop(_token_key(channel))


def access_token(channel: Any, limit: float = TOKEN_DEADLINE) -> str:
    """The app's token (blocking: the endpoint is asked, within `limit` seconds in all,
    when the one held is near its expiry). Raises TokenRefused or TokenUnavailable."""
    key = _token_key(channel)
    held = _tokens.get(key)
    if held is not None and time.monotonic() < held[1]:
        return held[0]
    with _asking:  # one request for a token at a time: a burst of sends asks once
        held = _tokens.get(key)
        if held is not None and time.monotonic() < held[1]:
            return held[0]
        url = token_url_for(str(channel.setting("tenant_id") or ""), str(channel.setting("token_url") or ""))
        form = {"grant_type": "client_credentials", "client_id": str(channel.setting("app_id") or ""),
                "client_secret": str(channel.setting("app_password") or ""), "scope": SCOPE}
        try:
            status, _headers, answer = bounded("POST", url, limit, data=form)
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            raise TokenUnavailable(f"the token endpoint could not be reached: {type(exc).__name__}") from None
        body = answer if isinstance(answer, dict) else {}
        if status in (400, 401) and body.get("error") in ("invalid_client", "unauthorized_client", "invalid_request"):
            raise TokenRefused(f"the token endpoint refused the app's credentials: {body.get('error')}")
        if status != 200 or not body.get("access_token"):
            raise TokenUnavailable(f"the token endpoint answered HTTP {status}")
        try:
            lifetime = float(body.get("expires_in") or 3599)
        except (TypeError, ValueError):
            lifetime = 3599.0
        token = str(body["access_token"])
        _tokens.set(key, (token, time.monotonic() + max(lifetime - REFRESH_BEFORE, lifetime / 2)))
        return token


def bounded(method: str, url: str, limit: float, **request: Any) -> tuple[int, dict[str, str], Any]:
    """One blocking HTTP exchange (the token's, a question's update from outside the
    worker's loop) read within `limit` seconds in all, at most MAX_ANSWER_BYTES of it:
    (status, headers, the JSON answer or None). Raises httpx.HTTPError, or TimeoutError
    past the deadline."""
    ends = time.monotonic() + limit
    data = b""
    with httpx.Client(timeout=limit, verify=shared_tls_context()) as client, \
            client.stream(method, url, **request) as response:
        for piece in response.iter_bytes():
            data += piece
            if time.monotonic() > ends or len(data) > MAX_ANSWER_BYTES:
                raise TimeoutError(f"{url.split('/')[2]} gave no whole answer within {limit:g} s")
        try:
            answer = httpx.Response(200, content=data).json() if data else None
        except ValueError:
            answer = None
        return response.status_code, dict(response.headers), answer


class TeamsTransport(Transport):
    max_units = MAX_UNITS
    supports_typing = True
    typing_refresh = TYPING_REFRESH

    async def token(self) -> str | SendResult:
        """The app's token, or the failed SendResult (never ambiguous: no message left)."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(access_token, self.channel), TOKEN_DEADLINE + 1)
        except TokenRefused as exc:
            return self.failed(Outcome.CHANNEL_BLOCKED, str(exc))
        except (TokenUnavailable, TimeoutError) as exc:
            return self.failed(Outcome.NOT_SENT, str(exc) or f"no token within {TOKEN_DEADLINE:g} s")

    async def conversation(self, chat_id: str) -> str | SendResult:
        """The conversation id replies to `chat_id` go to: itself, or for a personal chat
        (a person's id) the conversation the Connector answers for the bot and them,
        asked once per process (wire.personal_conversation); or the failed SendResult."""
        if not is_user(chat_id):
            return chat_id
        key = _conversation_key(self.channel, chat_id)
        held = _conversations.get(key)
        if held:
            return held
        url, body = personal_conversation(self.channel, chat_id)
        result = await self.call("POST", url, body)
        if not result.ok:
            return result
        return _conversations.set(key, result.platform_message_id)

    async def url(self, chat_id: str, activity_id: str = "") -> str | SendResult:
        """The activities URL of `chat_id`'s conversation (and of one activity in it): at
        the serviceUrl of the chat's conversation reference, else at the channel's."""
        known = reference(await addresses.address_of(self.channel, Target(chat_id)))
        if known is not None:
            return activities_url(self.channel, known[1], activity_id, service_url=known[0])
        conversation = await self.conversation(chat_id)
        return conversation if isinstance(conversation, SendResult) else \
            activities_url(self.channel, conversation, activity_id)

    async def send_text(self, target: Target, text: str) -> SendResult:
        last: SendResult = SendResult.delivered("")
        # The ledger sends a long reply chunk by chunk (delivery.chunks); this split only
        # guards a text that reaches the transport whole. Buttons go under the last chunk;
        # the first replies to the person's message.
        pieces = chunks.split(text, MAX_UNITS)
        for number, piece in enumerate(pieces):
            buttons = target.buttons if number == len(pieces) - 1 else ()
            last = await self.create(target, message(piece, buttons, target.reply_target if number == 0 else ""))
            if not last.ok:
                return last
        return last

    async def send_files(self, target: Target, files: list[OutboundFile], caption: str) -> SendResult:
        """A personal chat: the file's consent card (files.py: the upload follows the
        person's accept); elsewhere the files named in the text."""
        if not is_user(target.chat_id):
            return await super().send_files(target, files, caption)
        last: SendResult = SendResult.delivered("")
        for number, item in enumerate(files):  # one (max_album): several only if a caller groups them
            activity = consent_card(self.channel, target.chat_id, item, caption if number == 0 else "")
            if number == 0 and target.reply_target:
                activity.reply_to_id = target.reply_target
            last = await self.create(target, activity)
            if not last.ok:
                return last
        return last

    async def create(self, target: Target, activity: Activity) -> SendResult:
        """POST the activity into the target's conversation (replying to `replyToId`)."""
        url = await self.url(target.chat_id, activity.reply_to_id or "")
        return url if isinstance(url, SendResult) else await self.call("POST", url, wire(activity))

    async def send_typing(self, target: Target) -> None:
        url = await self.url(target.chat_id)
        if not isinstance(url, SendResult):
            await self.call("POST", url, wire(Activity(type="typing")), limit=self.typing_refresh)

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        """PUT the activity: a message of ours, its text replaced (a question's card put
        under it: the final of a preview may be one). A stream of this process's is
        ended with the text instead (streaming.finish)."""
        if streaming(message_id):
            ended = await finish(self, target, message_id, text)
            if ended.ok or ended.outcome != Outcome.PERMANENT:
                return ended
        url = await self.url(target.chat_id, message_id)
        if isinstance(url, SendResult):
            return url
        result = await self.call("PUT", url, wire(message(text[:MAX_UNITS], target.buttons, activity_id=message_id)))
        return SendResult.delivered(message_id) if result.ok else result

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        """DELETE the activity: delivered once it is gone (also when it was already)."""
        url = await self.url(target.chat_id, message_id)
        if isinstance(url, SendResult):
            return url
        result = await self.call("DELETE", url, None)
        if result.outcome == Outcome.PERMANENT and "HTTP 404" in result.error:
            return SendResult.delivered(message_id)
        return result

    def preview_for(self, target: Target, turn_id: int, message_id: str = "") -> Preview | None:
        """A personal chat's native stream (streaming.TeamsStream), where Teams takes one;
        elsewhere one preview message, edited as the reply grows (`message_id`: one an
        earlier run of the turn left in the chat, reused)."""
        if can_stream(self, target):
            return TeamsStream(self, target, message_id)
        return MessagePreview(self, target, message_id)

    async def call(self, method: str, url: str, body: dict[str, Any] | None, limit: float = 0.0,
                   needs_id: bool = True) -> SendResult:
        token = await self.token()
        if isinstance(token, SendResult):
            return token
        limit = limit or deadline()

        async def request(extensions: dict[str, Any]) -> httpx.Response:
            return await client().request(method, url, json=body, timeout=limit, extensions=extensions,
                                          headers={"Authorization": f"Bearer {token}"})

        exchanged = await self.exchange(request, url.split("/")[2], limit)
        if isinstance(exchanged, SendResult):
            return exchanged
        return self.outcome(exchanged, needs_id)

    def outcome(self, response: httpx.Response, needs_id: bool = True) -> SendResult:
        """The HTTP answer's outcome (see the module's table)."""
        try:
            answer: Any = response.json()
        except ValueError:
            answer = None
        status = response.status_code
        if 200 <= status < 300:
            found = answer.get("id") if isinstance(answer, dict) else None
            if found or not needs_id or response.request.method in ("DELETE", "PUT"):
                return SendResult.delivered(str(found or ""))
            return self.failed(Outcome.AMBIGUOUS, f"HTTP {status} without an activity id: it may have been sent")
        error: dict[str, Any] = answer["error"] if isinstance(answer, dict) and isinstance(answer.get("error"), dict) else {}
        said = f"HTTP {status}" + (f" {error.get('code')}" if error.get("code") else "") + \
            (f": {error.get('message')}" if error.get("message") else "")
        if status == 429:
            wait = retry_after(response.headers.get("Retry-After"))
            return self.failed(Outcome.FLOOD, f"rate limited, retried in {wait:g} s: {said}", wait)
        if status == 401:
            forget_token(self.channel)
            return self.failed(Outcome.CHANNEL_BLOCKED, f"the token was refused (check the app id and secret): {said}")
        if status in (403, 404):
            return self.failed(Outcome.PERMANENT, f"the bot cannot post in this conversation (removed, blocked, or "
                                                  f"it is gone): {said}")
        if status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, said)
        return self.failed(Outcome.PERMANENT, f"rejected: {said}", chat_unreachable=False)

    def pace(self, chat_id: str) -> Pace | None:
        """The bot's sends (50 a second in all), and one thread's."""
        return self.paced(f"teams:{self.channel.setting('app_id')}", str(chat_id),
                          float(self.channel.setting("chat_interval") or 0))


class MessagePreview(EditedPreview):
    """A streamed reply's preview: one message, then edits (PUT)."""

    interval = PREVIEW_INTERVAL
    transport: TeamsTransport

    async def first(self, text: str) -> SendResult:
        return await self.transport.create(self.target, message(text[:MAX_UNITS], reply_to=self.target.reply_target))


def retry_after(value: str | None) -> float:
    try:
        wait = float(value) if value else FLOOD_BACKOFF
    except ValueError:
        wait = FLOOD_BACKOFF
    return wait if wait > 0 else FLOOD_BACKOFF


_clients = LoopClients()  # one httpx client per event loop (delivery.transports)


def client() -> httpx.AsyncClient:
    return _clients.get()


async def close_clients() -> None:
    await _clients.close()
