"""Tell Telegram where to deliver a channel's updates (setWebhook, with the secret)."""

import asyncio
import secrets

import telegram
from django.core.management.base import BaseCommand, CommandError
from django.urls import reverse
from telegram.error import TelegramError

from conversations.models import Channel, ChannelKind, TelegramMode
from conversations.telegram import ALLOWED_UPDATES


class Command(BaseCommand):
    help = ("Register a Telegram channel's webhook with Telegram: --url is this site's public HTTPS address "
            "(the webhook path is added) or the full webhook URL. --delete goes back to no webhook.")

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--url", help="Public base URL, e.g. https://bot.example.com")
        parser.add_argument("--delete", action="store_true", help="Remove the webhook (then use polling).")
        parser.add_argument("--drop-pending", action="store_true", help="Discard updates Telegram is holding.")

    def handle(self, *args, slug, url, delete, drop_pending, **options):
        channel = Channel.objects.filter(slug=slug, kind=ChannelKind.TELEGRAM).first()
        if channel is None:
            raise CommandError(f"no Telegram channel {slug!r}")
        if not channel.bot_token:
            raise CommandError(f"channel {slug!r} has no bot token")
        if not delete and not url:
            raise CommandError("give --url (this site's public address) or --delete")
        bot = telegram.Bot(channel.bot_token, base_url=f"{channel.api_base.rstrip('/')}/bot")
        try:
            if delete:
                asyncio.run(self._call(bot, bot.delete_webhook(drop_pending_updates=drop_pending)))
                channel.telegram_mode = TelegramMode.POLLING
                channel.save(update_fields=["telegram_mode"])
                self.stdout.write(f"webhook removed; {slug} now uses long polling")
                return
            path = reverse("telegram-webhook", args=[slug])
            full = url if url.rstrip("/").endswith(path.rstrip("/")) else url.rstrip("/") + path
            if not full.startswith("https://"):
                self.stderr.write("warning: Telegram only delivers to https:// URLs")
            if not channel.webhook_secret:
                channel.webhook_secret = secrets.token_urlsafe(24)
            asyncio.run(self._call(bot, bot.set_webhook(
                url=full, secret_token=channel.webhook_secret, allowed_updates=ALLOWED_UPDATES,
                drop_pending_updates=drop_pending)))
        except TelegramError as exc:
            raise CommandError(f"Telegram refused: {exc}") from exc
        channel.telegram_mode = TelegramMode.WEBHOOK
        channel.save(update_fields=["telegram_mode", "webhook_secret"])
        self.stdout.write(f"webhook set: {full} (updates carry the channel's secret)")

    @staticmethod
    async def _call(bot, request):
        async with bot:
            return await request
