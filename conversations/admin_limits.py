"""Limits, in one admin page (issue 53): every limit an operator sets and who is held by
one now. Per channel, the turns and model tokens one person may use (conversations.limits;
set on the channel's form); the people over a limit now, when it resets and why, with the
lift (conversations.limits.lift, audited as from the contacts' action); the tools' calls
per hour (ToolPolicy.max_per_hour, tools.guard); the API's rate; the latest limit events
of the audit trail.

It hangs under the contacts' admin (LimitActions.get_urls, conversations.admin_people),
in the theme through unfold's UnfoldModelAdminViewMixin. Operators read and lift; auditors
read (the page is the audit trail's view of the limits: no secret of a channel in it);
anyone else is refused.
"""

import re
from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext
from django.views.generic import TemplateView
from unfold.views import UnfoldModelAdminViewMixin

from audit.models import AuditEvent, EventKind
from conversations import limits
from conversations.models import Channel, Contact
from tools import guard
from tools.models import ToolPolicy

URL_NAME = "conversations_contact_limits"
# Who may open the page: whoever reads the contacts (operators) or the audit trail (auditors).
READ_PERMISSIONS = ("conversations.view_contact", "audit.view_auditevent")
LIFT_PERMISSION = "conversations.change_contact"
PEOPLE_SHOWN = 200  # the people over a limit listed, soonest reset first; the count says how many in all
EVENTS_SHOWN = 20
LIMIT_EVENTS = (EventKind.LIMIT_REACHED, EventKind.LIMIT_LIFTED)

# conversations.limits stores why a person is held in English ("5 turns per hour"): shown
# in the reader's language (in English, as stored).
REASONS = (
    (re.compile(r"^(\d+) turns per hour$"), _("%(n)s turns per hour")),
    (re.compile(r"^(\d+) model tokens per day$"), _("%(n)s model tokens per day")),
)


def may_read(user) -> bool:
    return any(user.has_perm(permission) for permission in READ_PERMISSIONS)


def reason_shown(reason: str) -> str:
    for pattern, text in REASONS:
        found = pattern.match(reason)
        if found:
            return str(text % {"n": found.group(1)})
    return reason


@dataclass
class ChannelLimits:
    channel: Channel
    turns_per_hour: int
    tokens_per_day: int
    people_over: int
    change_link: str

    @property
    def sets_none(self) -> bool:
        return not (self.turns_per_hour or self.tokens_per_day)


def channel_limits(user, now) -> list[ChannelLimits]:
    """Every channel, with its limits per person (0: none) and how many people it holds now."""
    may_change = user.has_perm("conversations.change_channel")
    channels = Channel.objects.annotate(
        people_over=Count("contacts", filter=Q(contacts__limited_until__gt=now))).order_by("slug")
    return [ChannelLimits(channel, channel.turns_per_contact_per_hour, channel.tokens_per_contact_per_day,
                          channel.people_over,
                          reverse("admin:conversations_channel_change", args=[channel.pk]) if may_change else "")
            for channel in channels]


def people_over(now) -> tuple[list[dict], int]:
    """The people over a limit now, the soonest to be free first (at most PEOPLE_SHOWN), and
    how many there are in all."""
    held = Contact.objects.filter(limited_until__gt=now)
    shown = held.select_related("channel").order_by("limited_until", "pk")[:PEOPLE_SHOWN]
    return ([{"contact": c, "until": c.limited_until, "reason": reason_shown(c.limit_reason),
              "link": reverse("admin:conversations_contact_change", args=[c.pk])} for c in shown],
            held.count())


def tool_limits(user) -> list[dict]:
    """Every tool's policy (one row per registered tool, as its changelist makes them) with its
    calls per hour per person and per agent key (None: no limit)."""
    guard.ensure_policies()
    may_change = user.has_perm("tools.change_toolpolicy")
    return [{"policy": policy, "max_per_hour": policy.max_per_hour,
             "change_link": reverse("admin:tools_toolpolicy_change", args=[policy.pk]) if may_change else ""}
            for policy in ToolPolicy.objects.order_by("name")]


def limit_events() -> list[dict]:
    """The latest limits reached and lifted, newest first."""
    events = AuditEvent.objects.filter(kind__in=LIMIT_EVENTS).order_by("-at", "-pk")[:EVENTS_SHOWN]
    return [_limit_event(e) for e in events]


def _limit_event(event) -> dict:
    """Who and why, read from how conversations.limits records them (not its English target:
    reached names the person as actor and the turn as target, lifted the operator as actor
    and "contact <platform id>" as target, the reason lifted as summary)."""
    reached = event.kind == EventKind.LIMIT_REACHED
    return {"event": event, "reached": reached,
            "person": event.actor if reached else event.target.removeprefix("contact "),
            "by": "" if reached else event.actor,
            "reason": reason_shown(event.extra.get("reason", "") if reached else event.summary),
            "link": reverse("admin:audit_auditevent_change", args=[event.pk])}


def api_rate() -> str:
    """The REST API's and /mcp's rate per agent key (AGENTLOOP_API_RATE, set in the environment)."""
    return settings.REST_FRAMEWORK.get("DEFAULT_THROTTLE_RATES", {}).get("user") or ""


class LimitsView(UnfoldModelAdminViewMixin, TemplateView):
    title = _("Limits")
    template_name = "admin/conversations/limits.html"

    def has_permission(self):
        return may_read(self.request.user)

    def get_context_data(self, **kwargs):
        now = timezone.now()
        user = self.request.user
        people, people_count = people_over(now)
        channels = channel_limits(user, now)
        audit_list = reverse("admin:audit_auditevent_changelist")
        return super().get_context_data(
            **kwargs, now=now, channels=channels, unlimited=[c for c in channels if c.sets_none],
            people=people, people_count=people_count, people_capped=people_count > len(people),
            may_lift=user.has_perm(LIFT_PERMISSION), tools=tool_limits(user), api_rate=api_rate(),
            events=limit_events(), may_read_audit=user.has_perm("audit.view_auditevent"),
            reached_link=f"{audit_list}?kind__exact={EventKind.LIMIT_REACHED}",
            lifted_link=f"{audit_list}?kind__exact={EventKind.LIMIT_LIFTED}",
            content_title=self.title)  # unfold's header: Conversations › Contacts › Limits

    def post(self, request, *args, **kwargs):
        """Lift the limits of the people chosen (their usage counts from now), then back here."""
        if not request.user.has_perm(LIFT_PERMISSION):
            raise PermissionDenied("lifting a limit needs conversations.change_contact")
        chosen = [int(pk) for pk in request.POST.getlist("contact") if pk.isdigit()]
        lifted = limits.lift(chosen, f"admin:{request.user.get_username()}") if chosen else 0
        messages.success(request, ngettext("Limit lifted for %(n)d person: their usage counts from now.",
                                           "Limits lifted for %(n)d people: their usage counts from now.",
                                           lifted) % {"n": lifted})
        return HttpResponseRedirect(reverse(f"admin:{URL_NAME}"))
