"""The action guard's tables: tool policies, claims, proposals — and the local calendar.

State machines are written down once here (the *State enums and their TRANSITIONS);
every transition goes through the model's checked `transition()` (agentloop.core.states).
"""

from __future__ import annotations

import secrets
from typing import ClassVar

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agentloop.core.states import StateMachine

DEFAULT_WINDOW_SECONDS = 600


class ApprovalMode(models.TextChoices):
    """Who must say yes before a call of the action runs."""

    NONE = "none", _("Nobody (calls run)")
    OPERATOR = "operator", _("An operator (admin or dashboard)")
    USER = "user", _("The conversation's user (a question in the chat)")


class ToolPolicy(models.Model):
    """Operator settings for one action (a registered tool, or an action an external
    agent guards through the claim API). Created on first use with the tool's defaults."""

    name = models.CharField(_("name"), max_length=64, unique=True, help_text=_("Tool or action name."))
    enabled = models.BooleanField(_("enabled"), default=True, help_text=_("Off: the tool is not offered or run."))
    guarded = models.BooleanField(
        _("guarded"), default=True, help_text=_("Off: effectful calls run without the duplicate check (reads never are checked).")
    )
    window_seconds = models.PositiveIntegerField(
        _("window seconds"), default=DEFAULT_WINDOW_SECONDS, validators=[MinValueValidator(1)],
        help_text=_("An identical call within this time of the first is a duplicate."),
    )
    fingerprint_fields = models.JSONField(
        _("fingerprint fields"), default=list, blank=True,
        help_text=_('Argument names that define "the same action", e.g. ["title", "start_datetime"]. '
                    "Empty: the tool's default (all arguments for unknown actions)."),
    )
    approval = models.CharField(
        _("approval"), max_length=16, choices=ApprovalMode.choices, default=ApprovalMode.NONE,
        help_text=_("operator: calls become proposals an operator applies in the admin or the dashboard; user: "
                    "the conversation's user is asked in the chat (buttons, or a yes/no reply) and the tap applies it "
                    "(calls without a conversation wait for an operator)."),
    )
    max_per_hour = models.PositiveIntegerField(
        _("max per hour"), null=True, blank=True, validators=[MinValueValidator(1)],
        help_text=_("At most this many calls per scope (one contact) in any hour, and as many per agent key whatever "
                    "scopes it names, proposals included; the next ones fail and the model is told why. Empty: no "
                    "limit."),
    )
    approval_ttl_seconds = models.PositiveIntegerField(
        _("approval TTL seconds"), default=24 * 3600, validators=[MinValueValidator(1)], help_text=_("Proposals expire after this time.")
    )
    timeout_seconds = models.PositiveIntegerField(
        _("timeout seconds"), default=60, validators=[MinValueValidator(1)],
        help_text=_("A claim still in flight after this long is considered interrupted (outcome uncertain)."),
    )
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("tool policy")
        verbose_name_plural = _("tool policies")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def fingerprint_description(self) -> str:
        """The fields that define this action's identity, as operators read them."""
        from tools import registry  # the registry imports tool classes, which import models

        if self.fingerprint_fields:
            return " + ".join(self.fingerprint_fields)
        try:
            default = registry.get(self.name).fingerprint_fields
        except registry.UnknownTool:
            default = ()
        fields = " + ".join(default) if default else gettext("all arguments")
        return gettext("%(fields)s (default)") % {"fields": fields}

    @property
    def requires_approval(self) -> bool:
        """Someone (an operator or the user) must approve each call."""
        return self.approval != ApprovalMode.NONE


class ClaimState(models.TextChoices):
    IN_FLIGHT = "in_flight", _("In flight")
    DONE = "done", _("Done")
    RELEASED = "released", _("Released (failed or rejected)")
    UNCERTAIN = "uncertain", _("Uncertain (interrupted)")
    PROPOSED = "proposed", _("Awaiting approval")


class ActionClaim(StateMachine, models.Model):
    """The guard's row for one semantic action within its window.

    `live` is what the unique constraint holds: at most one live claim per
    (scope, action, fingerprint). A claim stops being live when it is released or its
    window has passed; its row stays as history (and as the original of duplicates).
    """

    TRANSITIONS = {
        ClaimState.IN_FLIGHT: {ClaimState.DONE, ClaimState.RELEASED, ClaimState.UNCERTAIN},
        # The truth arrived late (the run finished, or reconciliation found the effect)
        # or it is now known that nothing happened / an operator released it.
        ClaimState.UNCERTAIN: {ClaimState.DONE, ClaimState.RELEASED},
        ClaimState.PROPOSED: {ClaimState.IN_FLIGHT, ClaimState.RELEASED},
        ClaimState.DONE: set(),
        ClaimState.RELEASED: set(),
    }
    # Declared only, for the type checker: StateMachine's `objects` would otherwise hide
    # the manager Django gives this model (its rows typed as Any).
    objects: ClassVar[models.Manager[ActionClaim]]

    scope = models.CharField(_("scope"), max_length=200, help_text=_("Whose action: contact:ID or an API scope."))
    action = models.CharField(_("action"), max_length=64)
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    fingerprint_fields = models.JSONField(_("fingerprint fields"), default=list)
    # The normalised values hashed into the fingerprint (long texts appear as their hash).
    fingerprint_material = models.JSONField(_("fingerprint material"), default=dict)
    arguments = models.JSONField(_("arguments"), default=dict)
    state = models.CharField(_("state"), max_length=16, choices=ClaimState.choices, default=ClaimState.IN_FLIGHT)
    live = models.BooleanField(_("live"), default=True)
    owner = models.CharField(_("owner"), max_length=100, blank=True, help_text=_("Who is running it: worker, API key, operator."))
    conversation_id = models.BigIntegerField(_("conversation ID"), null=True, blank=True)
    channel_slug = models.CharField(_("channel slug"), max_length=50, blank=True)
    agent_key_id = models.BigIntegerField(_("agent key ID"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    expires_at = models.DateTimeField(_("expires at"), help_text=_("End of the window: identical calls after this are new actions."))
    lease_until = models.DateTimeField(_("lease until"), help_text=_("In flight past this instant: the run was interrupted."))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True)
    duplicates_caught = models.PositiveIntegerField(_("duplicates caught"), default=0)

    class Meta:
        verbose_name = _("action claim")
        verbose_name_plural = _("action claims")
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["scope", "action", "fingerprint"], condition=Q(live=True), name="claim_one_live_per_fingerprint"
            )
        ]
        indexes = [
            models.Index(fields=["state", "lease_until"], name="claim_state_lease_idx"),
            models.Index(fields=["scope", "action", "fingerprint"], name="claim_lookup_idx"),
            # The hourly limit per agent key (tools.guard.claiming._check_rate), one count per new claim.
            models.Index(fields=["agent_key_id", "action", "created_at"], name="claim_key_rate_idx",
                         condition=Q(agent_key_id__isnull=False)),
            # The changelist's order and date drill-down, the guard's telemetry per tool.
            models.Index(fields=["created_at"], name="claim_created_idx"),
            # The live ones (few: those inside their window), newest first: the admin's filter.
            models.Index(fields=["created_at"], condition=Q(live=True), name="claim_live_idx"),
            # A conversation's claims in time order (the story page, the admin's link).
            models.Index(fields=["conversation_id", "created_at"], name="claim_conversation_idx"),
        ]

    def __str__(self) -> str:
        return gettext("claim %(id)s %(action)s (%(state)s)") % {"id": self.pk, "action": self.action,
                                                              "state": self.get_state_display()}


class ProposalState(models.TextChoices):
    PENDING = "pending", _("Awaiting approval")
    APPLYING = "applying", _("Applying")
    APPLIED = "applied", _("Applied")
    FAILED = "failed", _("Failed")
    REJECTED = "rejected", _("Rejected")
    EXPIRED = "expired", _("Expired")


class Proposal(StateMachine, models.Model):
    """A call that waits for a person: Apply runs it once, Reject drops it."""

    TRANSITIONS = {
        ProposalState.PENDING: {ProposalState.APPLYING, ProposalState.REJECTED, ProposalState.EXPIRED},
        # APPLYING -> PENDING: an Apply interrupted before its claim was taken (data left
        # by a crash between the two steps before they shared a transaction): nothing
        # ran, so the proposal awaits a decision again (see tools.guard.proposals.reopen_interrupted).
        ProposalState.APPLYING: {ProposalState.APPLIED, ProposalState.FAILED, ProposalState.PENDING},
        ProposalState.APPLIED: set(),
        ProposalState.FAILED: set(),
        ProposalState.REJECTED: set(),
        ProposalState.EXPIRED: set(),
    }
    objects: ClassVar[models.Manager[Proposal]]  # declared only (see ActionClaim.objects)

    claim = models.OneToOneField(ActionClaim, verbose_name=_("claim"), on_delete=models.CASCADE, related_name="proposal")
    state = models.CharField(_("state"), max_length=16, choices=ProposalState.choices, default=ProposalState.PENDING)
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    expires_at = models.DateTimeField(_("expires at"))
    decided_by = models.CharField(_("decided by"), max_length=150, blank=True)
    decided_at = models.DateTimeField(_("decided at"), null=True, blank=True)
    result = models.JSONField(_("result"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True)

    class Meta:
        verbose_name = _("proposal")
        verbose_name_plural = _("proposals")
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["state", "expires_at"], name="proposal_state_exp_idx")]

    def __str__(self) -> str:
        return gettext("proposal %(id)s: %(action)s (%(state)s)") % {
            "id": self.pk, "action": self.claim.action, "state": self.get_state_display()}

    @property
    def is_open(self) -> bool:
        return self.state == ProposalState.PENDING and self.expires_at > timezone.now()


def new_confirmation_token() -> str:
    # 24 random bytes: not guessable, and "c:<token>:y" stays far below Telegram's 64-byte callback_data.
    return secrets.token_urlsafe(24)


class Confirmation(models.Model):
    """The question that asks a conversation's own user to confirm one proposal in the
    chat (tools.confirmations). The proposal's state is the truth; this row only maps the
    buttons' opaque token to it and remembers where the question went."""

    proposal = models.OneToOneField(Proposal, verbose_name=_("proposal"), on_delete=models.CASCADE, related_name="confirmation")
    token = models.CharField(_("token"), max_length=40, unique=True, default=new_confirmation_token, editable=False)
    conversation = models.ForeignKey("conversations.Conversation", verbose_name=_("conversation"), on_delete=models.CASCADE,
                                     related_name="confirmations")
    # The question's ledger row (pruned with the ledger after 7 days: the link goes, the row stays).
    question = models.ForeignKey("delivery.OutboundMessage", verbose_name=_("question"), null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="confirmations")
    text = models.TextField(_("text"), help_text=_("The question as the user reads it."))
    asked_at = models.DateTimeField(_("asked at"), default=timezone.now)
    taps = models.PositiveIntegerField(_("taps"), default=0, help_text=_("Answers received (taps, replayed callbacks, replies)."))
    last_tap_at = models.DateTimeField(_("last tap at"), null=True, blank=True)

    class Meta:
        verbose_name = _("confirmation")
        verbose_name_plural = _("confirmations")
        ordering = ["-asked_at"]

    def __str__(self) -> str:
        return f"confirmation of proposal {self.proposal_id}"


def new_feed_token() -> str:
    return secrets.token_urlsafe(18)


class Calendar(models.Model):
    """The local backend's calendar for one scope (usually one contact)."""

    scope = models.CharField(_("scope"), max_length=200, unique=True)
    name = models.CharField(_("name"), max_length=200, blank=True)
    feed_token = models.CharField(_("feed token"), max_length=40, unique=True, default=new_feed_token, editable=False)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("calendar")
        verbose_name_plural = _("calendars")

    def __str__(self) -> str:
        return self.name or self.scope


class CalendarEvent(models.Model):
    # No index of its own: event_calendar_start_idx starts with it.
    calendar = models.ForeignKey(Calendar, verbose_name=_("calendar"), on_delete=models.CASCADE, related_name="events", db_index=False)
    uid = models.CharField(_("UID"), max_length=200, unique=True, help_text=_("iCalendar UID (derived from the guard's claim)."))
    title = models.CharField(_("title"), max_length=300)
    start = models.DateTimeField(_("start"))
    end = models.DateTimeField(_("end"), null=True, blank=True)
    attendees = models.JSONField(_("attendees"), default=list, blank=True)
    location = models.CharField(_("location"), max_length=300, blank=True)
    description = models.TextField(_("description"), blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("calendar event")
        verbose_name_plural = _("calendar events")
        ordering = ["start"]
        indexes = [models.Index(fields=["calendar", "start"], name="event_calendar_start_idx")]

    def __str__(self) -> str:
        return f"{self.title} @ {self.start:%Y-%m-%d %H:%M}"


from tools.mcp.models import McpServer, McpTool, McpTransport  # noqa: E402,F401  (the app's models)
