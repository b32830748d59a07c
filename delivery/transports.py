"""One transport class per platform, each with one send method returning a typed
outcome: delivered, flood (retry after N s), temporary, permanent (the chat cannot be
reached), or ambiguous (the request went out and no answer came back: it may have
arrived). The ledger decides what to do with each.

Transports are used from the worker's event loop only. python-telegram-bot's Bot must
not be shared across event loops, so bots are cached per loop.
"""

import abc
import asyncio
import json
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import telegram
from django.conf import settings
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError, TimedOut

from agentloop.caches import BoundedCache
from agentloop.tls import shared_tls_context
from audit.redaction import channel_secrets, redact
from delivery import chunks, signing
from delivery.models import Outcome
from delivery.retry_after import clamp_retry_after, retry_after_header
from delivery.telegram_request import AiohttpRequest, NotSent

log = logging.getLogger(__name__)

TELEGRAM_MAX_UNITS = 4096  # a message's length as Telegram counts it: UTF-16 code units


@dataclass(frozen=True)
class SendResult:
    outcome: str  # delivery.models.Outcome
    platform_message_id: str = ""
    error: str = ""
    retry_after: float = 0.0  # flood: seconds the platform asked us to wait

    @property
    def ok(self):
        return self.outcome == Outcome.DELIVERED

    @classmethod
    def delivered(cls, platform_message_id=""):
        return cls(Outcome.DELIVERED, platform_message_id=str(platform_message_id or ""))

    @classmethod
    def failed(cls, outcome, error, retry_after=None, secrets=()):
        """`secrets`: what the transport holds (its channel's), masked in the error text
        besides everything `redact` knows."""
        wait = clamp_retry_after(retry_after) if outcome == Outcome.FLOOD else 0.0
        return cls(outcome, error=redact(str(error), secrets)[:300], retry_after=wait)


# Telegram's BadRequest descriptions that mean the chat itself is gone for this bot.
UNREACHABLE_CHAT = ("chat not found", "bot was kicked", "bot is not a member", "user is deactivated",
                    "group chat was deleted", "have no rights to send")


@dataclass(frozen=True)
class Target:
    """Where a message goes, as the platform addresses it."""

    chat_id: str
    reply_target: str = ""
    thread_id: str = ""
    conversation_id: int | None = None
    # Answer buttons under the message, as (label, opaque data) pairs: a question asking the
    # user to confirm an action (tools.confirmations). Platforms without buttons ignore them.
    buttons: tuple = ()


class Transport(abc.ABC):
    supports_typing = False
    # Seconds between two typing indicators: below the platform's own expiry, so the
    # indicator never blinks out while it is wanted. Also each call's deadline.
    typing_refresh = 4.0
    max_units = None  # the platform's limit on one message (UTF-16 units); None: no limit

    def __init__(self, channel):
        self.channel = channel

    def failed(self, outcome, error, retry_after=None) -> SendResult:
        return SendResult.failed(outcome, error, retry_after, secrets=channel_secrets(self.channel))

    @abc.abstractmethod
    async def send_text(self, target: Target, text: str) -> SendResult:
        """Send `text`; the outcome says whether it landed and whether to try again."""

    async def send_typing(self, target: Target) -> None:
        """Show "typing…"; only called when supports_typing."""


# AGENTLOOP_TELEGRAM_CONNECTIONS per bot (Telegram itself takes ~30 messages/s per
# bot); requests beyond it queue in aiohttp's connector.
# Bounded (bots of tokens an operator replaced would otherwise stay for the process's life);
# a bot pushed out is closed once any send it is in the middle of is over.
BOT_CACHE_SIZE = 256
EVICTED_BOT_GRACE = 120.0


def _close_evicted(key, bot):
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if id(loop) == key[0]:  # its session belongs to this loop; another loop's is left to the GC
        loop.create_task(_close_later(bot))


async def _close_later(bot):
    await asyncio.sleep(EVICTED_BOT_GRACE)
    await bot.request.shutdown()


_bots = BoundedCache(maxsize=BOT_CACHE_SIZE, on_evict=_close_evicted)


def telegram_bot(token: str, api_base: str, purpose="send") -> telegram.Bot:
    """A Bot for this event loop, talking to {api_base}/bot{token}/{method}. Typing
    indicators get a Bot of their own ("typing"): best effort, they must never queue a
    reply behind them."""
    key = (id(asyncio.get_running_loop()), token, api_base.rstrip("/"), purpose)
    bot = _bots.get(key)
    if bot is None:
        connections = settings.AGENTLOOP_TELEGRAM_CONNECTIONS
        bot = _bots.set(key, telegram.Bot(token, base_url=f"{api_base.rstrip('/')}/bot",
                                          request=AiohttpRequest(connections=connections),
                                          # unused: polling has its own Bot
                                          get_updates_request=AiohttpRequest(connections=1)))
    return bot


async def close_bots():
    """Close this event loop's bots (their HTTP sessions) on shutdown."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _bots.keys() if k[0] == loop_id]:
        bot = _bots.pop(key)
        if bot is not None:
            await bot.request.shutdown()  # (Bot.shutdown skips bots never initialize()d)


class TelegramTransport(Transport):
    supports_typing = True
    typing_refresh = 4.0  # Telegram shows "typing…" for ~5 s, or until the bot's next message
    max_units = TELEGRAM_MAX_UNITS

    async def send_text(self, target: Target, text: str) -> SendResult:
        bot = telegram_bot(self.channel.bot_token, self.channel.api_base)
        last_id = ""
        reply = (
            telegram.ReplyParameters(int(target.reply_target), allow_sending_without_reply=True)
            if target.reply_target else None
        )
        try:
            # The ledger sends a long reply chunk by chunk (delivery.chunks); this split
            # only guards a text that reaches the transport whole.
            pieces = chunks.split(text, TELEGRAM_MAX_UNITS)
            for index, chunk in enumerate(pieces):
                message = await bot.send_message(
                    chat_id=target.chat_id, text=chunk, reply_parameters=reply,
                    message_thread_id=int(target.thread_id) if target.thread_id else None,
                    reply_markup=inline_keyboard(target.buttons) if index == len(pieces) - 1 else None,
                )
                last_id = str(message.message_id)
                reply = None  # only the first chunk threads to the user's message
        except RetryAfter as exc:
            return self.failed(Outcome.FLOOD, exc, exc.retry_after)
        except Forbidden as exc:  # blocked by the user, kicked from the group
            return self.failed(Outcome.PERMANENT, exc)
        except BadRequest as exc:
            if any(phrase in str(exc).lower() for phrase in UNREACHABLE_CHAT):
                return self.failed(Outcome.PERMANENT, exc)
            # Telegram refused this message (not the chat): resending it as is cannot help.
            return self.failed(Outcome.PERMANENT, f"rejected: {exc}")
        except NotSent as exc:
            return self.failed(Outcome.TEMPORARY, exc)
        except TimedOut as exc:  # after the request went out: it may have been delivered
            return self.failed(Outcome.AMBIGUOUS, f"timed out: {exc}")
        except NetworkError as exc:
            # PTB maps 5xx answers to NetworkError; our HTTP layer maps a connection lost
            # after the request was sent to SentUnanswered (a NetworkError) — ambiguous.
            kind = Outcome.AMBIGUOUS if getattr(exc, "ambiguous", False) else Outcome.TEMPORARY
            return self.failed(kind, f"{type(exc).__name__}: {exc}")
        except TelegramError as exc:
            return self.failed(Outcome.TEMPORARY, f"{type(exc).__name__}: {exc}")
        except (ValueError, TypeError, OverflowError) as exc:
            # An answer PTB could not make sense of (the request went out): it may have landed.
            return self.failed(Outcome.AMBIGUOUS, f"unreadable answer: {type(exc).__name__}")
        return SendResult.delivered(last_id)

    async def send_typing(self, target: Target) -> None:
        bot = telegram_bot(self.channel.bot_token, self.channel.api_base, "typing")
        await bot.send_chat_action(
            chat_id=target.chat_id, action="typing",
            message_thread_id=int(target.thread_id) if target.thread_id else None,
        )


def inline_keyboard(buttons) -> telegram.InlineKeyboardMarkup | None:
    """Buttons side by side in one row; a tap comes back as a callback_query with the data."""
    if not buttons:
        return None
    return telegram.InlineKeyboardMarkup([[telegram.InlineKeyboardButton(label, callback_data=data)
                                           for label, data in buttons]])


def call_telegram_now(channel, deadline: float, *calls) -> list:
    """Bot API calls from synchronous code (a webhook's thread, a database thread), one
    after the other on an event loop of their own with a Bot of its own (a Bot must not
    cross event loops), each bounded by `deadline` seconds. `calls`: (method name,
    {params}) pairs. Returns, in order, each call's result or the exception it raised
    (python-telegram-bot's, or asyncio.TimeoutError)."""

    async def each():
        request = AiohttpRequest(connections=1, read_timeout=deadline, write_timeout=deadline,
                                 connect_timeout=deadline)
        bot = telegram.Bot(channel.bot_token, base_url=f"{channel.api_base.rstrip('/')}/bot", request=request,
                           get_updates_request=AiohttpRequest(connections=1))  # never used: created lazily
        results = []
        try:
            for method, params in calls:
                try:
                    results.append(await asyncio.wait_for(getattr(bot, method)(**params), deadline))
                except (TimeoutError, TelegramError, OSError) as exc:
                    results.append(exc)
        finally:
            await request.shutdown()
        return results

    return asyncio.run(each())


class StoredTransport(Transport):
    """api channels without a callback: the reply row *is* the delivery; clients read it."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        return SendResult.delivered()


class WebchatTransport(Transport):
    """The site's own chat (the console's playground): the reply is pushed to the
    conversation's live group (`webchat.<conversation id>`), across processes (see
    agentloop.live); the row stays readable, and the page reloads it on reconnect."""

    supports_typing = True
    typing_refresh = 4.0  # the page shows a typing signal for 6 s (static/console/playground.js)

    async def send_text(self, target: Target, text: str) -> SendResult:
        from agentloop import live

        try:
            event = {"kind": "reply", "conversation": target.conversation_id, "text": text,
                     "reply_to": target.reply_target}
            if target.buttons:  # the page shows them and sends a tap back over its socket
                event["buttons"] = [{"label": label, "data": data} for label, data in target.buttons]
            await live.apublish([live.conversation_group(target.conversation_id)], event)
        except Exception as exc:  # e.g. Redis unreachable
            return self.failed(Outcome.TEMPORARY, f"{type(exc).__name__}: {exc}")
        return SendResult.delivered()

    async def send_typing(self, target: Target) -> None:
        from agentloop import live

        await live.apublish([live.conversation_group(target.conversation_id)], {
            "kind": "typing", "conversation": target.conversation_id})


class ApiCallbackTransport(Transport):
    """api channels with a callback URL (a webhook): the reply is POSTed, signed (see
    `delivery.signing`: HMAC-SHA256 over the timestamp and the body). A channel without
    a callback secret is never sent to unsigned (its rows wait; see the ledger's
    `_sendable`, and the refusal below for a row claimed before the secret was cleared).
    The whole exchange has one deadline: httpx's timeouts are per phase, and a peer that
    trickles a byte a second would never trip them."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        secret = self.channel.callback_secret
        if not secret:
            return self.failed(Outcome.TEMPORARY, "refused: the channel's callback has no secret to sign with")
        body = json.dumps({"chat": target.chat_id, "reply_to": target.reply_target, "text": text}).encode()
        headers = {"Content-Type": "application/json", **signing.signed_headers(secret, body)}
        host = urlsplit(self.channel.callback_url).netloc.rpartition("@")[2]
        deadline = settings.AGENTLOOP_CALLBACK_TIMEOUT
        try:
            status, retry_after = await asyncio.wait_for(self._post(body, headers, deadline), deadline)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return self.failed(Outcome.TEMPORARY, f"{type(exc).__name__} connecting to {host}")
        except (TimeoutError, httpx.HTTPError) as exc:  # sent, no (whole) answer: it may have arrived
            return self.failed(Outcome.AMBIGUOUS, f"{type(exc).__name__}: {host} gave no answer within {deadline:g} s")
        if status < 300:
            return SendResult.delivered()
        if status == 429:
            return self.failed(Outcome.FLOOD, "HTTP 429", retry_after)
        if status in (404, 410):
            return self.failed(Outcome.PERMANENT, f"HTTP {status}")
        if status >= 500 or status == 408:
            return self.failed(Outcome.TEMPORARY, f"HTTP {status}")
        return self.failed(Outcome.PERMANENT, f"rejected: HTTP {status}")

    async def _post(self, body, headers, timeout):
        async with httpx.AsyncClient(timeout=timeout, verify=shared_tls_context()) as client:
            response = await client.post(self.channel.callback_url, content=body, headers=headers)
            return response.status_code, retry_after_header(response.headers.get("Retry-After"))


def typing_kinds() -> tuple[str, ...]:
    """The channel kinds whose transport can show "typing…" (the worker's typing look
    asks the database only about these)."""
    from conversations.models import Channel, ChannelKind

    return tuple(kind for kind in ChannelKind.values if transport_for(Channel(kind=kind)).supports_typing)


def transport_for(channel) -> Transport:
    if channel.kind == "telegram":
        return TelegramTransport(channel)
    if channel.kind == "api" and channel.callback_url:
        return ApiCallbackTransport(channel)
    if channel.kind == "webchat":
        return WebchatTransport(channel)
    return StoredTransport(channel)
