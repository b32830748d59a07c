from django.contrib import admin

from django.db.models import Count
from django.db.models.functions import TruncDate
from django.urls import reverse
from django.utils.html import format_html

from audit.models import AuditEvent, CaughtDuplicate, EventKind


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["at", "kind", "channel_slug", "conversation_id", "target", "summary", "actor"]
    list_filter = ["kind", "channel_slug"]
    search_fields = ["target", "summary", "actor"]
    date_hierarchy = "at"

    # History must not change.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(CaughtDuplicate)
class CaughtDuplicateAdmin(AuditEventAdmin):
    """The guard's catches, with counts by tool and by day (a guard that never fires is
    idle; one that fires a lot points at a prompt problem upstream)."""

    list_display = ["at", "tool", "status", "channel_slug", "conversation", "original", "age", "actor"]
    list_filter = ["channel_slug"]
    change_list_template = "admin/audit/caughtduplicate/change_list.html"

    def get_queryset(self, request):
        return super().get_queryset(request).filter(kind=EventKind.DUPLICATE_PREVENTED)

    @admin.display(description="Tool")
    def tool(self, event):
        return event.extra.get("tool", "")

    @admin.display(description="Status")
    def status(self, event):
        return event.extra.get("status", "")

    @admin.display(description="Age of original")
    def age(self, event):
        seconds = event.extra.get("age_seconds")
        return f"{seconds:.0f} s" if isinstance(seconds, (int, float)) else ""

    @admin.display(description="Original claim")
    def original(self, event):
        claim = event.extra.get("original_claim")
        if not claim:
            return "—"
        return format_html('<a href="{}">claim {}</a>', reverse("admin:tools_actionclaim_change", args=[claim]), claim)

    @admin.display(description="Conversation")
    def conversation(self, event):
        if not event.conversation_id:
            return "—"
        url = reverse("admin:conversations_conversation_change", args=[event.conversation_id])
        return format_html('<a href="{}">{}</a>', url, event.conversation_id)

    def changelist_view(self, request, extra_context=None):
        events = self.get_queryset(request)
        by_tool = events.values("extra__tool").annotate(n=Count("id")).order_by("-n")
        by_day = events.annotate(day=TruncDate("at")).values("day").annotate(n=Count("id")).order_by("-day")[:14]
        extra_context = {**(extra_context or {}),
                         "by_tool": [(row["extra__tool"], row["n"]) for row in by_tool],
                         "by_day": [(row["day"], row["n"]) for row in by_day]}
        return super().changelist_view(request, extra_context)
