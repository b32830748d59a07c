"""The durable delivery ledger: every reply, control answer and notice is a row written
before it is sent; at least once, with a possible duplicate labelled.

State machine (written once, here; every transition is a compare-and-swap in
`delivery.ledger`):

    pending ──claim──► attempting ──► delivered
       │                 │  ▲   ├──► failed ──(timer due, or next start)──► attempting
       │                 │  │   ├──► unreachable   (permanent: bot blocked, chat gone)
       │                 │  └───┘    (a dead owner's row, taken over by a sweep)
       └──(stale)────────┴──────────► abandoned     (over the budget, or older than 24 h)

A row claimed and not sent (a sweep out of time) is released to where it was: pending
or failed, its attempt given back.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agentloop.core.states import StateMachine
from delivery import templates

if TYPE_CHECKING:
    from delivery.pacing import Pace
    from delivery.questions import Buttons


class OutboundKind(models.TextChoices):
    REPLY = "reply", _("Agent reply")
    CONTROL = "control", _("Control command answer")
    NOTICE = "notice", _("Notice (reject, failure)")
    SCHEDULED = "scheduled", _("Scheduled message (reminder, follow-up, broadcast)")


class OutboundState(models.TextChoices):
    PENDING = "pending", _("Pending (never tried)")
    ATTEMPTING = "attempting", _("Attempting (claimed, sending)")
    DELIVERED = "delivered", _("Delivered")
    FAILED = "failed", _("Failed (will retry)")
    UNREACHABLE = "unreachable", _("Unreachable (permanent)")
    ABANDONED = "abandoned", _("Abandoned")


class Outcome(models.TextChoices):
    """What one send attempt came to, as the transport classified it."""

    DELIVERED = "delivered", _("Delivered")
    FLOOD = "flood", _("Flood control (retry after)")
    TEMPORARY = "temporary", _("Temporary failure")
    PERMANENT = "permanent", _("Permanent failure")
    AMBIGUOUS = "ambiguous", _("Ambiguous (may have arrived)")
    # The request provably never left (no connection could be had or made: the pool,
    # DNS, TCP, TLS): resent unlabelled, its attempt given back.
    NOT_SENT = "not_sent", _("Not sent (never left)")
    # The platform refused the channel's credentials (a revoked bot token): the row waits,
    # its attempt given back, and the channel's replies wait (Channel.send_blocked) until
    # an operator saves the channel again.
    CHANNEL_BLOCKED = "channel_blocked", _("Channel blocked (credentials refused)")


class OutboundMessage(StateMachine, models.Model):
    """A ledger row: one outbound reply's delivery obligation, written before the send.

    Whether a send carries the recovery prefix is decided by the claim itself, from the
    row's state before it: a row never claimed goes out plain; any row claimed before
    (it may have been sent) goes out labelled. A reply in several chunks resumes at its
    first chunk not known delivered, labelled only if that chunk's send had started
    (`chunks_started > chunks_delivered`); chunks known delivered are never resent.
    """

    TRANSITIONS = {
        OutboundState.PENDING: {OutboundState.ATTEMPTING, OutboundState.ABANDONED},
        OutboundState.ATTEMPTING: {
            OutboundState.DELIVERED, OutboundState.FAILED, OutboundState.UNREACHABLE, OutboundState.ABANDONED,
            OutboundState.ATTEMPTING,  # taken over from a dead owner
            OutboundState.PENDING,  # claimed, not sent, given back (ledger.release)
        },
        # FAILED -> FAILED: an operator's "retry now" makes a failed row due at once.
        OutboundState.FAILED: {OutboundState.ATTEMPTING, OutboundState.ABANDONED, OutboundState.FAILED},
        # An operator's "retry now".
        OutboundState.UNREACHABLE: {OutboundState.FAILED},
        OutboundState.ABANDONED: {OutboundState.FAILED},
        # A platform's receipt (WhatsApp's `failed` status) says a message it accepted never
        # arrived: resent, or never retried (delivery.receipts).
        OutboundState.DELIVERED: {OutboundState.FAILED, OutboundState.UNREACHABLE},
    }
    OPEN = (OutboundState.PENDING, OutboundState.ATTEMPTING, OutboundState.FAILED)

    # Never stored: what a claim puts on the rows it won, for their send (delivery.ledger).
    # Declared for the type checker only; a row not claimed that way has none of them.
    pace: Pace | None  # its send's limits (None: unpaced)
    pace_delay: float  # seconds its reserved slot was ahead at the claim
    send_at: float  # that slot, on time.monotonic()'s clock
    buttons: Buttons  # a question's answer buttons (delivery.questions)
    recovered_from: datetime  # a stale recovery's: when it was written (its dated marker)
    resumed_at: int  # the chunk this attempt resumed at

    # Their indexes are outbound_story_idx and outbound_chat_idx below (issue 30).
    conversation = models.ForeignKey(
        "conversations.Conversation", verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="outbound", db_index=False
    )
    # Retries keep the bot (channel), the chat and the thread the reply was meant for.
    channel = models.ForeignKey("conversations.Channel", verbose_name=_("channel"), on_delete=models.CASCADE, related_name="outbound",
                                db_index=False)
    chat_id = models.CharField(_("chat ID"), max_length=100)
    turn = models.ForeignKey(
        "conversations.Turn", verbose_name=_("turn"), null=True, blank=True, on_delete=models.SET_NULL, related_name="outbound"
    )
    kind = models.CharField(_("kind"), max_length=16, choices=OutboundKind.choices, default=OutboundKind.REPLY)
    text = models.TextField(_("text"))
    # The conversation's language when the row was written: the recovery marker added at
    # send time speaks it (delivery cannot ask conversations then).
    language = models.CharField(_("language"), max_length=16, blank=True, default="")
    # Platform ids: WhatsApp's wamid.… are 60-80 characters.
    reply_target = models.CharField(_("reply target"), max_length=200, blank=True)
    thread_id = models.CharField(_("thread ID"), max_length=50, blank=True)
    state = models.CharField(_("state"), max_length=16, choices=OutboundState.choices, default=OutboundState.PENDING)
    owner = models.CharField(_("owner"), max_length=100, blank=True)
    claim_token = models.CharField(_("claim token"), max_length=64, blank=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=0, help_text=_("Sends started (claims)."))
    flood_waits = models.PositiveIntegerField(
        _("flood waits"), default=0, help_text=_("Sends deferred: refused by flood control, or never sent (no attempt spent)."))
    extra_resends = models.PositiveIntegerField(_("extra resends"), default=0, help_text=_("Granted by an operator's retry."))
    needs_marker = models.BooleanField(_("needs marker"), default=False, help_text=_("The current attempt carries the recovery prefix."))
    # A reply over the platform's limit, as the ordered chunks it is sent in (empty: the
    # text is the one chunk). Each chunk's start and delivery are recorded around its
    # send, so a recovery resumes at the first chunk not known delivered and labels it
    # only if its send had started (see `delivery.ledger.send`).
    chunks = models.JSONField(_("chunks"), default=list, blank=True)
    chunks_started = models.PositiveIntegerField(_("chunks started"), default=0, help_text=_("Chunks whose send has started."))
    chunks_delivered = models.PositiveIntegerField(_("chunks delivered"), default=0, help_text=_("Chunks known delivered, in order."))
    last_outcome = models.CharField(_("last outcome"), max_length=16, choices=Outcome.choices, blank=True)
    last_error = models.CharField(_("last error"), max_length=300, blank=True)
    platform_message_id = models.CharField(_("platform message ID"), max_length=100, blank=True)
    # A streamed reply's preview message in the chat (a Telegram group's): the final's
    # first chunk is an edit of it; a failed or unknown edit deletes it and sends fresh
    # (delivery.ledger.sending.send_over_preview). Cleared once the preview is gone.
    preview_message_id = models.CharField(_("preview message ID"), max_length=50, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    next_attempt_at = models.DateTimeField(
        _("next attempt at"), default=timezone.now, null=True, blank=True,
        help_text=_("Empty: the last budgeted attempt, kept for the next worker start."))
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)
    retried_at = models.DateTimeField(_("retried at"), null=True, blank=True, help_text=_("An operator's retry (freshness restarts)."))
    # A scheduled message's tick ("schedule:<id>:<due at>"): unique, so a tick is written
    # down once whatever races it (two workers, a restart mid-round). Empty for replies.
    dedup_key = models.CharField(_("dedup key"), max_length=120, null=True, blank=True, unique=True)
    # An approved template this row goes out as instead of free text ({"name", "language",
    # "parameters"}, delivery.templates): a scheduled message outside WhatsApp's 24-hour
    # window. Empty for everything else.
    template = models.JSONField(_("template"), default=dict, blank=True)
    # Tracing (agentloop.core.tracing): the traceparent of the turn that wrote it, the
    # parent of each of its send attempts' spans, whichever worker sends (or resends) it.
    traceparent = models.CharField(_("traceparent"), max_length=55, null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("ledger row")
        verbose_name_plural = _("ledger rows")
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="outbound_queue_idx"),
            models.Index(fields=["state", "owner"], name="outbound_owner_idx"),
            models.Index(fields=["state", "claimed_at"], name="outbound_claimed_idx"),
            models.Index(fields=["claim_token"], name="outbound_claim_idx"),
            # A conversation's rows in time order (the story page); a chat's (unreachable chats).
            models.Index(fields=["conversation", "created_at"], name="outbound_story_idx"),
            models.Index(fields=["channel", "chat_id"], name="outbound_chat_idx"),
            # The admin's order, date drill-down and age filter; the dashboard's outcomes of
            # the day. Only the date, as turn_created_idx.
            models.Index(fields=["created_at"], name="outbound_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.pk} ({self.get_state_display()})"


class UnreachableChat(models.Model):
    """A chat the platform refused permanently (bot blocked, chat deleted, bot kicked).
    Shown per channel in the admin; cleared when a reply reaches it again."""

    # No index of its own: the unique (channel, chat) starts with it.
    channel = models.ForeignKey("conversations.Channel", verbose_name=_("channel"), on_delete=models.CASCADE, related_name="unreachable_chats",
                                db_index=False)
    chat_id = models.CharField(_("chat ID"), max_length=100)
    error = models.CharField(_("error"), max_length=300)
    since = models.DateTimeField(_("since"), default=timezone.now)
    last_failure_at = models.DateTimeField(_("last failure at"), default=timezone.now)
    failures = models.PositiveIntegerField(_("failures"), default=1)

    class Meta:
        verbose_name = _("unreachable chat")
        verbose_name_plural = _("unreachable chats")
        constraints = [models.UniqueConstraint(fields=["channel", "chat_id"], name="unreachable_chat_unique")]

    def __str__(self) -> str:
        return f"{self.chat_id} @ {self.channel_id}"


class SendBudget(models.Model):
    """One pacing key's next free send slot, shared by every process and host: a bot's
    (all its chats), a chat's, a group's (delivery.pacing). `next_slot` is epoch
    seconds on the database's clock (PostgreSQL), so hosts whose clocks differ still
    space their sends by the same measure."""

    key = models.CharField(_("key"), max_length=150, primary_key=True)
    next_slot = models.FloatField(_("next slot"))

    class Meta:
        verbose_name = _("send budget")
        verbose_name_plural = _("send budgets")

    def __str__(self) -> str:
        return self.key


class RestorePoint(models.Model):
    """Written into a database restored from a backup (`manage.py backup`: into the
    SQLite copy; `--mark-restored` after a pg_restore): the newest turn and buffer the
    copy held. A turn up to `last_turn_id`, or made from a buffer up to
    `last_buffer_id`, was in flight when the backup was taken and runs again after the
    restore: its reply may have been delivered after the copy was made, so it is written
    "its send may have started" and goes out labelled (delivery.ledger.replies)."""

    at = models.DateTimeField(_("at"), default=timezone.now, help_text=_("When the backup (SQLite) or the restore was made."))
    last_turn_id = models.BigIntegerField(_("last turn ID"), default=0)
    last_buffer_id = models.BigIntegerField(_("last buffer ID"), default=0)

    class Meta:
        verbose_name = _("restore point")
        verbose_name_plural = _("restore points")
        ordering = ["-pk"]

    def __str__(self) -> str:
        return gettext("restore point of %(at)s") % {"at": f"{self.at:%Y-%m-%d %H:%M}"}


class ScheduleState(models.TextChoices):
    SCHEDULED = "scheduled", _("Scheduled (waits for its time)")
    SENT = "sent", _("Sent (written to the ledger)")
    CANCELLED = "cancelled", _("Cancelled")


class ScheduleSource(models.TextChoices):
    AGENT = "agent", _("The agent (reminder_create)")
    OPERATOR = "operator", _("An operator (the admin)")
    API = "api", _("The API")


class ScheduledMessage(StateMachine, models.Model):
    """A message that goes out by itself at `due_at` (a reminder, a follow-up, a
    broadcast), once or every `repeat_every`. A worker sends a due tick by one
    compare-and-swap on (state, due_at) in the transaction that writes its ledger row,
    whose `dedup_key` names the tick (conversations.schedules)."""

    TRANSITIONS = {
        # SCHEDULED -> SCHEDULED: a repeating schedule's tick sent, the next one set.
        ScheduleState.SCHEDULED: {ScheduleState.SCHEDULED, ScheduleState.SENT, ScheduleState.CANCELLED},
        ScheduleState.SENT: set(),
        ScheduleState.CANCELLED: set(),
    }

    conversation = models.ForeignKey("conversations.Conversation", verbose_name=_("conversation"), on_delete=models.CASCADE,
                                      related_name="schedules")
    text = models.TextField(_("text"))
    due_at = models.DateTimeField(_("due at"), help_text=_("When the next tick goes out."))
    repeat_every = models.DurationField(_("repeat every"), null=True, blank=True,
                                        help_text=_("Empty: once. Else sent again this long after each tick."))
    cancel_on_reply = models.BooleanField(
        _("cancel on reply"), default=False, help_text=_("Cancelled if the user writes after it was scheduled (a follow-up that a reply "
                                                         "makes pointless)."))
    state = models.CharField(_("state"), max_length=16, choices=ScheduleState.choices, default=ScheduleState.SCHEDULED)
    source = models.CharField(_("source"), max_length=16, choices=ScheduleSource.choices, default=ScheduleSource.OPERATOR)
    # Why a due tick waits (WhatsApp's 24-hour window), or why it was cancelled.
    reason = models.CharField(_("reason"), max_length=300, blank=True)
    # Outside a platform's reply window (WhatsApp's 24 hours) a tick goes out as an approved
    # template: this schedule's own, or (each field left empty) the channel's. (The checks
    # return the cleaned value, for the platform settings; a validator's return is ignored.)
    template_name = models.CharField(
        _("template name"), max_length=512, blank=True, validators=[templates.check_name],  # type: ignore[list-item]
        help_text=_("WhatsApp: the approved template a tick outside the 24-hour window goes out as. Empty: the "
                    "channel's."))
    template_language = models.CharField(
        _("template language"), max_length=16, blank=True, validators=[templates.check_language],  # type: ignore[list-item]
        help_text=_("Its language code as Meta writes it (es, en_US, pt_BR). Empty: the channel's."))
    template_fill = models.CharField(
        _("template fill"), max_length=8, blank=True,
        choices=[(templates.FILL_TEXT, _("The text is {{1}}")),
                 (templates.FILL_LINES, _("Each line is one parameter: {{1}}, {{2}}, …"))],
        help_text=_("How the text fills the template's body. Empty: the channel's."))
    ticks_sent = models.PositiveIntegerField(_("ticks sent"), default=0)
    last_sent_at = models.DateTimeField(_("last sent at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)

    class Meta:
        verbose_name = _("scheduled message")
        verbose_name_plural = _("scheduled messages")
        indexes = [models.Index(fields=["state", "due_at"], name="schedule_due_idx")]

    def __str__(self) -> str:
        return gettext("schedule %(id)s (%(state)s, %(due)s)") % {
            "id": self.pk, "state": self.get_state_display(), "due": f"{self.due_at:%Y-%m-%d %H:%M}"}

    def chosen_template(self) -> dict[str, str]:
        """This schedule's own template fields that are set ({"name", "language", "fill"})."""
        chosen = {"name": self.template_name, "language": self.template_language, "fill": self.template_fill}
        return {key: value for key, value in chosen.items() if value}


def channel_model() -> type[models.Model]:
    """conversations' Channel, reached through the ledger's own foreign key: the schema
    already points there, and delivery imports nothing of the app above it."""
    related = OutboundMessage._meta.get_field("channel").related_model
    assert isinstance(related, type) and issubclass(related, models.Model)
    return related
