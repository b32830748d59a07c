"""The admin's first screen: what needs a person now, each count a link to the page where
it is dealt with, then the way to the live consoles and the retention in force. Read
through each app's console functions (no app's tables here), every count bounded."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from conversations import console as conversations_console
from conversations import engine
from delivery import console as delivery_console
from tools import console as tools_console

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User
    from django.http import HttpRequest
    from django.utils.functional import Promise

CAP = conversations_console.OVERVIEW_CAP


@dataclass
class Card:
    key: str
    title: str | Promise
    count: int
    hint: str | Promise
    link: str
    attention: bool  # painted as needing someone only when it does (a zero is calm)

    @property
    def shown(self) -> str:
        return f"{CAP}+" if self.count >= CAP else str(self.count)


def _changelist(model: str, query: str = "") -> str:
    app_label, model_name = model.split(".")
    url = reverse(f"admin:{app_label}_{model_name}_changelist")
    return f"{url}?{query}" if query else url


def cards(user: User | AnonymousUser, now: datetime | None = None) -> list[Card]:
    """The cards this user may follow (a card whose page the user may not open is left out)."""
    now = now or timezone.now()
    people = conversations_console.needing_people(CAP)
    workers_alive = engine.workers_alive(now)
    found = [
        ("tools.proposal", Card("approvals", _("Approvals waiting"),
                                tools_console.pending_count(CAP),
                                _("Actions an agent proposed that wait for a person's yes or no."),
                                _changelist("tools.proposal", "state__exact=pending"), True)),
        ("conversations.conversation", Card("held", _("Held by a person"), people["held"],
                                            _("Conversations taken over: the agent is silent until they are given back."),
                                            _changelist("conversations.conversation", "state__exact=person"), False)),
        ("conversations.conversation", Card("paused", _("Paused by the loop breaker"), people["paused"],
                                            _("Two bots answering each other were stopped; give them back when it is safe."),
                                            _changelist("conversations.conversation", "state__exact=person&held_by=loop+breaker"), True)),
        ("delivery.outboundmessage", Card("given_up", _("Replies given up (24 h)"),
                                          delivery_console.given_up_since(now - timedelta(days=1), CAP),
                                          _("Replies the ledger stopped trying: the person never got them."),
                                          _changelist("delivery.outboundmessage", "state__in=abandoned,unreachable&age=24h"),
                                          True)),
        ("delivery.outboundmessage", Card("owed", _("Replies owed"), delivery_console.owed(CAP),
                                          _("Replies waiting to go out or being retried."),
                                          _changelist("delivery.outboundmessage"), False)),
        ("conversations.turn", Card("failed_turns", _("Turns failed (24 h)"), people["failed_turns"],
                                    _("Agent runs that ended in an error: the model, a tool or the agent's server."),
                                    _changelist("conversations.turn", "state__exact=failed"), True)),
        ("conversations.contact", Card("limited", _("People over a limit"), people["limited"],
                                       _("Contacts held back by a turn or token limit until it resets."),
                                       reverse("admin:conversations_contact_limits"), False)),
        ("conversations.workerheartbeat", Card("workers", _("Workers alive"), workers_alive,
                                               _("No worker alive: nothing is buffered, answered or delivered."),
                                               _changelist("conversations.workerheartbeat"), False)),
    ]
    shown = []
    for model, card in found:
        app_label, model_name = model.split(".")
        if not user.has_perm(f"{app_label}.view_{model_name}"):
            continue
        if card.key == "workers":
            card.attention = card.count == 0
        else:
            card.attention = card.attention and card.count > 0
        shown.append(card)
    return shown


def dashboard_callback(request: HttpRequest, context: dict[str, Any]) -> dict[str, Any]:
    """unfold's DASHBOARD_CALLBACK: the admin index's context, with the overview's cards."""
    found = cards(request.user)
    context["overview"] = [{**asdict(c), "shown": c.shown} for c in found]
    context["needs_attention"] = any(c.attention for c in found)
    return context
