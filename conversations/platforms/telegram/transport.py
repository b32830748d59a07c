"""Telegram's transport: replies and "typing…" through python-telegram-bot, each send's
error mapped to the ledger's outcomes (delivery.models.Outcome).

Transports are used from the worker's event loop only. python-telegram-bot's Bot must
not be shared across event loops, so bots are cached per loop.
"""

import asyncio
import hashlib

import telegram
from django.conf import settings
from telegram.error import (
    BadRequest,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)

from agentloop.core.caches import BoundedCache
from conversations.platforms.telegram.bot import ReplyBot
from conversations.platforms.telegram.previews import DraftPreview, MessagePreview
from conversations.platforms.telegram.request import AiohttpRequest, NotSent, Redirected
from delivery import attachments, chunks
from delivery.models import Outcome
from delivery.pacing import Pace
from delivery.transports import SendResult, Target, Transport

TELEGRAM_MAX_UNITS = 4096  # a message's length as Telegram counts it: UTF-16 code units
PHOTO_MAX_BYTES = 10 * 1024 * 1024  # sendPhoto's limit; a larger image goes as a document (50 MB)
# Seconds an upload's body may take to write (PTB's 5 s default is for a text's few bytes).
UPLOAD_WRITE_TIMEOUT = 30.0

# Telegram's BadRequest descriptions that mean the chat itself is gone for this bot.
UNREACHABLE_CHAT = ("chat not found", "bot was kicked", "bot is not a member", "user is deactivated",
                    "group chat was deleted", "have no rights to send")

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


def bot_url(api_base: str) -> str:
    """python-telegram-bot's base_url: requests go to {api_base}/bot{token}/{method}."""
    return f"{api_base.rstrip('/')}/bot"


def file_url(api_base: str) -> str:
    """python-telegram-bot's base_file_url: files download from {api_base}/file/bot{token}/{path}."""
    return f"{api_base.rstrip('/')}/file/bot"


def telegram_bot(token: str, api_base: str, purpose="send") -> ReplyBot:
    """A Bot for this event loop, talking to {api_base}/bot{token}/{method}. Typing
    indicators get a Bot of their own ("typing"): best effort, they must never queue a
    reply behind them."""
    key = (id(asyncio.get_running_loop()), token, api_base.rstrip("/"), purpose)
    bot = _bots.get(key)
    if bot is None:
        request = AiohttpRequest(connections=settings.AGENTLOOP_TELEGRAM_CONNECTIONS,
                                 pool_timeout=settings.AGENTLOOP_TELEGRAM_POOL_TIMEOUT,
                                 read_timeout=settings.AGENTLOOP_TELEGRAM_READ_TIMEOUT)
        bot = _bots.set(key, ReplyBot(token, base_url=bot_url(api_base), base_file_url=file_url(api_base),
                                      request=request,
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
    max_album = 10  # sendMediaGroup takes 2-10 items
    caption_units = 1024

    def _bot(self, purpose="send"):
        return telegram_bot(self.channel.setting("bot_token"), self.channel.setting("api_base"), purpose)

    async def send_text(self, target: Target, text: str) -> SendResult:
        bot = self._bot()

        async def send():
            reply, last_id = _reply_to(target), ""
            # The ledger sends a long reply chunk by chunk (delivery.chunks); this split
            # only guards a text that reaches the transport whole.
            pieces = chunks.split(text, TELEGRAM_MAX_UNITS)
            for index, chunk in enumerate(pieces):
                last_id = await bot.send_message_id(
                    target.chat_id, chunk, reply_parameters=reply, message_thread_id=_thread(target),
                    reply_markup=inline_keyboard(target.buttons) if index == len(pieces) - 1 else None,
                )
                reply = None  # only the first chunk threads to the user's message
            return last_id

        return await self.outcome_of(send)

    async def send_files(self, target: Target, files: list, caption: str) -> SendResult:
        """An image as sendPhoto (Telegram shows it), anything else as sendDocument (a
        file to open, e.g. an .ics), several images as one album (sendMediaGroup: the
        caption under the first). The bytes are read from storage before the request:
        a storage failure leaves nothing sent."""
        try:
            blobs = [await asyncio.to_thread(attachments.read, item.file) for item in files]
        except OSError as exc:
            return self.failed(Outcome.TEMPORARY, f"the file could not be read from storage: {type(exc).__name__}")
        bot = self._bot()
        common = {"chat_id": target.chat_id, "reply_parameters": _reply_to(target),
                  "message_thread_id": _thread(target), "write_timeout": UPLOAD_WRITE_TIMEOUT}

        async def send():
            if len(files) > 1:
                # Bytes, not an InputFile: PTB then attaches each as its own part
                # (attach://…), which an album needs.
                media = [telegram.InputMediaPhoto(data, filename=item.name, caption=(caption or None) if index == 0 else None)
                         for index, (item, data) in enumerate(zip(files, blobs, strict=True))]
                sent = await bot.send_media_group(media=media, **common)
                return sent[-1].message_id
            item, data = files[0], blobs[0]
            upload = telegram.InputFile(data, filename=item.name)
            markup = inline_keyboard(target.buttons)
            if item.is_image and item.size <= PHOTO_MAX_BYTES:
                sent = await bot.send_photo(photo=upload, caption=caption or None, reply_markup=markup, **common)
            else:
                sent = await bot.send_document(document=upload, caption=caption or None, reply_markup=markup,
                                               **common)
            return sent.message_id

        return await self.outcome_of(send)

    async def outcome_of(self, send) -> SendResult:
        """Run one send (a coroutine function returning the sent message's id) and map
        what python-telegram-bot raised to the ledger's outcome."""
        try:
            last_id = await send()
        except RetryAfter as exc:  # refused, not sent: the bot waits out the penalty
            return self.failed(Outcome.FLOOD, exc, exc.retry_after)
        except Redirected as exc:  # api_base points elsewhere: its replies wait for an operator
            return self.failed(Outcome.CHANNEL_BLOCKED, exc)
        except InvalidToken as exc:  # 401/404 on the bot's URL: the token was revoked or is wrong
            return self.failed(Outcome.CHANNEL_BLOCKED, f"the bot token was refused: {exc}")
        except Forbidden as exc:  # blocked by the user, kicked from the group
            return self.failed(Outcome.PERMANENT, exc)
        except BadRequest as exc:
            if any(phrase in str(exc).lower() for phrase in UNREACHABLE_CHAT):
                return self.failed(Outcome.PERMANENT, exc)
            # Telegram refused this message (not the chat): resending it as is cannot help.
            return self.failed(Outcome.PERMANENT, f"rejected: {exc}")
        except NotSent as exc:  # never left: resent unlabelled, no attempt spent
            return self.failed(Outcome.NOT_SENT, exc)
        except TimedOut as exc:  # after the request went out: it may have been delivered
            return self.failed(Outcome.AMBIGUOUS, f"timed out: {exc}")
        except NetworkError as exc:
            # PTB maps 5xx answers to NetworkError; our HTTP layer maps a connection lost
            # after the request was sent to SentUnanswered (a NetworkError) — ambiguous.
            kind = Outcome.AMBIGUOUS if getattr(exc, "ambiguous", False) else Outcome.TEMPORARY
            return self.failed(kind, f"{type(exc).__name__}: {exc}")
        except TelegramError as exc:
            return self.failed(Outcome.TEMPORARY, f"{type(exc).__name__}: {exc}")
        except (ValueError, TypeError, LookupError, OverflowError) as exc:
            # An answer PTB could not make sense of (the request went out): it may have landed.
            return self.failed(Outcome.AMBIGUOUS, f"unreadable answer: {type(exc).__name__}")
        return SendResult.delivered(last_id)

    def pace(self, chat_id: str) -> Pace | None:
        """Telegram's limits: per bot (its token, whichever channels share it), per chat,
        and a tighter one per group (a group's chat id is negative)."""
        if str(chat_id).startswith("-"):
            per_minute = float(self.channel.setting("group_messages_per_minute") or 0)
            interval = 60.0 / per_minute if per_minute else 0.0
        else:
            interval = float(self.channel.setting("chat_interval") or 0)
        return self.paced(bot_key(self.channel.setting("bot_token")), str(chat_id), interval)

    # --- streamed replies (docs/streaming.md) ----------------------------------------
    def preview_for(self, target: Target, turn_id: int, message_id: str = ""):
        """Drafts in a private chat; a group (its id is negative) has none: one message,
        edited. `message_id`: a group preview an earlier run of the turn left."""
        if str(target.chat_id).startswith("-"):
            return MessagePreview(self, target, turn_id, message_id)
        return DraftPreview(self, target, turn_id)

    @staticmethod
    def reply_parameters(target: Target) -> telegram.ReplyParameters | None:
        return _reply_to(target)

    async def edit_text(self, target: Target, message_id: str, text: str) -> SendResult:
        bot = self._bot()

        async def edit():
            try:
                await bot.edit_message_text(text, chat_id=int(target.chat_id), message_id=int(message_id),
                                            reply_markup=inline_keyboard(target.buttons))
            except BadRequest as exc:
                if "message is not modified" not in str(exc).lower():
                    raise  # (not modified: it already shows the final)
            return message_id

        return await self.outcome_of(edit)

    async def delete_message(self, target: Target, message_id: str) -> SendResult:
        bot = self._bot()

        async def delete():
            try:
                await bot.delete_message(chat_id=int(target.chat_id), message_id=int(message_id))
            except BadRequest as exc:
                if "not found" not in str(exc).lower():
                    raise  # (not found: gone already, which is what we want)
            return message_id

        return await self.outcome_of(delete)

    # 👌, not ✅: a bot reacts only with Telegram's own reaction emoji (✅ is REACTION_INVALID).
    status_reactions = ("👀", "👌")

    async def set_reaction(self, target: Target, message_id: str, emoji: str, previous: str = "") -> None:
        """setMessageReaction sets the bot's one reaction (an empty list takes it away);
        on the typing indicators' Bot, never in a reply's way."""
        await self._bot("typing").set_message_reaction(
            chat_id=int(target.chat_id), message_id=int(message_id),
            reaction=[telegram.ReactionTypeEmoji(emoji)] if emoji else [])

    async def send_typing(self, target: Target) -> None:
        await self._bot("typing").send_chat_action(
            chat_id=target.chat_id, action="typing",
            message_thread_id=_thread(target),
        )


def _reply_to(target: Target) -> telegram.ReplyParameters | None:
    """The user's message a send threads to (sent anyway if it was deleted)."""
    if not target.reply_target:
        return None
    return telegram.ReplyParameters(int(target.reply_target), allow_sending_without_reply=True)


def _thread(target: Target) -> int | None:
    return int(target.thread_id) if target.thread_id else None


def bot_key(token: str) -> str:
    """The bot's pacing key: its token's digest (the token itself is a secret)."""
    return "telegram:" + hashlib.sha256(token.encode()).hexdigest()[:20]


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
        bot = telegram.Bot(channel.setting("bot_token"), base_url=bot_url(channel.setting("api_base")),
                           request=request,
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
