"""The admin's part of "people in control" (conversations.handoff, conversations.limits):
take a conversation over or give it back, see who hit a limit and lift it. Mixins for
the ModelAdmins in conversations.admin (kept apart: that module is long enough)."""

from django.contrib import admin
from django.utils import timezone

from conversations import handoff, limits


def _operator(request):
    return f"admin:{request.user.get_username()}"


class HoldActions:
    """For ConversationAdmin."""

    @admin.action(description="Take over: a person answers, the agent stops")
    def take_over(self, request, queryset):
        taken = sum(handoff.take_over(pk, _operator(request)) for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"{taken} conversation(s) taken over; reply from the story page or the API")

    @admin.action(description="Give back to the agent (with a note of what happened)")
    def give_back(self, request, queryset):
        given = sum(handoff.give_back(pk, _operator(request)) for pk in queryset.values_list("pk", flat=True))
        self.message_user(request, f"{given} conversation(s) given back to the agent")


class LimitedFilter(admin.SimpleListFilter):
    title = "limit"
    parameter_name = "limited"

    def lookups(self, request, model_admin):
        return [("now", "over a limit now"), ("ever", "hit a limit")]

    def queryset(self, request, queryset):
        if self.value() == "now":
            return queryset.filter(limited_until__gt=timezone.now())
        if self.value() == "ever":
            return queryset.exclude(limit_reason="")
        return queryset


class LimitActions:
    """For ContactAdmin: who hit a limit, and lifting it."""

    @admin.action(description="Lift their limits (usage counts from now)")
    def lift_limits(self, request, queryset):
        lifted = limits.lift(list(queryset.values_list("pk", flat=True)), _operator(request))
        self.message_user(request, f"limits lifted for {lifted} contact(s)")

    @admin.display(description="over a limit until")
    def limited(self, obj):
        if obj.limited_until and obj.limited_until > timezone.now():
            return f"{obj.limited_until:%Y-%m-%d %H:%M} ({obj.limit_reason})"
        return "—"
