from django.contrib import admin

from audit.models import AuditEvent


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
