"""Agent keys in the admin: issued from the add form through the same function as
`manage.py createagentkey` (conversations.agent_keys), the secret shown once on the page
after it, and revoked by an action; both audited. Kept apart from conversations.admin
(long enough)."""

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _
from unfold.admin import ModelAdmin

from conversations import agent_keys
from conversations.models import AgentKey

# The secret waits in the operator's session between the form's POST and the page that
# shows it, which takes it out: a reload, another tab or another operator never sees it.
SHOWN_ONCE = "agentloop.agent_key_shown_once.{}"


def _operator(request):
    return f"admin:{request.user.get_username()}"


@admin.register(AgentKey)
class AgentKeyAdmin(ModelAdmin):
    list_display = ["name", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    readonly_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]
    filter_horizontal = ["channels"]
    actions = ["revoke"]

    def get_fields(self, request, obj=None):
        if obj is None:  # the add form: what the command takes
            return ["name", "channels"]
        return ["name", "channels", "prefix", "created_at", "last_used_at", "revoked_at"]

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        key, raw = agent_keys.issue(obj.name, form.cleaned_data["channels"], by=_operator(request), key=obj)
        request.session[SHOWN_ONCE.format(key.pk)] = raw

    def response_add(self, request, obj, post_url_continue=None):
        return HttpResponseRedirect(reverse("admin:conversations_agentkey_issued", args=[obj.pk]))

    def get_urls(self):
        issued = path("<int:pk>/issued/", self.admin_site.admin_view(self.issued_view),
                      name="conversations_agentkey_issued")
        return [issued, *super().get_urls()]

    def issued_view(self, request, pk):
        """The key just issued, its secret shown this once (taken out of the session)."""
        key = get_object_or_404(AgentKey, pk=pk)
        if not self.has_view_permission(request, key):
            raise PermissionDenied("seeing an agent key needs conversations.view_agentkey")
        raw = request.session.pop(SHOWN_ONCE.format(pk), None)
        return TemplateResponse(request, "admin/conversations/agentkey/issued.html", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "original": key,
            "title": gettext("Agent key %(key)s") % {"key": key}, "raw": raw, "channels": list(key.channels.order_by("slug"))})

    @admin.action(description=_("Revoke selected keys"))
    def revoke(self, request, queryset):
        revoked = agent_keys.revoke(queryset, by=_operator(request))
        self.message_user(request, ngettext("Revoked %(n)d key: the API refuses it from now on.",
                                            "Revoked %(n)d keys: the API refuses them from now on.", revoked)
                          % {"n": revoked})
