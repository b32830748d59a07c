from django.contrib import admin

from delivery.models import OutboundMessage


@admin.register(OutboundMessage)
class OutboundMessageAdmin(admin.ModelAdmin):
    list_display = ["pk", "conversation", "kind", "state", "attempts", "short_text", "created_at", "sent_at"]
    list_filter = ["state", "kind", "conversation__channel"]
    search_fields = ["text"]
    readonly_fields = [f.name for f in OutboundMessage._meta.fields]

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text[:80]

    def has_add_permission(self, request):
        return False
