"""Routing rules: which agent answers a turn of a channel (conversations.routing).

A channel's rules are tried in order at the flush; the first whose every set criterion
matches chooses the agent, and a turn no rule matches goes to the channel's own agent.
A rule with no criterion never matches by itself: it is an agent another agent can hand
a conversation to (the handoff_to_agent tool)."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from conversations.models.channels import Channel


class ContactAttribute(models.TextChoices):
    """What of the contact a rule may match (exactly, ignoring case)."""

    USERNAME = "username", _("Username")
    DISPLAY_NAME = "display_name", _("Display name")
    PLATFORM_ID = "platform_id", _("Platform id")


class RoutingRule(models.Model):
    # No index of its own: the unique (channel, name) starts with it.
    channel = models.ForeignKey(Channel, verbose_name=_("channel"), on_delete=models.CASCADE, related_name="routing_rules", db_index=False)
    position = models.PositiveIntegerField(_("position"), default=0, help_text=_("Rules are tried in this order, lowest first."))
    name = models.SlugField(_("name"), max_length=50, help_text=_("The agent's name in this channel: what the story page "
                                                                  "shows and what handoff_to_agent names."))
    chat_id = models.CharField(_("chat ID"), max_length=100, blank=True, help_text=_("The chat or group id (exact)."))
    thread_id = models.CharField(_("thread ID"), max_length=50, blank=True,
                                 help_text=_("The thread or topic id (a Telegram forum topic's message_thread_id, "
                                             "a Slack thread)."))
    keywords = models.CharField(_("keywords"), max_length=300, blank=True,
                                help_text=_("Comma-separated words or phrases; one in the text (any case) matches."))
    language = models.CharField(_("language"), max_length=16, blank=True,
                                help_text=_("The sender's language (\"es\" also matches \"es-AR\")."))
    contact_attribute = models.CharField(_("contact attribute"), max_length=16, choices=ContactAttribute.choices, blank=True)
    contact_value = models.CharField(_("contact value"), max_length=200, blank=True, help_text=_("The contact attribute's value."))
    agent = models.CharField(_("agent"), max_length=50, default="echo")
    agent_config = models.JSONField(_("agent config"), default=dict, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("routing rule")
        verbose_name_plural = _("routing rules")
        ordering = ["channel", "position", "pk"]
        constraints = [models.UniqueConstraint(fields=["channel", "name"], name="routing_rule_name_per_channel")]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problem = agent_problem(self.agent, self.agent_config)
        if problem:
            raise ValidationError({"agent": problem})
        if bool(self.contact_attribute) != bool(self.contact_value):
            raise ValidationError({"contact_value": gettext("a contact attribute and its value go together")})


def agent_problem(agent: str, config: object) -> str:
    """Why a rule may not choose this agent ("" when it may)."""
    from conversations.agents import validate_agent_config

    if agent not in settings.AGENTLOOP_AGENTS:
        return gettext("unknown agent %(agent)s; known: %(known)s") % {
            "agent": repr(agent), "known": ", ".join(sorted(settings.AGENTLOOP_AGENTS))}
    if agent == "pull":  # conversations.turns.PULL_AGENT (which imports these models)
        return gettext("a pull agent claims a channel's turns through the API: it is a channel's agent, not a rule's")
    try:
        validate_agent_config(config)
    except ValidationError as exc:
        return "; ".join(exc.messages)
    return ""
