"""Turns (a buffer made one request to the agent), the workers that run them, and the
notes an agent reads in its next turns."""

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agentloop.core.states import StateMachine
from conversations.models.buffers import FlushReason, MessageBuffer
from conversations.models.messages import Conversation


class TurnState(models.TextChoices):
    READY = "ready", _("Ready")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    CANCELLED = "cancelled", _("Cancelled")
    FAILED = "failed", _("Failed")


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

    # No index of its own: turn_conversation_state_idx starts with it (see Conversation.channel).
    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="turns", db_index=False)
    buffer = models.OneToOneField(
        MessageBuffer, verbose_name=_("buffer"), null=True, blank=True, on_delete=models.SET_NULL, related_name="turn"
    )
    merged_input = models.TextField(_("merged input"))
    # Its burst carried files (conversations.media): the runner settles and shows them.
    has_media = models.BooleanField(_("has media"), default=False)
    flush_reason = models.CharField(_("flush reason"), max_length=16, choices=FlushReason.choices)
    state = models.CharField(_("state"), max_length=16, choices=TurnState.choices, default=TurnState.READY)
    fired_effect = models.BooleanField(
        _("fired effect"), default=False, help_text=_("Set before the first external effect; such a turn is never cancelled.")
    )
    owner = models.CharField(_("owner"), max_length=100, blank=True, help_text=_("The worker running it."))
    reply_target = models.CharField(_("reply target"), max_length=200, blank=True)
    thread_id = models.CharField(_("thread ID"), max_length=50, blank=True)
    reply_text = models.TextField(_("reply text"), blank=True)
    outcome = models.CharField(_("outcome"), max_length=300, blank=True, help_text=_("Why it was cancelled or failed."))
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    started_at = models.DateTimeField(_("started at"), null=True, blank=True)
    effect_fired_at = models.DateTimeField(_("effect fired at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    # A streamed reply (conversations.worker.streams): when its first delta arrived, how many
    # previews went out, the group preview message the final edits (recorded when sent,
    # so a recovery can reuse or remove it), and its text so far — saved only once the
    # turn fired an effect, at most every AGENTLOOP_STREAM_SAVE_INTERVAL: a crash then
    # sends it, marked as interrupted, instead of running the turn again.
    first_delta_at = models.DateTimeField(_("first delta at"), null=True, blank=True)
    previews = models.PositiveIntegerField(_("previews"), default=0)
    preview_message_id = models.CharField(_("preview message ID"), max_length=50, blank=True)
    streamed_text = models.TextField(_("streamed text"), blank=True)
    # Model tokens the provider reported for this turn (conversations.limits).
    tokens_used = models.PositiveIntegerField(_("tokens used"), default=0)
    # The routing rule whose agent runs it (conversations.routing; NULL: the channel's own
    # agent), and why it was chosen, as the story page shows it.
    routing_rule = models.ForeignKey("RoutingRule", verbose_name=_("routing rule"), null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", db_index=False)
    route = models.CharField(_("route"), max_length=200, null=True, blank=True)
    # A person's reply (owner "person:<who>"): the caller's idempotency key, if any.
    request_key = models.CharField(_("request key"), max_length=100, blank=True)
    # Tracing (agentloop.core.tracing): the traceparent of the flush that made it, the
    # parent of its run's span in whichever worker runs it. NULL while tracing is off.
    traceparent = models.CharField(_("traceparent"), max_length=55, null=True, blank=True, editable=False)

    class Meta:
        verbose_name = _("turn")
        verbose_name_plural = _("turns")
        constraints = [
            models.UniqueConstraint(
                fields=["conversation", "request_key"], condition=~Q(request_key=""),
                name="turn_request_key_once"
            ),
            # One turn at a time per conversation, guaranteed by the database itself.
            models.UniqueConstraint(
                fields=["conversation"], condition=Q(state="running"), name="one_running_turn_per_conversation"
            )
        ]
        indexes = [
            models.Index(fields=["state", "created_at"], name="turn_queue_idx"),
            models.Index(fields=["conversation", "state"], name="turn_conversation_state_idx"),
            # The admin's order and date drill-down, the dashboard's turns of the day. Only
            # the date: SQLite's index ends with the rowid, so it also gives (created_at, id),
            # the changelist's order.
            models.Index(fields=["created_at"], name="turn_created_idx"),
            # A rule's turns, found when it is deleted; a turn of a channel's own agent is not in it.
            models.Index(fields=["routing_rule"], name="turn_routing_rule_idx",
                         condition=Q(routing_rule__isnull=False)),
        ]

    def __str__(self) -> str:
        return gettext("turn %(id)s (%(state)s)") % {"id": self.pk, "state": self.get_state_display()}


class WorkerHeartbeat(models.Model):
    """Each worker loop stamps its claims with `owner` and keeps this row fresh."""

    owner = models.CharField(_("owner"), max_length=100, unique=True)
    hostname = models.CharField(_("hostname"), max_length=100)
    pid = models.IntegerField(_("PID"))
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    seen_at = models.DateTimeField(_("seen at"), default=timezone.now)

    class Meta:
        verbose_name = _("worker heartbeat")
        verbose_name_plural = _("worker heartbeats")

    def __str__(self) -> str:
        return self.owner


class ContextNote(models.Model):
    """Something the agent must know in its next turns that was not said in the chat:
    e.g. a person approved or rejected an action it proposed."""

    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="notes")
    text = models.TextField(_("text"))
    created_at = models.DateTimeField(_("created at"), default=timezone.now)

    class Meta:
        verbose_name = _("context note")
        verbose_name_plural = _("context notes")
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.text[:80]


class AgentSession(models.Model):
    """What a remote agent's protocol has us keep for a conversation between its turns,
    under a key of the agent's choosing (the `a2a` agent: the A2A contextId the remote
    agent knows the conversation by, and the task waiting for the person's answer). A
    session older than the conversation's /reset is not read: the remote agent then
    starts a new context."""

    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="agent_sessions",
                                     db_index=False)  # agent_session_once starts with it
    key = models.CharField(_("key"), max_length=64)
    state = models.JSONField(_("state"), default=dict, blank=True)
    started_at = models.DateTimeField(_("started at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    class Meta:
        verbose_name = _("agent session")
        verbose_name_plural = _("agent sessions")
        constraints = [models.UniqueConstraint(fields=["conversation", "key"], name="agent_session_once")]

    def __str__(self) -> str:
        return gettext("%(key)s @ conversation %(id)s") % {"key": self.key, "id": self.conversation_id}
