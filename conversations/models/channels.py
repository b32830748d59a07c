"""Channels (a bot, a WhatsApp number, a web chat, an API channel) and their settings."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agentloop.core import plugins
from agentloop.core.caches import BoundedCache
from conversations import windows

if TYPE_CHECKING:
    from django.utils.functional import _StrOrPromise

    from conversations.platforms.base import Platform


def _platform_choices() -> list[tuple[str, str]]:
    """Channel.kind's choices (a callable, so the migration does not freeze them)."""
    return [(kind, platform.label) for kind, platform in plugins.instances("AGENTLOOP_PLATFORMS").items()
            if platform.listed]


def _language_choices() -> list[tuple[str, _StrOrPromise]]:
    return [("", _("The deployment's (AGENTLOOP_LANGUAGE)")), *settings.LANGUAGES]


class DoubleTexting(models.TextChoices):
    """What happens to a message that arrives while the conversation's turn runs."""

    ENQUEUE = "enqueue", _("Enqueue: merge into the next turn")
    REJECT = "reject", _("Reject: ask the user to wait")
    INTERRUPT = "interrupt", _("Interrupt: cancel the turn, keep its input")
    ROLLBACK = "rollback", _("Rollback: cancel the turn, drop its input")


class TypingMode(models.TextChoices):
    """When the bot shows "typing…" (where the platform can show it at all)."""

    INSTANT = "instant", _("Instant: from the first message of a burst, through the window and the turn")
    TURN = "turn", _("Turn: only while the agent runs")
    NEVER = "never", _("Never")


class EditsPolicy(models.TextChoices):
    """What an edit of a message the user already sent does."""

    APPLY = "apply", _("Apply: the corrected text counts")
    IGNORE = "ignore", _("Ignore edits")


class StaleRecoveries(models.TextChoices):
    """What a recovered reply (the ledger's labelled resend) does when its conversation has
    since had a newer reply delivered: the person has moved on from it."""

    DATED = "dated", _("Dated: sent, its label saying when it was written")
    DROP = "drop", _("Drop: abandoned (audited), not sent")


class StatusReaction(models.TextChoices):
    """A reaction agentloop puts on the person's message while it is being answered."""

    OFF = "off", _("Off")
    SEEN_DONE = "seen_done", _("👀 while the window and the turn run, then ✅ when answered")
    SEEN = "seen", _("👀 while the window and the turn run, removed when answered")


class GroupReplies(models.TextChoices):
    """Which messages in a group chat the agent answers (the rest are kept as context)."""

    ALWAYS = "always", _("Always: every message in a group")
    MENTION = "mention", _("Mention: only messages that mention the bot or reply to it")
    NEVER = "never", _("Never: groups are read, never answered")


def _default_greetings() -> str:
    return ", ".join(windows.DEFAULT_GREETINGS)


def _default_conjunctions() -> str:
    return ", ".join(windows.DEFAULT_CONJUNCTIONS)


class ChannelManager(models.Manager["Channel"]):
    # Inbound requests look their channel up on every message; a copy at most this
    # old is good enough (operators' edits apply within a second or two). Both caches are
    # bounded: an anonymous client choosing slugs must not grow the process. Unknown slugs
    # get a small cache of their own, so they never push a real channel out.
    CACHE_SECONDS = 2.0
    _cache: BoundedCache[str, Channel | None] = BoundedCache(maxsize=1000, max_age=CACHE_SECONDS)
    _unknown: BoundedCache[str, Channel | None] = BoundedCache(maxsize=256, max_age=CACHE_SECONDS)

    def active(self, slug: str, kind: str | None = None) -> Channel | None:
        """The active channel with this slug (and kind), from a short per-process cache."""
        channel = self._cache.get(slug)
        if channel is None and slug not in self._unknown:
            channel = self.filter(slug=slug, is_active=True).first()
            (self._cache if channel is not None else self._unknown).set(slug, channel)
        return channel if channel is not None and (kind is None or channel.kind == kind) else None

    def forget_cached(self) -> None:
        self._cache.clear()
        self._unknown.clear()

    def cache_size(self) -> int:
        """Entries held by this process's channel caches (for tests and operators)."""
        return len(self._cache) + len(self._unknown)


class Channel(models.Model):
    slug = models.SlugField(_("slug"), unique=True)
    name = models.CharField(_("name"), max_length=100, blank=True)
    # The platform (conversations.platforms, settings.AGENTLOOP_PLATFORMS).
    kind = models.CharField(_("kind"), max_length=16, choices=_platform_choices, default="api")
    is_active = models.BooleanField(_("is active"), default=True)
    # The platform's own settings (bot token, webhook secret, callback URL…), checked on
    # save against its Platform.settings.
    platform_settings = models.JSONField(_("platform settings"), default=dict, blank=True)
    # Why replies must wait ("" = they may go): computed on save from the platform's
    # settings, and set by delivery when the platform refuses the channel's credentials.
    # The ledger's claim reads this column and no other platform rule.
    send_blocked = models.CharField(_("send blocked"), max_length=300, blank=True, default="")

    # Polling platforms (Telegram's getUpdates): the next offset, persisted so a restarted
    # poller never re-reads confirmed updates.
    poll_offset = models.BigIntegerField(_("poll offset"), null=True, blank=True)
    # One poller per channel across all workers (Telegram answers 409 to concurrent getUpdates).
    poll_owner = models.CharField(_("poll owner"), max_length=100, blank=True)
    poll_lease_until = models.DateTimeField(_("poll lease until"), null=True, blank=True)
    # A held connection's resume state beyond its cursor (Discord's session id and resume
    # URL, the bot's user id), written by the connection's holder: a new holder, on any
    # host, resumes the session rather than starting one that misses what came meanwhile.
    poll_session = models.JSONField(_("poll session"), default=dict, blank=True)

    # Debounce: the adaptive window (seconds), by what the last message looks like.
    window_closed = models.FloatField(_("window closed"), default=1.2, validators=[MinValueValidator(0.0)],
                                      help_text=_("Ends in ? ! or ."))
    window_greeting = models.FloatField(_("window greeting"), default=4.0, validators=[MinValueValidator(0.0)],
                                        help_text=_("A bare greeting: 'hola', 'una consulta'."))
    window_open = models.FloatField(_("window open"), default=4.0, validators=[MinValueValidator(0.0)],
                                    help_text=_("Ends in a comma, '...', ':' or a conjunction."))
    window_neutral = models.FloatField(_("window neutral"), default=2.5, validators=[MinValueValidator(0.0)],
                                       help_text=_("Anything else."))
    greeting_words = models.TextField(_("greeting words"), default=_default_greetings,
                                      help_text=_("Comma-separated greetings and phrases."))
    conjunction_words = models.TextField(_("conjunction words"), default=_default_conjunctions,
                                         help_text=_("Comma-separated words that leave a sentence open."))
    max_wait = models.FloatField(_("max wait"), default=15.0, validators=[MinValueValidator(0.0)],
                                 help_text=_("A buffer never waits longer than this after its first message."))
    max_messages = models.PositiveIntegerField(_("max messages"), default=10, validators=[MinValueValidator(1)],
                                               help_text=_("A buffer flushes at once when it holds this many "
                                                           "(an album counts once)."))
    window_media = models.FloatField(_("window media"), default=2.5, validators=[MinValueValidator(0.0)],
                                     help_text=_("A photo, voice note or file without a caption "
                                                 "(a caption is classified like text)."))
    window_album = models.FloatField(_("window album"), default=3.0, validators=[MinValueValidator(0.0)],
                                     help_text=_("An album's item keeps the buffer open at least this long: "
                                                 "its next item may still be uploading."))
    media_at_once = models.BooleanField(_("media at once"), default=False,
                                        help_text=_("Flush a buffer at once when media arrives, "
                                                    "instead of giving it a window."))

    double_texting = models.CharField(
        _("double texting"), max_length=16, choices=DoubleTexting.choices, default=DoubleTexting.ENQUEUE
    )
    typing_mode = models.CharField(_("typing mode"), max_length=16, choices=TypingMode.choices, default=TypingMode.INSTANT)
    edits = models.CharField(_("edits"), max_length=16, choices=EditsPolicy.choices, default=EditsPolicy.APPLY)
    status_reaction = models.CharField(
        _("status reaction"), max_length=16, choices=StatusReaction.choices, default=StatusReaction.OFF,
        help_text=_("A \"seen\" reaction on the person's message, on the platforms that have reactions "
                    "(docs/platforms.md), best effort (docs/buffer.md#reactions)."))
    streaming = models.BooleanField(
        _("streaming"), default=True, help_text=_("Show a streamed reply as it is written, where the platform can (Telegram drafts "
                                                  "or an edited preview in groups, web chat); the final reply goes through the "
                                                  "ledger either way. Off: the whole reply at once."))

    # The ledger's bounds for this channel's replies (delivery/ledger, docs/ledger.md).
    recovery_freshness = models.DurationField(
        _("recovery freshness"), default=timedelta(hours=24), validators=[MinValueValidator(timedelta(minutes=1))],
        help_text=_("A reply not delivered within this long of being written (or of an operator's retry) is "
                    "abandoned, never sent late."))
    stale_recoveries = models.CharField(
        _("stale recoveries"), max_length=16, choices=StaleRecoveries.choices, default=StaleRecoveries.DATED,
        help_text=_("A recovered reply whose conversation has since had a newer reply delivered: sent with the "
                    "time it was written, or dropped."))
    time_zone = models.CharField(
        _("time zone"), max_length=64, blank=True, default="",
        help_text=_("The IANA time zone agentloop writes times in for this channel's users (a recovered reply's "
                    "time); empty: the deployment's (AGENTLOOP_DEFAULT_TIME_ZONE)."))

    language = models.CharField(
        _("language"), max_length=16, blank=True, default="", choices=_language_choices,
        help_text=_("What agentloop writes to a user whose platform gives no language (apologies, notices, "
                    "command answers); empty: the deployment's."))
    group_replies = models.CharField(
        _("group replies"), max_length=16, choices=GroupReplies.choices, default=GroupReplies.MENTION,
        help_text=_("In group chats (Telegram groups, Slack channels): which messages the agent answers. The others are stored and given to the next "
                    "turn addressed to it as context, never answered (docs/buffer.md#groups)."))
    handoff_idle_minutes = models.PositiveIntegerField(
        _("handoff idle minutes"), default=30, help_text=_("A conversation a person took over goes back to the agent after this long without "
                                                           "a reply from the person (0: only when given back)."))
    turns_per_contact_per_hour = models.PositiveIntegerField(
        _("turns per contact per hour"), default=0, help_text=_("Turns one person may cause in an hour; beyond, one notice and no answer until the "
                                                                "hour has passed (0: no limit)."))
    tokens_per_contact_per_day = models.PositiveIntegerField(
        _("tokens per contact per day"), default=0, help_text=_("Model tokens (as the provider reports them) one person may use in a day; beyond, "
                                                                "one notice and no answer until the next day (0: no limit)."))

    # Bots (conversations.loops): which may make turns, and the loop breaker's bound.
    allowed_bots = models.TextField(
        _("allowed bots"), blank=True, default="",
        help_text=_("Comma-separated bots whose messages the agent answers (a Telegram username or user id, a Slack "
                    "bot id, an API sender id). Other bots' messages are kept as context, never answered."))
    loop_max_replies = models.PositiveIntegerField(
        _("loop max replies"), default=8, help_text=_("More agent replies than this in a conversation within the loop window, with no "
                                                      "human message among them, pauses the agent there until an operator gives it back "
                                                      "(0: off)."))
    loop_window_seconds = models.PositiveIntegerField(
        _("loop window seconds"), default=60, help_text=_("The loop breaker's window, in seconds (0: off)."))

    agent = models.CharField(_("agent"), max_length=50, default="echo")
    agent_config = models.JSONField(_("agent config"), default=dict, blank=True)

    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    objects = ChannelManager()

    class Meta:
        verbose_name = _("channel")
        verbose_name_plural = _("channels")
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name or self.slug

    def clean(self) -> None:
        from conversations.agents import validate_agent_config

        refused = self.unworkable()
        if refused:
            raise ValidationError(refused)
        validate_agent_config(self.agent_config)
        try:
            platform = self.platform
        except LookupError as exc:
            raise ValidationError({"kind": str(exc)}) from exc
        try:
            self.platform_settings = platform.clean_settings(self.platform_settings)
        except ValidationError as exc:
            # Not keyed by field: the admin shows a platform's settings as fields of
            # their own ("<kind>_<name>"), and each message names its setting.
            raise ValidationError(exc.messages) from exc

    def unworkable(self) -> dict[str, str]:
        """Why this channel cannot work as set, by field ({} when it can): an agent that is
        not registered, windows that contradict each other or are beyond their bounds
        (conversations.windows.problems)."""
        found = {f"window_{name}" if name not in ("max_wait",) else name: message
                 for name, message in windows.problems(self.debounce_settings()).items()}
        if self.agent not in settings.AGENTLOOP_AGENTS:
            found["agent"] = gettext("no agent %(name)s is registered (AGENTLOOP_AGENTS); registered: %(known)s") % {
                "name": repr(self.agent), "known": ", ".join(sorted(settings.AGENTLOOP_AGENTS))}
        return found

    @property
    def platform(self) -> Platform:
        """Its kind's platform (conversations.platforms), straight from the registry's
        setting: the models import no platform, so every platform may import them."""
        found: Platform = plugins.instance("AGENTLOOP_PLATFORMS", self.kind)
        return found

    def setting(self, name: str, default: Any = "") -> Any:
        """One of the platform's settings (its default when the channel has none stored)."""
        value = (self.platform_settings or {}).get(name)
        if value in (None, ""):
            spec = self.platform.settings.get(name)
            return spec.default if spec is not None else default
        return value

    def save(self, *args: Any, **kwargs: Any) -> None:
        # Checked on every save (a script's too, not only the admin's), and the block
        # recomputed: saving a channel whose token was refused lets its replies go again.
        update_fields = kwargs.get("update_fields")
        if update_fields is None or "platform_settings" in update_fields:
            self.platform_settings = self.platform.clean_settings(self.platform_settings)
            self.send_blocked = self.platform.send_blocked(self)[:300]
            if update_fields is not None:
                kwargs["update_fields"] = {*update_fields, "send_blocked"}
        super().save(*args, **kwargs)
        Channel.objects.forget_cached()

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        Channel.objects.forget_cached()
        return super().delete(*args, **kwargs)

    def debounce_settings(self) -> windows.DebounceSettings:
        return windows.DebounceSettings(
            closed=self.window_closed,
            greeting=self.window_greeting,
            open=self.window_open,
            neutral=self.window_neutral,
            greetings=windows.parse_words(self.greeting_words),
            conjunctions=windows.parse_words(self.conjunction_words),
            max_wait=self.max_wait,
            max_messages=self.max_messages,
            media=self.window_media,
            album=self.window_album,
            media_at_once=self.media_at_once,
        )
