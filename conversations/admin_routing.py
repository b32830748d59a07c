"""The channel admin's routing rules (conversations.routing): an ordered inline, each
save of it one audit event (who added, changed or removed which rule)."""

from django.utils.translation import gettext_lazy
from unfold.admin import StackedInline

from conversations import routing
from conversations.models import RoutingRule


class RoutingRuleInline(StackedInline):
    model = RoutingRule
    extra = 0
    ordering = ["position", "pk"]
    fields = [("position", "name"), ("chat_id", "thread_id"), ("keywords", "language"),
              ("contact_attribute", "contact_value"), ("agent", "agent_config")]
    verbose_name = gettext_lazy("routing rule")
    verbose_name_plural = gettext_lazy(
        "Routing rules: tried in order at each flush, the first that matches chooses the agent (no match: the "
        "channel's agent above; a rule with no criterion is only reached by handoff_to_agent)")


class RoutingRulesInAdmin:
    """For ChannelAdmin: the inline, and its saves audited."""

    inlines = [RoutingRuleInline]

    def save_formset(self, request, form, formset, change):
        if formset.model is not RoutingRule:
            return super().save_formset(request, form, formset, change)  # type: ignore[misc]
        formset.save()
        routing.record_change(form.instance, f"admin:{request.user.get_username()}",
                              added=[routing.describe(rule) for rule in formset.new_objects],
                              changed=[routing.describe(rule) for rule, _ in formset.changed_objects],
                              deleted=[routing.describe(rule) for rule in formset.deleted_objects])
        return None
