"""The audit trail: what happened, to what, when and who did it. Rows never change."""

from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from audit.targets import target_words


class EventKind(models.TextChoices):
    # Layer 1
    MESSAGE_REJECTED = "message_rejected", _("Message rejected (turn running)")
    TURN_INTERRUPTED = "turn_interrupted", _("Turn interrupted")
    TURN_ROLLED_BACK = "turn_rolled_back", _("Turn rolled back")
    STRATEGY_FELL_BACK = "strategy_fell_back", _("Interrupt refused: effect already fired")
    CONTROL_COMMAND = "control_command", _("Control command")
    TURN_RECOVERED = "turn_recovered", _("Turn recovered from a dead worker")
    TURN_FAILED = "turn_failed", _("Turn failed")
    MESSAGE_OVERFLOWED = "message_overflowed", _("Message not buffered (too many pending)")
    MESSAGE_REFUSED = "message_refused", _("Message refused (cannot be stored)")
    MESSAGE_EDITED = "message_edited", _("Message edited by the user")
    EDIT_IGNORED = "edit_ignored", _("Edit ignored (changed nothing)")
    MESSAGE_DELETED = "message_deleted", _("Message deleted by the user")
    CONVERSATION_TAKEN_OVER = "conversation_taken_over", _("A person took the conversation over")
    CONVERSATION_GIVEN_BACK = "conversation_given_back", _("The conversation went back to the agent")
    PERSON_REPLIED = "person_replied", _("A person replied in a held conversation")
    LIMIT_REACHED = "limit_reached", _("A person reached a limit (messages stored, not answered)")
    LIMIT_LIFTED = "limit_lifted", _("An operator lifted a person's limit")
    BOT_MESSAGE_IGNORED = "bot_message_ignored", _("A bot's message kept as context (the channel does not allow it)")
    LOOP_BROKEN = "loop_broken", _("The loop breaker paused the agent (replies without a human message)")
    ROUTING_CHANGED = "routing_changed", _("A channel's routing rules changed")
    AGENT_HANDOFF = "agent_handoff", _("An agent handed the conversation to another agent")
    # Layer 2
    DUPLICATE_PREVENTED = "duplicate_prevented", _("Duplicate prevented")
    ACTION_UNCERTAIN = "action_uncertain", _("Action interrupted (outcome uncertain)")
    ACTION_RECONCILED = "action_reconciled", _("Uncertain action reconciled")
    CLAIM_RELEASED = "claim_released", _("Claim released by an operator")
    PROPOSAL_CREATED = "proposal_created", _("Proposal awaiting approval")
    PROPOSAL_APPLIED = "proposal_applied", _("Proposal applied")
    PROPOSAL_REJECTED = "proposal_rejected", _("Proposal rejected")
    PROPOSAL_EXPIRED = "proposal_expired", _("Proposal expired")
    # Layer 3
    REPLY_RECOVERED = "reply_recovered", _("Reply resent with the recovery prefix")
    REPLY_ABANDONED = "reply_abandoned", _("Reply abandoned")
    CHAT_UNREACHABLE = "chat_unreachable", _("Chat unreachable (never retried)")
    CHANNEL_BLOCKED = "channel_blocked", _("Channel blocked (its credentials were refused; replies wait)")
    REPLY_FAILED_AFTER_SEND = "reply_failed_after_send", _("Reply not delivered after all (platform receipt)")
    # Operations
    CONTACT_ERASED = "contact_erased", _("A person's data erased on request")
    AGENT_KEY_ISSUED = "agent_key_issued", _("An agent key was issued (its secret shown once)")
    AGENT_KEY_REVOKED = "agent_key_revoked", _("An agent key was revoked")


class AuditEvent(models.Model):
    kind = models.CharField(_("kind"), max_length=40, choices=EventKind.choices)
    at = models.DateTimeField(_("at"), default=timezone.now)
    actor = models.CharField(_("actor"), max_length=100, blank=True, help_text=_("Who: a contact, worker or operator."))
    channel_slug = models.CharField(_("channel slug"), max_length=50, blank=True)
    conversation_id = models.BigIntegerField(_("conversation ID"), null=True, blank=True)
    target = models.CharField(_("target"), max_length=200, blank=True, help_text=_("What: e.g. 'turn 12'."))
    summary = models.CharField(_("summary"), max_length=300, blank=True)
    extra = models.JSONField(_("extra"), default=dict, blank=True)

    class Meta:
        verbose_name = _("audit event")
        verbose_name_plural = _("audit events")
        ordering = ["-at"]
        indexes = [
            models.Index(fields=["kind", "at"], name="audit_kind_at_idx"),
            # The changelist's order and date drill-down, the dashboard's latest events.
            models.Index(fields=["at"], name="audit_at_idx"),
            # A conversation's events in time order (the story page, the admin's link).
            models.Index(fields=["conversation_id", "at"], name="audit_conversation_idx"),
            # A channel's events (the changelist's filter and each period its drill-down
            # probes) and a target's ("turn 12": the search's exact match, the links of a
            # claim's page). Events are the exceptions, not one per message: two indexes
            # nothing on a message's way writes.
            models.Index(fields=["channel_slug", "at"], name="audit_channel_at_idx"),
            models.Index(fields=["target", "at"], name="audit_target_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {target_words(self.target)}"


class CaughtDuplicate(AuditEvent):
    """The "Duplicate prevented" events, in the admin on their own."""

    class Meta:
        verbose_name = _("caught duplicate")
        verbose_name_plural = _("caught duplicates")
        proxy = True
