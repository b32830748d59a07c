from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from agentloop.core import admin_texts
from agentloop.core.admin_texts import TextsHold
from agentloop.core.big_tables import BigTableAdmin, RecentValuesFilter
from agentloop.core.redaction import hide_secrets
from audit import console
from audit.listed_lookups import ListedLookupsOnly
from audit.models import AuditEvent, CaughtDuplicate, EventKind
from audit.targets import TARGET, target_words

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin as DjangoModelAdmin
    from django.db.models import QuerySet
    from django.http import HttpRequest, HttpResponse
    from django.utils.safestring import SafeString

    # unfold has no types; its ModelAdmin is Django's with a theme.
    ModelAdmin = DjangoModelAdmin[Any]
else:
    from unfold.admin import ModelAdmin

# An event's target ("claim 12", "ledger row 7"…) → the admin page of that row.
TARGETS = {"turn": "conversations_turn", "claim": "tools_actionclaim", "proposal": "tools_proposal",
           "ledger row": "delivery_outboundmessage"}
# A caught duplicate's status, as the guard records it (tools.guard.outcomes.Status).
STATUSES = {"done": _("done"), "duplicate": _("duplicate"), "in_progress": _("in progress"),
            "uncertain": _("uncertain"), "awaiting_approval": _("awaiting approval"), "failed": _("failed")}


def told(event: AuditEvent) -> str:
    """An event in the reader's words: its kind, and what it is about."""
    about = target_words(event.target)
    return f"{event.get_kind_display()}: {about}" if about else str(event.get_kind_display())


def change_link(url_name: str, pk: object, label: object) -> SafeString:
    return format_html('<a href="{}">{}</a>', reverse(f"admin:{url_name}_change", args=[pk]), label)


@admin.register(AuditEvent)
class AuditEventAdmin(TextsHold, BigTableAdmin, ListedLookupsOnly, ModelAdmin):
    list_display = ["at", "kind", "channel_slug", "conversation", "target_link", "summary_cell", "actor"]
    list_filter = ["kind", ("channel_slug", RecentValuesFilter)]
    list_filter_submit = True
    # Not the summary: an auditor must not probe an error text character by character.
    search_fields = ["target", "actor"]
    date_hierarchy = "at"
    linked_lookups = ("conversation_id", "target")  # a conversation's events; a claim's caught duplicates
    fields = ["kind", "at", "actor", "channel_slug", "conversation", "target_link", "summary_shown", "extra"]
    readonly_fields = fields  # type: ignore[assignment]  # names only (django-stubs: fields may be groups)

    def exact_matches(self, term: str) -> Q | None:
        return Q(target=term)  # "turn 12", "claim 7": audit_target_idx

    @admin.display(description=_("Conversation"), ordering="conversation_id")
    def conversation(self, event: AuditEvent) -> str:
        if not event.conversation_id:
            return "—"
        return change_link("conversations_conversation", event.conversation_id, event.conversation_id)

    @admin.display(description=_("Target"), ordering="target")
    def target_link(self, event: AuditEvent) -> str:
        match = TARGET.match(event.target)
        if match and match[1] in TARGETS and match[2].isdigit():
            return change_link(TARGETS[match[1]], match[2], target_words(event.target))
        return target_words(event.target)

    @admin.display(description=_("Summary"), ordering="summary")
    def summary_shown(self, event: AuditEvent) -> SafeString:
        # What happened in the reader's words; the summary as the product recorded it (in
        # English: a record, written once, read in any language) one click away.
        return format_html('<p>{}</p><details><summary>{}</summary><p class="al-whole">{}</p></details>',
                           told(event), gettext("As recorded"), hide_secrets(event.summary))

    @admin.display(description=_("Summary"))
    def summary_cell(self, event: AuditEvent) -> SafeString:
        # The reader's words, linked to the event's page where the record is whole.
        url = reverse(f"admin:{event._meta.app_label}_{event._meta.model_name}_change", args=[event.pk])
        return format_html('<a href="{}" title="{}">{}</a>', url, admin_texts.cut(hide_secrets(event.summary)),
                           told(event))

    # History must not change.
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False


@admin.register(CaughtDuplicate)
class CaughtDuplicateAdmin(AuditEventAdmin):
    """The guard's catches, with counts by tool and by day (a guard that never fires is
    idle; one that fires a lot points at a prompt problem upstream)."""

    list_display = ["at", "tool", "status", "channel_slug", "conversation", "original", "age", "actor"]
    list_filter = [("channel_slug", RecentValuesFilter)]
    fields = ["at", "tool", "status", "channel_slug", "conversation", "original", "age", "actor", "summary_shown",
              "extra"]
    readonly_fields = fields
    change_list_template = "admin/audit/caughtduplicate/change_list.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[AuditEvent]:
        return super().get_queryset(request).filter(kind=EventKind.DUPLICATE_PREVENTED)

    @admin.display(description=_("Tool"))
    def tool(self, event: AuditEvent) -> object:
        return event.extra.get("tool", "")

    @admin.display(description=_("Status"))
    def status(self, event: AuditEvent) -> object:
        status = event.extra.get("status", "")
        return STATUSES.get(status, status)

    @admin.display(description=_("Age of original"))
    def age(self, event: AuditEvent) -> str:
        seconds = event.extra.get("age_seconds")
        return f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else ""

    @admin.display(description=_("Original claim"))
    def original(self, event: AuditEvent) -> str:
        claim = event.extra.get("original_claim")
        if not claim:
            return "—"
        return change_link("tools_actionclaim", claim, gettext("claim %(id)s") % {"id": claim})

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Bounded whatever the trail's size (issue 30): the latest TOOL_SAMPLE catches by
        # tool, one range count per day for the last 14 days.
        by_tool = sorted(console.duplicates_by_tool().items(), key=lambda item: -item[1])
        by_day = sorted(console.duplicates_by_day(timezone.now() - timedelta(days=13)).items(), reverse=True)
        extra_context = {**(extra_context or {}), "by_tool": by_tool, "by_day": by_day,
                         "tool_sample": console.TOOL_SAMPLE}
        return super().changelist_view(request, extra_context)
