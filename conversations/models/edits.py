"""Edits of messages and what each changed."""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.models.messages import Conversation, InboundMessage


class EditOutcome(models.TextChoices):
    """What an edit of a message changed (conversations/edits.py decides)."""

    BUFFERED = "buffered", _("Corrected in the open buffer (window re-armed)")
    RERUN = "rerun", _("Turn cancelled and re-run with the corrected text")
    NOTED = "noted", _("Noted for the agent's next turn")
    UNCHANGED = "unchanged", _("Same text as before: nothing to change")
    NOT_APPLIED = "not_applied", _("Not applied: the message never reached a turn")
    IGNORED = "ignored", _("Ignored: the channel ignores edits")


class MessageEdit(models.Model):
    """One edit of an admitted message. The unique (message, edited_at) *is* the edit's
    dedup: a redelivered `edited_message` stops at its INSERT, as a message does."""

    # Neither has an index of its own: the unique (message, edited_at) and edit_conversation_idx
    # start with them.
    message = models.ForeignKey(InboundMessage, verbose_name=_("message"), on_delete=models.CASCADE, related_name="edits", db_index=False)
    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), on_delete=models.CASCADE, related_name="edits", db_index=False)
    edited_at = models.DateTimeField(_("edited at"), help_text=_("When the user edited it (Telegram's edit_date)."))
    received_at = models.DateTimeField(_("received at"), default=timezone.now)
    source = models.CharField(_("source"), max_length=16, help_text=_("telegram, api or webchat."))
    old_text = models.TextField(_("old text"), blank=True)
    new_text = models.TextField(_("new text"), blank=True)
    outcome = models.CharField(_("outcome"), max_length=16, choices=EditOutcome.choices)
    detail = models.CharField(_("detail"), max_length=300, blank=True, help_text=_("Why this outcome."))
    turn = models.ForeignKey("Turn", verbose_name=_("turn"), null=True, blank=True, on_delete=models.SET_NULL, related_name="edits",
                             help_text=_("The turn cancelled for a re-run, or the one the edit came too late for."))

    class Meta:
        verbose_name = _("message edit")
        verbose_name_plural = _("message edits")
        constraints = [
            models.UniqueConstraint(fields=["message", "edited_at"], name="message_edit_applied_once")
        ]
        indexes = [models.Index(fields=["conversation", "received_at"], name="edit_conversation_idx")]

    def __str__(self) -> str:
        return gettext("edit of message %(id)s (%(outcome)s)") % {"id": self.message_id, "outcome": self.get_outcome_display()}
