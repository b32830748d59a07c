"""Layer 1's tables: who talks to us, what they said, and when each burst becomes a turn.

State machines are written down once here (the *State enums and their TRANSITIONS);
every transition goes through the model's checked `transition()` (agentloop.core.states):
a compare-and-swap `filter(pk=…, state__in=old).update(…)` that refuses a move the
table does not allow.
"""

import hashlib
import secrets

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from agentloop.core.caches import BoundedCache
from agentloop.core.states import StateMachine
from conversations import platforms, windows


def _platform_choices():
    return platforms.choices()


class DoubleTexting(models.TextChoices):
    """What happens to a message that arrives while the conversation's turn runs."""

    ENQUEUE = "enqueue", "Enqueue: merge into the next turn"
    REJECT = "reject", "Reject: ask the user to wait"
    INTERRUPT = "interrupt", "Interrupt: cancel the turn, keep its input"
    ROLLBACK = "rollback", "Rollback: cancel the turn, drop its input"


class TypingMode(models.TextChoices):
    """When the bot shows "typing…" (where the platform can show it at all)."""

    INSTANT = "instant", "Instant: from the first message of a burst, through the window and the turn"
    TURN = "turn", "Turn: only while the agent runs"
    NEVER = "never", "Never"


class EditsPolicy(models.TextChoices):
    """What an edit of a message the user already sent does."""

    APPLY = "apply", "Apply: the corrected text counts"
    IGNORE = "ignore", "Ignore edits"


def _default_greetings():
    return ", ".join(windows.DEFAULT_GREETINGS)


def _default_conjunctions():
    return ", ".join(windows.DEFAULT_CONJUNCTIONS)


class ChannelManager(models.Manager):
    # Inbound requests look their channel up on every message; a copy at most this
    # old is good enough (operators' edits apply within a second or two). Both caches are
    # bounded: an anonymous client choosing slugs must not grow the process. Unknown slugs
    # get a small cache of their own, so they never push a real channel out.
    CACHE_SECONDS = 2.0
    _cache = BoundedCache(maxsize=1000, max_age=CACHE_SECONDS)
    _unknown = BoundedCache(maxsize=256, max_age=CACHE_SECONDS)

    def active(self, slug, kind=None):
        """The active channel with this slug (and kind), from a short per-process cache."""
        channel = self._cache.get(slug)
        if channel is None and slug not in self._unknown:
            channel = self.filter(slug=slug, is_active=True).first()
            (self._cache if channel is not None else self._unknown).set(slug, channel)
        return channel if channel is not None and (kind is None or channel.kind == kind) else None

    def forget_cached(self):
        self._cache.clear()
        self._unknown.clear()

    def cache_size(self) -> int:
        """Entries held by this process's channel caches (for tests and operators)."""
        return len(self._cache) + len(self._unknown)


class Channel(models.Model):
    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=100, blank=True)
    # The platform (conversations.platforms, settings.AGENTLOOP_PLATFORMS).
    kind = models.CharField(max_length=16, choices=_platform_choices, default="api")
    is_active = models.BooleanField(default=True)
    # The platform's own settings (bot token, webhook secret, callback URL…), checked on
    # save against its Platform.settings.
    platform_settings = models.JSONField(default=dict, blank=True)
    # Why replies must wait ("" = they may go): computed on save from the platform's
    # settings, and set by delivery when the platform refuses the channel's credentials.
    # The ledger's claim reads this column and no other platform rule.
    send_blocked = models.CharField(max_length=300, blank=True, default="")

    # Polling platforms (Telegram's getUpdates): the next offset, persisted so a restarted
    # poller never re-reads confirmed updates.
    poll_offset = models.BigIntegerField(null=True, blank=True)
    # One poller per channel across all workers (Telegram answers 409 to concurrent getUpdates).
    poll_owner = models.CharField(max_length=100, blank=True)
    poll_lease_until = models.DateTimeField(null=True, blank=True)

    # Debounce: the adaptive window (seconds), by what the last message looks like.
    window_closed = models.FloatField(default=1.2, validators=[MinValueValidator(0.0)],
                                      help_text="Ends in ? ! or .")
    window_greeting = models.FloatField(default=4.0, validators=[MinValueValidator(0.0)],
                                        help_text="A bare greeting: 'hola', 'una consulta'.")
    window_open = models.FloatField(default=4.0, validators=[MinValueValidator(0.0)],
                                    help_text="Ends in a comma, '...', ':' or a conjunction.")
    window_neutral = models.FloatField(default=2.5, validators=[MinValueValidator(0.0)],
                                       help_text="Anything else.")
    greeting_words = models.TextField(default=_default_greetings,
                                      help_text="Comma-separated greetings and phrases.")
    conjunction_words = models.TextField(default=_default_conjunctions,
                                         help_text="Comma-separated words that leave a sentence open.")
    max_wait = models.FloatField(default=15.0, validators=[MinValueValidator(0.0)],
                                 help_text="A buffer never waits longer than this after its first message.")
    max_messages = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)],
                                               help_text="A buffer flushes at once when it holds this many.")

    double_texting = models.CharField(
        max_length=16, choices=DoubleTexting.choices, default=DoubleTexting.ENQUEUE
    )
    typing_mode = models.CharField(max_length=16, choices=TypingMode.choices, default=TypingMode.INSTANT)
    edits = models.CharField(max_length=16, choices=EditsPolicy.choices, default=EditsPolicy.APPLY)

    agent = models.CharField(max_length=50, default="echo")
    agent_config = models.JSONField(default=dict, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ChannelManager()

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.name or self.slug

    def clean(self):
        from django.core.exceptions import ValidationError

        from conversations.agents import validate_agent_config

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

    @property
    def platform(self):
        return platforms.of(self)

    def setting(self, name, default=""):
        """One of the platform's settings (its default when the channel has none stored)."""
        value = (self.platform_settings or {}).get(name)
        if value in (None, ""):
            spec = self.platform.settings.get(name)
            return spec.default if spec is not None else default
        return value

    def save(self, *args, **kwargs):
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

    def delete(self, *args, **kwargs):
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
        )


class Contact(models.Model):
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="contacts")
    platform_id = models.CharField(max_length=100)
    display_name = models.CharField(max_length=200, blank=True)
    username = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "platform_id"], name="contact_unique_per_channel")
        ]

    def __str__(self):
        return self.display_name or self.username or self.platform_id


class Conversation(models.Model):
    """One (channel, contact) pair; in a group, one (chat, sender) pair."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="conversations")
    contact = models.ForeignKey(Contact, on_delete=models.CASCADE, related_name="conversations")
    chat_id = models.CharField(max_length=100)
    # Denormalised from contact so ingest finds the conversation in one indexed lookup.
    sender_id = models.CharField(max_length=100)
    is_group = models.BooleanField(default=False)
    # History before this instant is not given to the agent (/reset).
    context_reset_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_message_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "chat_id", "sender_id"], name="conversation_unique_chat_sender"
            )
        ]

    def __str__(self):
        where = f" in {self.chat_id}" if self.is_group else ""
        return f"{self.contact}{where} @ {self.channel.slug}"


class MessageKind(models.TextChoices):
    TEXT = "text", "Text"
    MEDIA = "media", "Media"
    CONTROL = "control", "Control command"


class Disposition(models.TextChoices):
    """What became of an admitted message."""

    BUFFERED = "buffered", "Buffered"
    CONTROL = "control", "Control command"
    REJECTED = "rejected", "Rejected (a turn was running)"
    DROPPED = "dropped", "Dropped (/stop or /reset)"
    OVERFLOW = "overflow", "Not buffered (too many pending; the sender was told)"


class InboundMessage(models.Model):
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="messages")
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    # Platform id, unique per channel (Telegram: "<chat id>:<message id>", as message
    # ids are only unique within a chat). The constraint *is* the durable dedup.
    platform_message_id = models.CharField(max_length=120)
    buffer = models.ForeignKey(
        "MessageBuffer", null=True, blank=True, on_delete=models.SET_NULL, related_name="messages"
    )
    kind = models.CharField(max_length=16, choices=MessageKind.choices, default=MessageKind.TEXT)
    disposition = models.CharField(max_length=16, choices=Disposition.choices, default=Disposition.BUFFERED)
    text = models.TextField(blank=True)
    media_type = models.CharField(max_length=30, blank=True)
    sender_name = models.CharField(max_length=200, blank=True)
    reply_target = models.CharField(max_length=200, blank=True, help_text="Platform id a reply threads to.")
    thread_id = models.CharField(max_length=50, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    received_at = models.DateTimeField(default=timezone.now)
    # The user corrected this message (its text is the corrected one; each edit, with the
    # text before it, is a MessageEdit row).
    edited_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["channel", "platform_message_id"], name="inbound_message_admitted_once"
            )
        ]

    def __str__(self):
        return f"{self.platform_message_id}: {self.text[:40]}"


class FlushReason(models.TextChoices):
    WINDOW = "window", "Window closed"
    MAX_WAIT = "max_wait", "Max wait reached"
    MAX_MESSAGES = "max_messages", "Max messages reached"
    MEDIA = "media", "Media / non-text"
    CONTROL = "control", "Control command"
    EDIT = "edit", "An edit re-runs a cancelled turn"


class BufferState(models.TextChoices):
    OPEN = "open", "Open"
    FLUSHED = "flushed", "Flushed into a turn"
    DROPPED = "dropped", "Dropped"


class MessageBuffer(StateMachine, models.Model):
    """The pending messages of a conversation, waiting for their window to close."""

    TRANSITIONS = {
        BufferState.OPEN: {BufferState.FLUSHED, BufferState.DROPPED},
        BufferState.FLUSHED: set(),
        BufferState.DROPPED: set(),
    }

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="buffers")
    state = models.CharField(max_length=16, choices=BufferState.choices, default=BufferState.OPEN)
    first_message_at = models.DateTimeField()
    last_message_at = models.DateTimeField()
    flush_at = models.DateTimeField(help_text="The deadline: the buffer flushes at this instant.")
    # What the deadline was computed from: the reason it will flush for, and the window
    # the last message got (shown on the dashboard).
    planned_reason = models.CharField(max_length=16, choices=FlushReason.choices, default=FlushReason.WINDOW)
    window_kind = models.CharField(max_length=16, blank=True)
    window_seconds = models.FloatField(default=0.0)
    message_count = models.PositiveIntegerField(default=0)
    flush_reason = models.CharField(max_length=16, choices=FlushReason.choices, blank=True)
    flushed_at = models.DateTimeField(null=True, blank=True)
    flushed_by = models.CharField(max_length=120, blank=True, help_text="The claim's owner stamp.")
    # Set by the first message kept out of this full buffer: one notice per episode.
    overflow_noticed = models.BooleanField(default=False)
    # interrupt strategy: the cancelled turn whose input this buffer carries forward.
    carried_turn = models.ForeignKey(
        "Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="carried_into"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["conversation"], condition=Q(state="open"), name="one_open_buffer_per_conversation"
            )
        ]
        # The flusher's query: open buffers by deadline.
        indexes = [models.Index(fields=["state", "flush_at"], name="buffer_due_idx")]

    def __str__(self):
        return f"buffer {self.pk} ({self.state}, {self.message_count} msgs)"

    def seconds_left(self, now=None):
        if self.state != BufferState.OPEN:
            return None
        return max(0.0, (self.flush_at - (now or timezone.now())).total_seconds())


class TurnState(models.TextChoices):
    READY = "ready", "Ready"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    CANCELLED = "cancelled", "Cancelled"
    FAILED = "failed", "Failed"


class Turn(StateMachine, models.Model):
    """One agent run over one merged buffer."""

    TRANSITIONS = {
        TurnState.READY: {TurnState.RUNNING, TurnState.CANCELLED},
        # RUNNING -> READY: its worker died before it fired any effect, or an external
        # agent let its claim lapse, so it is run (or offered) again.
        TurnState.RUNNING: {TurnState.DONE, TurnState.CANCELLED, TurnState.FAILED, TurnState.READY},
        TurnState.DONE: set(),
        TurnState.CANCELLED: set(),
        TurnState.FAILED: set(),
    }
    ACTIVE = (TurnState.READY, TurnState.RUNNING)

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    buffer = models.OneToOneField(
        MessageBuffer, null=True, blank=True, on_delete=models.SET_NULL, related_name="turn"
    )
    merged_input = models.TextField()
    flush_reason = models.CharField(max_length=16, choices=FlushReason.choices)
    state = models.CharField(max_length=16, choices=TurnState.choices, default=TurnState.READY)
    fired_effect = models.BooleanField(
        default=False, help_text="Set before the first external effect; such a turn is never cancelled."
    )
    owner = models.CharField(max_length=100, blank=True, help_text="The worker running it.")
    reply_target = models.CharField(max_length=200, blank=True)
    thread_id = models.CharField(max_length=50, blank=True)
    reply_text = models.TextField(blank=True)
    outcome = models.CharField(max_length=300, blank=True, help_text="Why it was cancelled or failed.")
    attempts = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    effect_fired_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One turn at a time per conversation, guaranteed by the database itself.
            models.UniqueConstraint(
                fields=["conversation"], condition=Q(state="running"), name="one_running_turn_per_conversation"
            )
        ]
        indexes = [
            models.Index(fields=["state", "created_at"], name="turn_queue_idx"),
            models.Index(fields=["conversation", "state"], name="turn_conversation_state_idx"),
        ]

    def __str__(self):
        return f"turn {self.pk} ({self.state})"


class WorkerHeartbeat(models.Model):
    """Each worker loop stamps its claims with `owner` and keeps this row fresh."""

    owner = models.CharField(max_length=100, unique=True)
    hostname = models.CharField(max_length=100)
    pid = models.IntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now)

    def __str__(self):
        return self.owner


class AgentKeyManager(models.Manager):
    def for_key(self, raw_key: str):
        """The live key matching `raw_key`, or None. Keys are stored as SHA-256 only."""
        if not raw_key:
            return None
        digest = hashlib.sha256(raw_key.encode()).hexdigest()
        return self.filter(key_hash=digest, revoked_at__isnull=True).first()

    def issue(self, name: str, channels=()):
        raw = "al_" + secrets.token_urlsafe(32)
        key = self.create(name=name, prefix=raw[:8], key_hash=hashlib.sha256(raw.encode()).hexdigest())
        key.channels.set(channels)
        return key, raw


class AgentKey(models.Model):
    """An external agent's credential; it sees only the channels it is granted."""

    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    channels = models.ManyToManyField(Channel, blank=True, related_name="agent_keys")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = AgentKeyManager()

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    # DRF treats request.user as authenticated when this is true.
    is_authenticated = True


class ContextNote(models.Model):
    """Something the agent must know in its next turns that was not said in the chat:
    e.g. a person approved or rejected an action it proposed."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="notes")
    text = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at"]

    def __str__(self):
        return self.text[:80]


class EditOutcome(models.TextChoices):
    """What an edit of a message changed (conversations/edits.py decides)."""

    BUFFERED = "buffered", "Corrected in the open buffer (window re-armed)"
    RERUN = "rerun", "Turn cancelled and re-run with the corrected text"
    NOTED = "noted", "Noted for the agent's next turn"
    UNCHANGED = "unchanged", "Same text as before: nothing to change"
    NOT_APPLIED = "not_applied", "Not applied: the message never reached a turn"
    IGNORED = "ignored", "Ignored: the channel ignores edits"


class MessageEdit(models.Model):
    """One edit of an admitted message. The unique (message, edited_at) *is* the edit's
    dedup: a redelivered `edited_message` stops at its INSERT, as a message does."""

    message = models.ForeignKey(InboundMessage, on_delete=models.CASCADE, related_name="edits")
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="edits")
    edited_at = models.DateTimeField(help_text="When the user edited it (Telegram's edit_date).")
    received_at = models.DateTimeField(default=timezone.now)
    source = models.CharField(max_length=16, help_text="telegram, api or webchat.")
    old_text = models.TextField(blank=True)
    new_text = models.TextField(blank=True)
    outcome = models.CharField(max_length=16, choices=EditOutcome.choices)
    detail = models.CharField(max_length=300, blank=True, help_text="Why this outcome.")
    turn = models.ForeignKey("Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="edits",
                             help_text="The turn cancelled for a re-run, or the one the edit came too late for.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "edited_at"], name="message_edit_applied_once")
        ]
        indexes = [models.Index(fields=["conversation", "received_at"], name="edit_conversation_idx")]

    def __str__(self):
        return f"edit of message {self.message_id} ({self.outcome})"
