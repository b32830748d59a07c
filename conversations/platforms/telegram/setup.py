"""Telling Telegram where a channel's updates go (setWebhook with the channel's secret,
or deleteWebhook for long polling): the `setwebhook` command's logic."""

import asyncio
import secrets

import telegram
from django.urls import reverse

from conversations.platforms.telegram.parsing import ALLOWED_UPDATES
from conversations.platforms.telegram.transport import bot_url

WEBHOOK, POLLING = "webhook", "polling"


def webhook_path(slug) -> str:
    return reverse("telegram:webhook", args=[slug])


def _bot(channel) -> telegram.Bot:
    return telegram.Bot(channel.setting("bot_token"), base_url=bot_url(channel.setting("api_base")))


async def _call(bot, request):
    async with bot:
        return await request


def set_webhook(channel, url: str, drop_pending=False) -> str:
    """Register the webhook (`url`: the site's public base URL or the full webhook URL);
    generates the channel's webhook secret if it has none. Returns the full URL.
    Raises telegram.error.TelegramError when Telegram refuses."""
    path = webhook_path(channel.slug)
    full = url if url.rstrip("/").endswith(path.rstrip("/")) else url.rstrip("/") + path
    settings = dict(channel.platform_settings or {})
    settings.setdefault("webhook_secret", "")
    if not settings["webhook_secret"]:
        settings["webhook_secret"] = secrets.token_urlsafe(24)
    bot = _bot(channel)
    asyncio.run(_call(bot, bot.set_webhook(url=full, secret_token=settings["webhook_secret"],
                                           allowed_updates=ALLOWED_UPDATES, drop_pending_updates=drop_pending)))
    channel.platform_settings = {**settings, "mode": WEBHOOK}
    channel.save(update_fields=["platform_settings"])
    return full


def delete_webhook(channel, drop_pending=False) -> None:
    """Remove the webhook: the channel goes back to long polling."""
    bot = _bot(channel)
    asyncio.run(_call(bot, bot.delete_webhook(drop_pending_updates=drop_pending)))
    channel.platform_settings = {**(channel.platform_settings or {}), "mode": POLLING}
    channel.save(update_fields=["platform_settings"])
