"""What we send back: every reply, control answer and notice, recorded before it is sent.

The Layer 3 issue turns this into the full durable ledger (attempt budgets, flood
control, the recovery prefix); here it already gives at-least-once delivery.
"""

from django.db import models
from django.utils import timezone


class OutboundKind(models.TextChoices):
    REPLY = "reply", "Agent reply"
    CONTROL = "control", "Control command answer"
    NOTICE = "notice", "Notice (reject, failure)"


class OutboundState(models.TextChoices):
    PENDING = "pending", "Pending"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    FAILED = "failed", "Failed"


class OutboundMessage(models.Model):
    TRANSITIONS = {
        OutboundState.PENDING: {OutboundState.SENDING},
        OutboundState.SENDING: {OutboundState.SENT, OutboundState.FAILED, OutboundState.PENDING},
    }

    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="outbound"
    )
    turn = models.ForeignKey(
        "conversations.Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="outbound"
    )
    kind = models.CharField(max_length=16, choices=OutboundKind.choices, default=OutboundKind.REPLY)
    text = models.TextField()
    reply_target = models.CharField(max_length=50, blank=True)
    thread_id = models.CharField(max_length=50, blank=True)
    state = models.CharField(max_length=16, choices=OutboundState.choices, default=OutboundState.PENDING)
    owner = models.CharField(max_length=100, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=300, blank=True)
    platform_message_id = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="outbound_queue_idx")]

    def __str__(self):
        return f"{self.kind} {self.pk} ({self.state})"
