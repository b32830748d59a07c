"""What a platform is to the rest of the product: one subclass of `Platform` per
package under conversations/platforms/, registered by dotted path in
settings.AGENTLOOP_PLATFORMS (see conversations.platforms).

Everything a platform means lives in its package: parsing its webhook into our own
types (conversations.ingest.Inbound, conversations.edits.Edit), its views, its transport
(delivery.transports.Transport: send, typing, outcome mapping), its polling if any, its
settings (a dict checked on save, stored in Channel.platform_settings), and its
`addchannel` options. The rest of the product asks the registry, never `channel.kind`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agentloop.core.redaction import url_secrets
from conversations.models import Channel

if TYPE_CHECKING:  # for annotations only
    from django.core.management.base import OutputWrapper
    from django.urls import URLPattern, URLResolver
    from django_stubs_ext import StrOrPromise

    from conversations.platforms.inbound import Connection, Webhook
    from delivery.transports import Transport
    from tools.models import Confirmation


@dataclass(frozen=True)
class Setting:
    """One per-platform setting of a channel (a key of Channel.platform_settings).

    `secret`: masked in the admin and in every error text (agentloop.core.redaction).
    `required_to_send`: while empty, the channel's replies wait (Channel.send_blocked).
    `required_to_receive`: while empty, every request the platform sends is refused (the
    secret its signature is checked with); an active channel needs both kinds.
    `check`: raises ValidationError (or ValueError) for a bad value; returns it cleaned.
    `carries`: the secret settings sent to this address (a Bot API root and its token):
    when it changes, they must be given again, never sent on to the new host unasked."""

    default: Any = ""
    # Both marked for translation: the channel form shows them in the operator's language.
    label: StrOrPromise = ""  # empty: the name, capitalised ("Bot token")
    help: StrOrPromise = ""
    secret: bool = False
    required_to_send: bool = False
    required_to_receive: bool = False
    choices: tuple[Any, ...] = ()
    check: Callable[[Any], Any] | None = None
    option: str = ""  # the addchannel flag ("--token"); "" = --<name with dashes>
    carries: tuple[str, ...] = ()

    def flag(self, name: str) -> str:
        return self.option or "--" + name.replace("_", "-")


class Platform(abc.ABC):
    kind: str = ""
    label: str = ""
    settings: dict[str, Setting] = {}
    # The chat shows answer buttons under a message (a question asking to confirm an
    # action; tools.confirmations). Without them the user answers yes or no in words.
    has_buttons: bool = False
    # A user's answer to such a question reaches us only from the platform itself, so
    # `approval = user` can trust it. False where an agent key posts the channel's
    # messages as any contact (the api platform): the agent that asked could say "yes";
    # the guard refuses `approval = user` there (tools.guard.running).
    user_can_confirm: bool = True
    # How long after the user's last message the platform takes a message we start (a
    # scheduled one); None: any time. WhatsApp: 24 hours, then only approved templates.
    reply_window: timedelta | None = None
    # Offered to operators as a channel's kind (False: the replays' sandbox, which only a
    # replay makes, inside its own transaction).
    listed: bool = True
    # Replies go out at all (False: the reply row *is* the delivery, read through the API).
    # An instance attribute may depend on the channel: see transport().

    # --- settings -------------------------------------------------------------------
    def clean_settings(self, values: dict[str, Any] | None) -> dict[str, Any]:
        """The channel's settings with defaults filled and each value checked; unknown
        keys are refused (a typo must not pass as a setting)."""
        values = dict(values or {})
        unknown = sorted(set(values) - set(self.settings))
        if unknown:
            raise ValidationError({"platform_settings": gettext("unknown %(platform)s setting(s): %(names)s") % {
                "platform": self.label, "names": ", ".join(unknown)}})
        cleaned: dict[str, Any] = {}
        errors: dict[str, list[str]] = {}
        for name, spec in self.settings.items():
            value = values.get(name, spec.default)
            try:
                if spec.choices and value not in spec.choices:
                    raise ValidationError(gettext("must be one of %(choices)s") % {
                        "choices": ", ".join(map(str, spec.choices))})
                cleaned[name] = spec.check(value) if spec.check and value not in ("", None) else value
            except (ValidationError, ValueError, TypeError) as exc:
                errors[name] = exc.messages if isinstance(exc, ValidationError) else [str(exc)]
        if errors:
            raise ValidationError({"platform_settings": [f"{name}: {'; '.join(msgs)}" for name, msgs in errors.items()]})
        return cleaned

    def missing_to_run(self, values: dict[str, Any]) -> list[str]:
        """The settings `required_to_send` or `required_to_receive` empty in `values`: an
        active channel cannot work without them, so the admin refuses to save it so (a new
        platform declares its own and gets the refusal for free). An inactive one may wait."""
        return [name for name, spec in self.settings.items()
                if (spec.required_to_send or spec.required_to_receive) and not values.get(name)]

    def send_blocked(self, channel: Channel) -> str:
        """Why this channel's replies must wait ("" = they may go). Stored on save in
        Channel.send_blocked, the one column the ledger's claim reads."""
        missing = [name for name, spec in self.settings.items()
                   if spec.required_to_send and not (channel.platform_settings or {}).get(name)]
        return f"no {', '.join(missing)} set" if missing else ""

    def secrets_to_give_again(self, stored: dict[str, Any], values: dict[str, Any], given: set[str]) -> list[str]:
        """The secret settings `values` keeps from `stored` (not in `given`) although the
        address they are sent to changed: they must be given again (or forgotten)."""
        again = []
        for name, spec in self.settings.items():
            if spec.carries and _address(values.get(name), spec) != _address(stored.get(name), spec):
                again += [secret for secret in spec.carries
                          if secret not in given and stored.get(secret) and values.get(secret) == stored.get(secret)]
        return again

    def secrets(self, channel: Channel | dict[str, Any]) -> list[str]:
        """The values of this channel's secret settings, and the secrets in its URLs
        (masked in every error text). `channel`: a Channel, or a dict of its fields."""
        values = channel.get("platform_settings") if isinstance(channel, dict) else channel.platform_settings
        values = values if isinstance(values, dict) else {}
        found = [str(v) for name, spec in self.settings.items() if spec.secret and (v := values.get(name))]
        for name, value in values.items():
            if isinstance(value, str) and (name.endswith("url") or name.endswith("base")):
                found += url_secrets(value)
        return found

    # --- delivery ---------------------------------------------------------------------
    @abc.abstractmethod
    def transport(self, channel: Channel) -> Transport:
        """The delivery.transports.Transport that sends this channel's replies (the one
        hook every platform must give: the ledger sends through it)."""

    def template_for(self, channel: Channel, text: str, chosen: dict[str, str]) -> dict[str, Any] | None:
        """The approved template a message we start outside `reply_window` goes out as,
        filled with `text` ({"name", "language", "parameters"}: delivery.templates), or
        None: the platform has none set, so the message waits for the window. `chosen`:
        the message's own choice ("name", "language", "fill"; each left out: the channel's)."""
        return None

    # --- inbound ----------------------------------------------------------------------
    def urls(self) -> list[URLPattern | URLResolver]:
        """URL patterns, mounted under /webhooks/<kind>/: the webhook's (`webhook()`), and
        more where a platform has them (Slack's interactivity endpoint)."""
        webhook = self.webhook()
        return list(webhook.urls()) if webhook is not None else []

    def webhook(self) -> Webhook | None:
        """The platform's webhook: a conversations.platforms.inbound.Webhook (find the
        channel → authenticate → parse → admit), whose `urls()` this platform's `urls()`
        mounts, and which the lean ASGI path (conversations/lean_ingest.py) drives too
        when its `lean` is set. None: the platform takes no webhook."""
        return None

    def connection(self) -> Connection | None:
        """The platform's connection, for a platform that keeps one open per channel or
        polls (a conversations.platforms.inbound.Connection: Discord's Gateway, Slack Socket
        Mode, Matrix sync, Telegram's getUpdates): the worker runs one per channel across all workers
        (conversations.platforms.connection), resumed from its stored cursor, its items
        admitted as a webhook's. None: it has none."""
        return None

    async def fetch_media(self, channel: Channel, ref: str, limit: int) -> bytes:
        """The bytes of the file `ref` names (a MediaRef's `ref`), at most `limit` of them
        (conversations.media.download.fetch_bytes enforces it while reading). Raises
        conversations.media.download.FileUnavailable (`permanent` when trying again
        cannot help) or FileTooLarge. The worker calls it under an overall deadline."""
        from conversations.media.download import FileUnavailable  # the platform registry loads before apps

        raise FileUnavailable(f"{self.label} files cannot be fetched", permanent=True)

    async def close_clients(self) -> None:
        """Close the HTTP clients this platform's transports opened on the running event
        loop (the worker's shutdown, the safety sweep's end)."""

    # --- confirmations (platforms with buttons) -------------------------------------------
    def question_decided(self, channel: Channel, confirmation: Confirmation, outcome: str, status: str) -> None:
        """The question's message shows `outcome` instead of its buttons (best effort)."""

    # --- operators ----------------------------------------------------------------------
    # addchannel's options: one flag per setting (Setting.flag). Platforms may share a
    # flag (--token, --api-base): the command adds each flag once, and a channel takes
    # the flags its own platform names (options are keyed by flag: "token", "api_base").
    def options(self) -> dict[str, tuple[str, Setting]]:
        """{flag: (setting name, spec)}."""
        return {spec.flag(name): (name, spec) for name, spec in self.settings.items()}

    def apply_options(self, channel: Channel, options: dict[str, Any]) -> list[str]:
        """Copy the addchannel options given for this platform into the channel's
        settings. Returns lines for the operator (e.g. a secret generated for them)."""
        channel.platform_settings = dict(channel.platform_settings or {})
        for flag, (name, _spec) in self.options().items():
            value = options.get(flag.lstrip("-").replace("-", "_"))
            if value is not None:
                channel.platform_settings[name] = value
        return []

    def demo_channel(self, slug: str, name: str, settings: dict[str, Any]) -> Channel:
        """`make run`'s channel of this platform, created or brought up to date: its
        settings from the environment over those it already had, the demo agent."""
        channel = Channel.objects.filter(slug=slug).first() or Channel(slug=slug)
        kept = (channel.platform_settings or {}) if channel.kind == self.kind else {}
        channel.name, channel.kind, channel.is_active, channel.agent = name, self.kind, True, "demo"
        channel.platform_settings = {**kept, **settings}
        channel.save()
        return channel

    def bootstrap(self, stdout: OutputWrapper | None) -> str:
        """`make run`: create this platform's demo channel from the environment, if the
        environment names one (e.g. TELEGRAM_BOT_TOKEN). Returns the line `make run`
        prints about it ("" for none)."""
        return ""


def _address(value: Any, spec: Setting) -> str:
    return str(value or spec.default or "").strip().rstrip("/")


def check_rate(value: str | float) -> float:
    """A Setting.check for a rate or an interval: a number, 0 or more (0: no limit)."""
    number = float(value)
    if number < 0 or number != number or number == float("inf"):
        raise ValidationError(gettext("a number, 0 or more (0: no limit)"))
    return number


def pace_settings(per_second: float, chat_interval: float, group_per_minute: float = 0.0) -> dict[str, Setting]:
    """The pacing settings a platform with documented send limits gives its channels
    (delivery.pacing): defaults just below the platform's own limits."""
    found = {
        "messages_per_second": Setting(label=_("Messages per second"), default=per_second, check=check_rate,
                                       help=_("Sends per second of this bot or number, across every worker (0: unpaced).")),
        "chat_interval": Setting(label=_("Chat interval"), default=chat_interval, check=check_rate,
                                 help=_("Seconds between two sends into one chat (0: unpaced).")),
    }
    if group_per_minute:
        found["group_messages_per_minute"] = Setting(label=_("Group messages per minute"), default=group_per_minute, check=check_rate,
                                                     help=_("Sends per minute into one group (0: unpaced)."))
    return found


def check_url(value: str) -> str:
    """A Setting.check for URLs (http or https)."""
    URLValidator(schemes=["http", "https"])(value)
    return value

