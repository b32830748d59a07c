"""How a conversation's story is handed out: each entry as a dict (the page and the JSON
download share it), and what the HTML page adds to read it as a timeline — local times,
the date once per day, the time since the step before, the kind it is filtered by, and the
conversation's state for the sticky header.

Times are shown in the deployment's time zone (Django's TIME_ZONE, `timezone.localtime`),
server-side, so the page needs no script to be read and says which zone it uses."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from agentloop.core.people import display_name
from agentloop.core.redaction import channel_secrets, redact
from conversations.models import ConversationState, Turn, TurnState

if TYPE_CHECKING:
    from agentloop.console.story import Entry, Page
    from conversations.models import Conversation

# The kinds an operator filters by, in the filter bar's order: an entry's kind -> its group.
GROUPS = {
    "messages": (gettext_lazy("Messages"), ("message", "edit", "reaction")),
    "windows": (gettext_lazy("Windows"), ("buffer",)),
    "turns": (gettext_lazy("Turns"), ("turn",)),
    "guard": (gettext_lazy("Tool calls and guard"), ("claim",)),
    "replies": (gettext_lazy("Replies and ledger"), ("ledger",)),
    "notes": (gettext_lazy("Notes"), ("note",)),
    "audit": (gettext_lazy("Audit"), ("audit", "double_texting")),
}
# An entry's kind as the pill on its line says it (the JSON keeps the code).
KIND_LABELS = {
    "message": gettext_lazy("message"), "edit": gettext_lazy("edit"), "reaction": gettext_lazy("reaction"),
    "buffer": gettext_lazy("window"), "turn": gettext_lazy("turn"), "claim": gettext_lazy("guard"),
    "ledger": gettext_lazy("ledger"), "note": gettext_lazy("note"), "audit": gettext_lazy("audit"),
    "double_texting": gettext_lazy("double texting"),
}
GROUP_OF = {kind: group for group, (_label, kinds) in GROUPS.items() for kind in kinds}


def _iso(value: datetime | None) -> str:
    return value.isoformat(timespec="microseconds") if value else "—"


def admin_url(model_label: str, pk: object) -> str:
    app, model = model_label.split(".")
    return reverse(f"admin:{app}_{model}_change", args=[pk])


def as_dict(entry: Entry, can_view: Callable[[str], bool] = lambda label: True) -> dict[str, Any]:
    """One entry as the page and the JSON download show it: links only to the rows the
    reader may open."""
    shown = {
        "at": _iso(entry.at), "kind": entry.kind, "id": entry.pk, "title": entry.title, "text": entry.text,
        "details": [{"label": label, "value": str(value)} for label, value in entry.details],
        "links": [{"label": label, "url": admin_url(model, pk) if can_view(model) else None}
                  for label, model, pk in entry.links],
    }
    if getattr(entry, "by", ""):  # a person's reply: who wrote it
        shown["by"] = entry.by
    return shown


def as_json(page_: Page, can_view: Callable[[str], bool] = lambda label: True) -> dict[str, Any]:
    c = page_.conversation
    return {
        "conversation": {"id": c.pk, "channel": c.channel.slug, "contact": redact(str(c.contact), channel_secrets(
            c.channel)), "chat_id": c.chat_id, "double_texting": c.channel.double_texting,
            "state": c.state, "held_by": c.held_by, "holder": display_name(c.held_by)},
        "entries": [as_dict(e, can_view) for e in page_.entries],
        "earlier": page_.earlier,
        "not_recorded": NOT_RECORDED,
    }


# --- the HTML page: a timeline ----------------------------------------------------------------


def timeline(page_: Page, shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The page's entry dicts with what the HTML adds: `local` (an aware datetime in
    TIME_ZONE), `day` (set on the first entry of each date), `gap` ("+1.2 s" since the
    entry before) and `group` (the filter it answers to)."""
    previous: tuple[datetime, datetime] | None = None
    for entry, item in zip(page_.entries, shown, strict=True):
        local = timezone.localtime(entry.at)
        item.update(local=local, group=GROUP_OF.get(entry.kind, "audit"), label=KIND_LABELS.get(entry.kind, entry.kind),
                    day=local.date() if previous is None or local.date() != previous[1].date() else None,
                    gap=gap(previous[0], entry.at) if previous else "")
        previous = (entry.at, local)
    return shown


def gap(earlier: datetime, later: datetime) -> str:
    """The time between two steps, as an operator reads it: +0.4 s, +12.0 s, +3 min 5 s, +2 h 10 min."""
    seconds = max((later - earlier).total_seconds(), 0.0)
    if seconds < 60:
        return f"+{seconds:.1f} s"
    if seconds < 3600:
        return f"+{int(seconds // 60)} min {int(seconds % 60)} s"
    if seconds < 86400:
        return f"+{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    return f"+{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"


def header(conversation: Conversation) -> dict[str, Any]:
    """The sticky header's state: who answers, the running turn (one query), the limits."""
    channel, contact = conversation.channel, conversation.contact
    running = (Turn.objects.filter(conversation=conversation, state=TurnState.RUNNING)
               .order_by("pk").values_list("pk", flat=True).first())
    limits = []
    if channel.turns_per_contact_per_hour:
        limits.append(_("%(n)s turns per person per hour") % {"n": channel.turns_per_contact_per_hour})
    if channel.tokens_per_contact_per_day:
        limits.append(_("%(n)s tokens per person per day") % {"n": channel.tokens_per_contact_per_day})
    limited = contact.limited_until if contact and contact.limited_until and \
        contact.limited_until > timezone.now() else None
    return {"held": conversation.state == ConversationState.PERSON, "holder": display_name(conversation.held_by),
            "held_at": conversation.held_at, "running": running, "limits": limits, "limited_until": limited,
            "limit_reason": contact.limit_reason if limited else "", "idle_minutes": channel.handoff_idle_minutes,
            "groups": [(key, label) for key, (label, _kinds) in GROUPS.items()]}


NOT_RECORDED = [
    "Duplicate deliveries refused by the inbound dedup: the unique constraint refuses them and the webhook "
    "answers 200 with duplicate: true; no row or event is written per delivery.",
    "The tools offered to each model request and its read-only or unguarded calls: only guarded calls leave "
    "a claim (shown).",
    "Each send attempt of a ledger row: the row keeps the count, the last outcome and the last error (shown).",
    "The window of a message that was not its buffer's last is recomputed from its text with the channel's "
    "current settings (the buffer stores the window of its last message only).",
]
