"""The admin's part of "people in control" (conversations.handoff, conversations.limits):
take a conversation over or give it back, see who hit a limit and lift it. Mixins for
the ModelAdmins in conversations.admin (kept apart: that module is long enough); the
Limits page itself is conversations.admin_limits, hung under the contacts' URLs here."""

from django.contrib import admin
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from conversations import admin_limits, handoff, limits


def _operator(request):
    return f"admin:{request.user.get_username()}"


class HoldActions:
    """For ConversationAdmin."""

    @admin.action(description=_("Take over: a person answers, the agent stops"))
    def take_over(self, request, queryset):
        taken = sum(handoff.take_over(pk, _operator(request)) for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, ngettext(
            "%(n)d conversation taken over; reply from the story page or the API",
            "%(n)d conversations taken over; reply from the story page or the API", taken) % {"n": taken})

    @admin.action(description=_("Give back to the agent (with a note of what happened)"))
    def give_back(self, request, queryset):
        given = sum(handoff.give_back(pk, _operator(request)) for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, ngettext("%(n)d conversation given back to the agent",
                                            "%(n)d conversations given back to the agent", given) % {"n": given})


class LimitedFilter(admin.SimpleListFilter):
    title = _("limit")
    parameter_name = "limited"

    def lookups(self, request, model_admin):
        return [("now", _("over a limit now")), ("ever", _("hit a limit"))]

    def queryset(self, request, queryset):
        if self.value() == "now":
            return queryset.filter(limited_until__gt=timezone.now())
        if self.value() == "ever":
            return queryset.exclude(limit_reason="")
        return queryset


class LimitActions:
    """For ContactAdmin: who hit a limit, lifting it, and the Limits page at
    `<contacts>/limits/` (admin:conversations_contact_limits)."""

    def get_urls(self):
        page = admin_limits.LimitsView.as_view(model_admin=self)
        return [path("limits/", self.admin_site.admin_view(page), name=admin_limits.URL_NAME), *super().get_urls()]

    @admin.action(description=_("Lift their limits (usage counts from now)"))
    def lift_limits(self, request, queryset):
        lifted = limits.lift(list(queryset.values_list("pk", flat=True)), _operator(request))
        self.message_user(request, ngettext("limits lifted for %(n)d contact", "limits lifted for %(n)d contacts",
                                            lifted) % {"n": lifted})

    @admin.display(description=_("over a limit until"))
    def limited(self, obj):
        if obj.limited_until and obj.limited_until > timezone.now():
            until = date_format(timezone.localtime(obj.limited_until), "SHORT_DATETIME_FORMAT")
            return format_html('<a href="{}">{} ({})</a>', reverse(f"admin:{admin_limits.URL_NAME}"), until,
                               admin_limits.reason_shown(obj.limit_reason))
        return "—"
