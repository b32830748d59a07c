"""Buffers: a burst of messages waiting for its window to close."""

from datetime import datetime

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from agentloop.core.states import StateMachine
from conversations.models.messages import Conversation


class FlushReason(models.TextChoices):
    WINDOW = "window", _("Window closed")
    MAX_WAIT = "max_wait", _("Max wait reached")
    MAX_MESSAGES = "max_messages", _("Max messages reached")
    MEDIA = "media", _("Media, flushed at once (the channel's choice)")
    ALBUM = "album", _("An album's items kept the window open")
    CONTROL = "control", _("Control command")
    EDIT = "edit", _("An edit re-runs a cancelled turn")
    UNADDRESSED = "unaddressed", _("Not addressed to the agent (a group): kept as context, no turn")
    PERSON = "person", _("A person answered (the conversation was taken over)")


class BufferState(models.TextChoices):
    OPEN = "open", _("Open")
    FLUSHED = "flushed", _("Flushed into a turn")
    DROPPED = "dropped", _("Dropped")


class MessageBuffer(StateMachine, models.Model):
    """The pending messages of a conversation, waiting for their window to close."""

    TRANSITIONS = {
        BufferState.OPEN: {BufferState.FLUSHED, BufferState.DROPPED},
        BufferState.FLUSHED: set(),
        BufferState.DROPPED: set(),
    }

    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="buffers")
    state = models.CharField(_("state"), max_length=16, choices=BufferState.choices, default=BufferState.OPEN)
    first_message_at = models.DateTimeField(_("first message at"))
    last_message_at = models.DateTimeField(_("last message at"))
    flush_at = models.DateTimeField(_("flush at"), help_text=_("The deadline: the buffer flushes at this instant."))
    # What the deadline was computed from: the reason it will flush for, and the window
    # the last message got (shown on the dashboard).
    planned_reason = models.CharField(_("planned reason"), max_length=16, choices=FlushReason.choices, default=FlushReason.WINDOW)
    window_kind = models.CharField(_("window kind"), max_length=16, blank=True)
    window_seconds = models.FloatField(_("window seconds"), default=0.0)
    message_count = models.PositiveIntegerField(_("message count"), default=0)  # an album's items count once
    # The album (platform group id) of the latest message, if any: its next item joins it
    # without counting again.
    last_album_id = models.CharField(_("last album ID"), max_length=64, blank=True, default="")
    flush_reason = models.CharField(_("flush reason"), max_length=16, choices=FlushReason.choices, blank=True)
    flushed_at = models.DateTimeField(_("flushed at"), null=True, blank=True)
    flushed_by = models.CharField(_("flushed by"), max_length=120, blank=True, help_text=_("The claim's owner stamp."))
    # Set by the first message kept out of this full buffer: one notice per episode.
    overflow_noticed = models.BooleanField(_("overflow noticed"), default=False)
    # Not a column: whether the conversation had a turn ready or running when the flusher
    # claimed this buffer, set on the buffers conversations.sql.flushing.build_buffers makes.
    conversation_busy: bool
    # interrupt strategy: the cancelled turn whose input this buffer carries forward.
    carried_turn = models.ForeignKey(
        "Turn", verbose_name=_("carried turn"), null=True, blank=True, on_delete=models.SET_NULL, related_name="carried_into"
    )

    class Meta:
        verbose_name = _("message buffer")
        verbose_name_plural = _("message buffers")
        constraints = [
            models.UniqueConstraint(
                fields=["conversation"], condition=Q(state="open"), name="one_open_buffer_per_conversation"
            )
        ]
        # The flusher's query: open buffers by deadline.
        indexes = [models.Index(fields=["state", "flush_at"], name="buffer_due_idx")]

    def __str__(self) -> str:
        return ngettext("buffer %(id)s (%(state)s, %(count)s message)", "buffer %(id)s (%(state)s, %(count)s messages)",
                        self.message_count) % {"id": self.pk, "state": self.get_state_display(), "count": self.message_count}

    def seconds_left(self, now: datetime | None = None) -> float | None:
        if self.state != BufferState.OPEN:
            return None
        return max(0.0, (self.flush_at - (now or timezone.now())).total_seconds())
