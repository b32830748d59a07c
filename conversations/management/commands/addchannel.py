import argparse
import json
import secrets

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from conversations.models import Channel, ChannelKind, DoubleTexting, EditsPolicy, TelegramMode, TypingMode

# option name -> model field; only options given on the command line are changed.
FIELDS = {
    "name": "name", "kind": "kind", "token": "bot_token", "secret": "webhook_secret",
    "api_base": "api_base", "mode": "telegram_mode", "strategy": "double_texting",
    "window_closed": "window_closed", "window_greeting": "window_greeting",
    "window_open": "window_open", "window_neutral": "window_neutral", "max_wait": "max_wait",
    "max_messages": "max_messages", "greetings": "greeting_words", "conjunctions": "conjunction_words",
    "agent": "agent", "callback_url": "callback_url", "callback_secret": "callback_secret",
    "typing_mode": "typing_mode", "edits": "edits",
}


# option name -> key in the channel's agent_config.
AGENT_OPTIONS = {"agent_base_url": "base_url", "agent_model": "model", "agent_key_env": "api_key_env",
                 "system_prompt": "system_prompt", "agent_url": "url", "agent_secret": "secret"}


class Command(BaseCommand):
    help = "Create or update a channel (re-running with the same slug updates it)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name")
        parser.add_argument("--kind", choices=ChannelKind.values)
        parser.add_argument("--token", help="Telegram bot token (from BotFather).")
        parser.add_argument("--secret", help="Telegram webhook secret token (generated when missing).")
        parser.add_argument("--api-base", help="Bot API root (default https://api.telegram.org).")
        parser.add_argument("--mode", choices=TelegramMode.values, help="Telegram: webhook or polling.")
        parser.add_argument("--strategy", choices=DoubleTexting.values, help="Double-texting strategy.")
        for kind in ("closed", "greeting", "open", "neutral"):
            parser.add_argument(f"--window-{kind}", type=float, help=f"The {kind} window, seconds.")
        parser.add_argument("--max-wait", type=float, help="Max seconds a buffer waits.")
        parser.add_argument("--max-messages", type=int, help="Max messages in a buffer.")
        parser.add_argument("--greetings", help="Comma-separated greeting words and phrases.")
        parser.add_argument("--conjunctions", help="Comma-separated conjunctions.")
        parser.add_argument("--agent", help="Agent: demo, openai, webhook, pull, echo (default echo).")
        parser.add_argument("--agent-config", help="Agent settings as JSON (merged into the existing ones).")
        parser.add_argument("--agent-base-url", help="openai: the OpenAI-compatible server's base URL.")
        parser.add_argument("--agent-model", help="openai: the model name.")
        parser.add_argument("--agent-key-env", help="openai: environment variable holding the API key.")
        parser.add_argument("--system-prompt", help="openai: the system prompt.")
        parser.add_argument("--agent-url", help="webhook: the agent service's URL.")
        parser.add_argument("--agent-secret", help="webhook: HMAC key for the request signature.")
        parser.add_argument("--typing-mode", choices=TypingMode.values,
                            help="When to show typing: instant (from the first message), turn, never.")
        parser.add_argument("--typing", action=argparse.BooleanOptionalAction,
                            help="Shorthand: --typing is --typing-mode instant, --no-typing is never.")
        parser.add_argument("--edits", choices=EditsPolicy.values, help="What a user's edit does: apply or ignore.")
        parser.add_argument("--callback-url", help="api channels: where replies are POSTed.")
        parser.add_argument("--callback-secret", help="api channels: HMAC key for the callback.")
        parser.add_argument("--inactive", action="store_true", help="Create or set the channel inactive.")

    def handle(self, *args, slug, **options):
        channel = Channel.objects.filter(slug=slug).first()
        created = channel is None
        if created:
            channel = Channel(slug=slug, kind=options["kind"] or ChannelKind.API)
        for option, field in FIELDS.items():
            if options.get(option) is not None:
                setattr(channel, field, options[option])
        if options.get("agent_config") is not None:
            try:
                given = json.loads(options["agent_config"])
            except ValueError as exc:
                raise CommandError(f"--agent-config is not JSON: {exc}") from exc
            if not isinstance(given, dict):
                raise CommandError("--agent-config must be a JSON object")
            channel.agent_config = {**(channel.agent_config or {}), **given}
        for option, key in AGENT_OPTIONS.items():
            if options.get(option) is not None:
                channel.agent_config = {**(channel.agent_config or {}), key: options[option]}
        if options.get("typing") is not None:
            channel.typing_mode = TypingMode.INSTANT if options["typing"] else TypingMode.NEVER
        if options["inactive"]:
            channel.is_active = False
        generated = ""
        if channel.kind == ChannelKind.TELEGRAM and channel.telegram_mode == TelegramMode.WEBHOOK \
                and not channel.webhook_secret:
            channel.webhook_secret = generated = secrets.token_urlsafe(32)
        try:
            channel.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        channel.save()
        self.stdout.write(f"{'created' if created else 'updated'} channel {channel.slug} ({channel.kind})")
        if generated:
            self.stdout.write(f"webhook secret: {generated}")


