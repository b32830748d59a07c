"""One transport class per platform, each with one send method and a typed outcome.

Transports are used from the worker's event loop only. python-telegram-bot's Bot must
not be shared across event loops, so bots are cached per loop.
"""

import abc
import asyncio
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass

import httpx
import telegram
from django.conf import settings
from telegram.error import Forbidden, TelegramError

from delivery.telegram_request import AiohttpRequest

log = logging.getLogger(__name__)

TELEGRAM_MAX_CHARS = 4096


@dataclass(frozen=True)
class SendResult:
    ok: bool
    platform_message_id: str = ""
    error: str = ""
    permanent: bool = False


@dataclass(frozen=True)
class Target:
    """Where a message goes, as the platform addresses it."""

    chat_id: str
    reply_target: str = ""
    thread_id: str = ""


class Transport(abc.ABC):
    supports_typing = False

    def __init__(self, channel):
        self.channel = channel

    @abc.abstractmethod
    async def send_text(self, target: Target, text: str) -> SendResult:
        """Send `text`; the outcome says whether it landed and whether to try again."""

    async def send_typing(self, target: Target) -> None:
        """Show "typing…"; only called when supports_typing."""


def split_text(text: str, limit: int) -> list[str]:
    """Platform-sized chunks, cut at a newline or space when one is near the limit."""
    chunks = []
    while len(text) > limit:
        cut = max(text.rfind("\n", 0, limit), text.rfind(" ", 0, limit))
        if cut < limit // 2:
            cut = limit
        chunks.append(text[:cut])
        text = text[cut:].lstrip("\n ")
    chunks.append(text)
    return chunks


# AGENTLOOP_TELEGRAM_CONNECTIONS per bot (Telegram itself takes ~30 messages/s per
# bot); requests beyond it queue in aiohttp's connector.
_bots: dict[tuple, telegram.Bot] = {}


def telegram_bot(token: str, api_base: str, purpose="send") -> telegram.Bot:
    """A Bot for this event loop, talking to {api_base}/bot{token}/{method}. Typing
    indicators get a Bot of their own ("typing"): best effort, they must never queue a
    reply behind them."""
    key = (id(asyncio.get_running_loop()), token, api_base.rstrip("/"), purpose)
    if key not in _bots:
        connections = settings.AGENTLOOP_TELEGRAM_CONNECTIONS
        bot = telegram.Bot(token, base_url=f"{api_base.rstrip('/')}/bot",
                           request=AiohttpRequest(connections=connections),
                           get_updates_request=AiohttpRequest(connections=1))  # unused: polling has its own Bot
        _bots[key] = bot
    return _bots[key]


async def close_bots():
    """Close this event loop's bots (their HTTP sessions) on shutdown."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in _bots if k[0] == loop_id]:
        await _bots.pop(key).request.shutdown()  # (Bot.shutdown skips bots never initialize()d)


class TelegramTransport(Transport):
    supports_typing = True

    async def send_text(self, target: Target, text: str) -> SendResult:
        bot = telegram_bot(self.channel.bot_token, self.channel.api_base)
        last_id = ""
        reply = (
            telegram.ReplyParameters(int(target.reply_target), allow_sending_without_reply=True)
            if target.reply_target else None
        )
        try:
            for chunk in split_text(text, TELEGRAM_MAX_CHARS):
                message = await bot.send_message(
                    chat_id=target.chat_id, text=chunk, reply_parameters=reply,
                    message_thread_id=int(target.thread_id) if target.thread_id else None,
                )
                last_id = str(message.message_id)
                reply = None  # only the first chunk threads to the user's message
        except Forbidden as exc:
            return SendResult(False, error=str(exc), permanent=True)
        except TelegramError as exc:
            return SendResult(False, error=f"{type(exc).__name__}: {exc}")
        return SendResult(True, platform_message_id=last_id)

    async def send_typing(self, target: Target) -> None:
        bot = telegram_bot(self.channel.bot_token, self.channel.api_base, "typing")
        await bot.send_chat_action(
            chat_id=target.chat_id, action="typing",
            message_thread_id=int(target.thread_id) if target.thread_id else None,
        )


class StoredTransport(Transport):
    """Web chat, and api channels without a callback: the reply row *is* the delivery;
    clients read it (the playground and the REST API)."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        return SendResult(True)


class ApiCallbackTransport(Transport):
    """api channels with a callback URL: the reply is POSTed, signed with HMAC-SHA256."""

    async def send_text(self, target: Target, text: str) -> SendResult:
        body = json.dumps({"chat": target.chat_id, "reply_to": target.reply_target, "text": text}).encode()
        signature = hmac.new(self.channel.callback_secret.encode(), body, hashlib.sha256).hexdigest()
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                response = await client.post(
                    self.channel.callback_url, content=body,
                    headers={"Content-Type": "application/json", "X-Agentloop-Signature": f"sha256={signature}"},
                )
        except httpx.HTTPError as exc:
            return SendResult(False, error=f"{type(exc).__name__}: {exc}")
        if response.status_code >= 400:
            return SendResult(False, error=f"HTTP {response.status_code}", permanent=response.status_code in (404, 410))
        return SendResult(True)


def transport_for(channel) -> Transport:
    if channel.kind == "telegram":
        return TelegramTransport(channel)
    if channel.kind == "api" and channel.callback_url:
        return ApiCallbackTransport(channel)
    return StoredTransport(channel)
