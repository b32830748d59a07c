"""Tell Telegram where to deliver a channel's updates (setWebhook, with the secret);
the logic is the Telegram package's (conversations/platforms/telegram/setup.py)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from telegram.error import TelegramError

from conversations.models import Channel
from conversations.platforms.telegram import TelegramPlatform, setup


class Command(BaseCommand):
    help = ("Register a Telegram channel's webhook with Telegram: --url is this site's public HTTPS address "
            "(the webhook path is added) or the full webhook URL. --delete goes back to no webhook.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("slug")
        parser.add_argument("--url", help="Public base URL, e.g. https://bot.example.com")
        parser.add_argument("--delete", action="store_true", help="Remove the webhook (then use polling).")
        parser.add_argument("--drop-pending", action="store_true", help="Discard updates Telegram is holding.")

    def handle(self, *args: Any, slug: str, url: str | None, delete: bool, drop_pending: bool,
               **options: Any) -> None:
        channel = Channel.objects.filter(slug=slug, kind=TelegramPlatform.kind).first()
        if channel is None:
            raise CommandError(f"no Telegram channel {slug!r}")
        if not channel.setting("bot_token"):
            raise CommandError(f"channel {slug!r} has no bot token")
        url = url or ""
        if not delete and not url:
            raise CommandError("give --url (this site's public address) or --delete")
        try:
            if delete:
                setup.delete_webhook(channel, drop_pending)
                self.stdout.write(f"webhook removed; {slug} now uses long polling")
                return
            if not url.startswith("https://"):
                self.stderr.write("warning: Telegram only delivers to https:// URLs")
            full = setup.set_webhook(channel, url, drop_pending)
        except TelegramError as exc:
            raise CommandError(f"Telegram refused: {exc}") from exc
        self.stdout.write(f"webhook set: {full} (updates carry the channel's secret)")
