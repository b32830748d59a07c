"""Telegram long polling (getUpdates) as a Connection (conversations.platforms.inbound):
conversations.platforms.connection runs it, as every platform that keeps a connection —
one poller per bot across all workers under the channel's lease, the next offset stored
as its cursor once a batch is admitted, opened again after a drop with a growing delay.
A crash between the admission and the offset polls the batch again, and the dedup drops
what got in. What is Telegram's own is here: which channels poll, the session (a Bot,
getUpdates from the stored offset) and an update parsed (the webhook's parsing)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import telegram
from django.conf import settings
from telegram.error import Conflict, NetworkError, TelegramError

from conversations.models import Channel
from conversations.platforms.inbound import Connection, Parsed, Receive
from conversations.platforms.telegram import callbacks, parsing
from conversations.platforms.telegram.transport import bot_url
from conversations.platforms.telegram.webhook import MALFORMED, parse_update

if TYPE_CHECKING:  # for annotations only
    from collections.abc import Sequence

log = logging.getLogger(__name__)

POLLING = "polling"  # the channel's mode (its package's Setting; not imported from there: no cycle)
STOPPED_FOR = 60.0  # seconds: a bot Telegram refuses (a revoked token) is not asked again sooner


class TelegramPolling(Connection):
    # How an unstorable message's refusal is audited: the offset moves past it, so one bad
    # update never stalls the bot.
    refusal_source = "long polling"

    def channel_ids(self) -> list[int]:
        """The active Telegram channels in polling mode that have a bot token."""
        rows = Channel.objects.filter(kind=self.kind, is_active=True, platform_settings__mode=POLLING)
        return [pk for pk, values in rows.values_list("pk", "platform_settings") if (values or {}).get("bot_token")]

    async def session(self, channel: Channel, cursor: int | None, receive: Receive) -> None:
        """A Bot of its own (rebuilt on every reconnect), its webhook deleted, then
        getUpdates from the stored offset for as long as the lease is held."""
        bot = telegram.Bot(channel.setting("bot_token"), base_url=bot_url(channel.setting("api_base")))
        try:
            async with bot:
                await bot.delete_webhook()  # getUpdates is refused while a webhook is set
                await poll(bot, cursor, receive)
        except (NetworkError, Conflict):
            raise  # the connection opens again with a new Bot, after a growing delay
        except TelegramError as exc:  # InvalidToken among them: asking again soon cannot help
            log.error("channel %s: polling stopped: %s", channel.slug, exc)
            await asyncio.sleep(STOPPED_FOR)

    def parse(self, channel: Channel, payload: Any) -> Parsed | None:
        """A message, an edit or a reaction, as the webhook parses them; a tap on a
        question's button is handled here (it is no message). A malformed update is
        skipped (the offset moves past it)."""
        if callbacks.is_callback(payload):
            callbacks.handle_callback(channel, payload)
            return None
        try:
            return parse_update(channel, payload)
        except MALFORMED as exc:
            log.warning("channel %s: skipping malformed update %s: %s", channel.slug, _update_id(payload), exc)
            return None


async def poll(bot: telegram.Bot, offset: int | None, receive: Receive) -> None:
    while True:
        updates: Sequence[telegram.Update] = await bot.get_updates(
            offset=offset, timeout=settings.AGENTLOOP_TELEGRAM_POLL_TIMEOUT, allowed_updates=parsing.ALLOWED_UPDATES)
        if updates:
            offset = max(update.update_id for update in updates) + 1
            # Returns once the batch is admitted and the offset stored: only then is it
            # confirmed to Telegram (by the next getUpdates' offset).
            await receive([update.to_dict() for update in updates], offset)


def _update_id(payload: Any) -> object:
    return payload.get("update_id") if isinstance(payload, dict) else None
