import argparse
import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from conversations import platforms
from conversations.models import Channel, DoubleTexting, EditsPolicy, TypingMode

# option name -> model field; only options given on the command line are changed. A
# platform's own settings come from its Platform.options() (see add_platform_options).
FIELDS = {
    "name": "name", "kind": "kind", "strategy": "double_texting",
    "window_closed": "window_closed", "window_greeting": "window_greeting",
    "window_open": "window_open", "window_neutral": "window_neutral", "window_media": "window_media",
    "window_album": "window_album", "media_at_once": "media_at_once", "max_wait": "max_wait",
    "max_messages": "max_messages", "greetings": "greeting_words", "conjunctions": "conjunction_words",
    "agent": "agent", "typing_mode": "typing_mode", "edits": "edits",
}


# option name -> key in the channel's agent_config.
AGENT_OPTIONS = {"agent_base_url": "base_url", "agent_model": "model", "agent_key_env": "api_key_env",
                 "system_prompt": "system_prompt", "agent_url": "url", "agent_secret": "secret"}


class Command(BaseCommand):
    help = "Create or update a channel (re-running with the same slug updates it)."

    def add_arguments(self, parser):
        parser.add_argument("slug")
        parser.add_argument("--name")
        parser.add_argument("--kind", choices=[kind for kind, _ in platforms.choices()])
        add_platform_options(parser)
        parser.add_argument("--strategy", choices=DoubleTexting.values, help="Double-texting strategy.")
        for kind in ("closed", "greeting", "open", "neutral", "media", "album"):
            parser.add_argument(f"--window-{kind}", type=float, help=f"The {kind} window, seconds.")
        parser.add_argument("--media-at-once", action=argparse.BooleanOptionalAction, default=None,
                            help="Flush a buffer at once when media arrives (default: a window).")
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
        parser.add_argument("--inactive", action="store_true", help="Create or set the channel inactive.")

    def handle(self, *args, slug, **options):
        channel = Channel.objects.filter(slug=slug).first()
        created = channel is None
        if created:
            channel = Channel(slug=slug, kind=options["kind"] or "api")
        elif options.get("kind") not in (None, channel.kind):
            channel.platform_settings = {}  # another platform's settings mean nothing to this one
        for option, field in FIELDS.items():
            if options.get(option) is not None:
                setattr(channel, field, options[option])
        try:
            platform = channel.platform
        except LookupError as exc:
            raise CommandError(str(exc)) from exc
        refuse_foreign_options(platform, options)
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
        stored = dict(channel.platform_settings or {})
        notes = platform.apply_options(channel, options) or []
        refuse_moved_secrets(platform, stored, channel.platform_settings, options)
        try:
            channel.full_clean()
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())) from exc
        channel.save()
        self.stdout.write(f"{'created' if created else 'updated'} channel {channel.slug} ({channel.kind})")
        for note in notes:
            self.stdout.write(note)


def _dest(flag) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_platform_options(parser):
    """Every platform's settings as flags; a flag several platforms share (--token,
    --api-base) is added once and says whose it is."""
    owners: dict[str, list] = {}
    for platform in platforms.all_platforms():
        for flag, (_name, spec) in platform.options().items():
            owners.setdefault(flag, []).append((platform, spec))
    for flag, users in owners.items():
        choices = sorted({c for _, spec in users for c in spec.choices}) or None
        help_text = "; ".join(f"{platform.label}: {spec.help or _name_of(platform, flag)}" for platform, spec in users)
        parser.add_argument(flag, dest=_dest(flag), choices=choices, help=help_text)


def _name_of(platform, flag) -> str:
    return platform.options()[flag][0].replace("_", " ")


def refuse_moved_secrets(platform, stored, values, options):
    """A new address for a stored secret (--api-base) needs the secret given again."""
    given = {name for flag, (name, spec) in platform.options().items()
             if spec.secret and options.get(_dest(flag)) is not None}
    again = platform.secrets_to_give_again(stored, values, given)
    if again:
        flags = ", ".join(spec.flag(name) for name, spec in platform.settings.items() if name in again)
        raise CommandError(f"the address the stored {', '.join(again)} is sent to changed: give {flags} again "
                           f"(a stored secret is never sent to a new host)")


def refuse_foreign_options(platform, options):
    """A platform flag given to a channel of another platform is a mistake, said at once."""
    own = {_dest(flag) for flag in platform.options()}
    for other in platforms.all_platforms():
        for flag in other.options():
            if _dest(flag) not in own and options.get(_dest(flag)) is not None:
                raise CommandError(f"{flag} is not a setting of {platform.label} channels "
                                   f"({_dest(flag)}: a {other.label} setting)")


