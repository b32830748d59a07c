"""The admin's sidebar: what an operator does, not which app a table lives in.

Operate (what happens now and what waits for a person), Configure (how the product
answers), Observe (what it did), System (who may do it, and the machinery). django-unfold
draws it (settings UNFOLD["SIDEBAR"]); each entry shows only to those who may see its page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.urls import reverse
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.http import HttpRequest
    from django.utils.functional import Promise


@dataclass(frozen=True)
class Entry:
    title: str | Promise
    icon: str  # a Material Symbols name (unfold ships the font)
    model: str = ""  # "app_label.model_name": the changelist, seen with its view permission
    url_name: str = ""  # or a named page, seen with `permission`
    permission: str = ""
    query: str = ""  # a changelist's filter, e.g. "state__exact=pending"

    def link(self) -> str:
        if self.model:
            app_label, model_name = self.model.split(".")
            url = reverse(f"admin:{app_label}_{model_name}_changelist")
        else:
            url = reverse(self.url_name)
        return f"{url}?{self.query}" if self.query else url

    def allowed(self, user: User | AnonymousUser) -> bool:
        if self.model:
            app_label, model_name = self.model.split(".")
            return user.has_perm(f"{app_label}.view_{model_name}")
        return not self.permission or user.has_perm(self.permission)


GROUPS: list[tuple[str | Promise, list[Entry]]] = [
    (_("Operate"), [
        Entry(_("Overview"), "space_dashboard", url_name="admin:index"),
        Entry(_("Live dashboard"), "monitoring", url_name="console-dashboard", permission="audit.view_auditevent"),
        Entry(_("Playground"), "chat", url_name="console-playground", permission="conversations.change_channel"),
        Entry(_("Conversations"), "forum", model="conversations.conversation"),
        Entry(_("Approvals waiting"), "approval", model="tools.proposal", query="state__exact=pending"),
        Entry(_("Scheduled messages"), "schedule_send", model="delivery.scheduledmessage"),
        Entry(_("Contacts"), "person", model="conversations.contact"),
    ]),
    (_("Configure"), [
        Entry(_("Channels"), "hub", model="conversations.channel"),
        Entry(_("Agent keys"), "key", model="conversations.agentkey"),
        Entry(_("Tool policies"), "build", model="tools.toolpolicy"),
        Entry(_("Limits"), "speed", url_name="admin:conversations_contact_limits", permission="conversations.view_contact"),
        Entry(_("MCP servers"), "dns", model="tools.mcpserver"),
        Entry(_("Calendars"), "calendar_month", model="tools.calendar"),
    ]),
    (_("Observe"), [
        Entry(_("Turns"), "play_circle", model="conversations.turn"),
        Entry(_("Delivery ledger"), "outbox", model="delivery.outboundmessage"),
        Entry(_("Duplicates prevented"), "content_copy", model="audit.caughtduplicate"),
        Entry(_("Action claims"), "verified", model="tools.actionclaim"),
        Entry(_("Audit trail"), "history", model="audit.auditevent"),
        Entry(_("Inbound messages"), "inbox", model="conversations.inboundmessage"),
        Entry(_("Unreachable chats"), "block", model="delivery.unreachablechat"),
        Entry(_("API docs"), "api", url_name="api-docs"),
    ]),
    (_("System"), [
        Entry(_("Users"), "group", model="auth.user"),
        Entry(_("Roles"), "badge", model="auth.group"),
        Entry(_("Login lockouts"), "lock", model="axes.accessattempt"),
        Entry(_("Workers"), "memory", model="conversations.workerheartbeat"),
        Entry(_("Background tasks"), "task", model="django_q.schedule"),
    ]),
]


def sidebar(request: HttpRequest) -> list[dict[str, Any]]:
    """unfold's SIDEBAR["navigation"]: the groups with the entries this user may open; the
    one entry whose page this is marked active — the entry with the longest path the page's
    path starts with (unfold alone marks every prefix: Contacts beside Limits, which lives
    under it)."""
    groups = []
    for title, entries in GROUPS:
        items = [{"title": e.title, "icon": e.icon, "link": e.link()} for e in entries if e.allowed(request.user)]
        if items:
            groups.append({"title": title, "separator": True, "collapsible": False, "items": items})
    _mark_active(groups, request.path)
    return groups


def _mark_active(groups: list[dict[str, Any]], path: str) -> None:
    items = [item for group in groups for item in group["items"]]
    index = reverse("admin:index")
    matches = [item for item in items if _path_of(item["link"]) == path
               or (_path_of(item["link"]) != index and path.startswith(_path_of(item["link"])))]
    best = max(matches, key=lambda item: len(_path_of(item["link"])), default=None)
    for item in items:
        item["active"] = item is best


def _path_of(link: str) -> str:
    return link.split("?", 1)[0]
