"""Reactions people put on the bot's messages (Telegram's message_reaction, Slack's
reaction_added, WhatsApp's reaction messages) and what each did (conversations/reactions.py)."""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.models.messages import Conversation


class ReactionOutcome(models.TextChoices):
    NOTED = "noted", _("Noted for the agent's next turn")
    CONFIRMED = "confirmed", _("Confirmed the question it was put on (👍)")
    REJECTED = "rejected", _("Declined the question it was put on (👎)")
    ALREADY = "already", _("On a question decided before")
    NOT_YOURS = "not_yours", _("On a question only the conversation's person may answer")
    IGNORED = "ignored", _("Not on a message of the bot's")


class InboundReaction(models.Model):
    """One reaction event. The unique (channel, key) — the platform's own id of the event
    (Telegram's update_id, Slack's event_id, WhatsApp's message id) — *is* the dedup: a
    redelivered webhook stops at its INSERT and adds no second note."""

    channel = models.ForeignKey("Channel", verbose_name=_("channel"), on_delete=models.CASCADE, related_name="reactions", db_index=False)
    key = models.CharField(_("key"), max_length=200, help_text=_("The platform's id of the reaction event."))
    conversation = models.ForeignKey(Conversation, verbose_name=_("conversation"), null=True, blank=True, on_delete=models.CASCADE,
                                     related_name="reactions", db_index=False)
    platform_message_id = models.CharField(_("platform message ID"), max_length=200, help_text=_("The message reacted to."))
    emoji = models.CharField(_("emoji"), max_length=64, blank=True, help_text=_("Empty: a reaction taken back."))
    sender_id = models.CharField(_("sender ID"), max_length=100, blank=True)
    outcome = models.CharField(_("outcome"), max_length=16, choices=ReactionOutcome.choices)
    reacted_at = models.DateTimeField(_("reacted at"), default=timezone.now)

    class Meta:
        verbose_name = _("inbound reaction")
        verbose_name_plural = _("inbound reactions")
        constraints = [models.UniqueConstraint(fields=["channel", "key"], name="reaction_applied_once")]
        indexes = [models.Index(fields=["conversation", "reacted_at"], name="reaction_conversation_idx")]

    def __str__(self) -> str:
        return gettext("%(emoji)s on %(id)s (%(outcome)s)") % {
            "emoji": self.emoji or gettext("reaction removed"), "id": self.platform_message_id,
            "outcome": self.get_outcome_display()}
