"""Edits of messages and what each changed."""

from django.db import models
from django.utils import timezone

from conversations.models.messages import Conversation, InboundMessage


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

    # Neither has an index of its own: the unique (message, edited_at) and edit_conversation_idx
    # start with them.
    message = models.ForeignKey(InboundMessage, on_delete=models.CASCADE, related_name="edits", db_index=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="edits", db_index=False)
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
