from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import Q
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.timezone import localtime
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from agentloop.core import admin_texts
from agentloop.core.admin_texts import TextsHold
from agentloop.core.big_tables import BigTableAdmin, RecentValuesFilter, numeric_id
from audit.listed_lookups import ListedLookupsOnly
from tools import approvals, guard, registry
from tools.conversation_side import conversation_side
from tools.models import (
    ActionClaim,
    ApprovalMode,
    Calendar,
    CalendarEvent,
    ClaimState,
    Confirmation,
    Proposal,
    ProposalState,
    ToolPolicy,
)

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin, TabularInline
    from django.db.models import Model, QuerySet
    from django.http import HttpRequest, HttpResponse
    from django.urls import URLPattern
    from django.utils.safestring import SafeString
    from django_stubs_ext import StrOrPromise

    # unfold has no types; its ModelAdmin and TabularInline are Django's with a theme.
    PolicyAdminBase = ModelAdmin[ToolPolicy]
    ClaimAdminBase = ModelAdmin[ActionClaim]
    ProposalAdminBase = ModelAdmin[Proposal]
    CalendarAdminBase = ModelAdmin[Calendar]
    EventAdminBase = ModelAdmin[CalendarEvent]
    EventInlineBase = TabularInline[CalendarEvent, Calendar]

    Shown = TypeVar("Shown", bound=Callable[..., Any])

    def display(*, description: StrOrPromise, ordering: str, label: dict[str, str]) -> Callable[[Shown], Shown]:
        """unfold's: a column shown as a label, toned by the (value, text) the method returns."""
else:
    from unfold.admin import ModelAdmin, TabularInline
    from unfold.decorators import display

    PolicyAdminBase = ClaimAdminBase = ProposalAdminBase = CalendarAdminBase = EventAdminBase = ModelAdmin
    EventInlineBase = TabularInline


def admin_link(model_name: str, pk: int | None, label: StrOrPromise | None = None, app: str = "tools",
               noun: StrOrPromise | None = None) -> str:
    """A link to a row's admin page, named by its model's name in the reader's language
    ("conversación 3"): tools' own models by their name; another app's, `noun` given by the
    caller (through the foreign key that reaches it, or the name it is known by)."""
    if pk is None:
        return "—"
    name = noun if noun is not None else TOOLS_MODELS[model_name]._meta.verbose_name
    return format_html('<a href="{}">{}</a>', reverse(f"admin:{app}_{model_name}_change", args=[pk]),
                       label or f"{name} {pk}")


TOOLS_MODELS: dict[str, type[Model]] = {model._meta.model_name or "": model for model in (
    ActionClaim, Calendar, CalendarEvent, Confirmation, Proposal, ToolPolicy)}


# States as labels: what waits for a person or was cut short stands out.
CLAIM_TONES = admin_texts.tones(ClaimState, uncertain="warning", in_flight="info", proposed="info")
PROPOSAL_TONES = admin_texts.tones(ProposalState, pending="warning", applying="info", failed="danger",
                                   applied="success")


def change_url(obj: Model) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


def in_declared_order(action: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """A call's arguments in the order its tool declares them (to, subject, body), the
    same on both databases: PostgreSQL's jsonb keeps an object's keys shortest first.
    Hosted tools only (an MCP tool's schema may be a server away); the rest as stored."""
    tool = registry.all_tools().get(action)
    rank = {name: i for i, name in enumerate(tool.parameters.get("properties", {}) if tool else ())}
    return dict(sorted((arguments or {}).items(), key=lambda item: rank.get(item[0], len(rank))))


@admin.register(ToolPolicy)
class ToolPolicyAdmin(PolicyAdminBase):
    # Edited in place, seven columns; the approval's lifetime and the timeout on its page.
    list_display = ["name", "enabled", "guarded", "window_seconds", "fingerprint", "approval", "max_per_hour"]
    list_editable = ["enabled", "guarded", "window_seconds", "approval", "max_per_hour"]
    list_filter = ["enabled", "guarded", "approval"]
    search_fields = ["name"]
    fieldsets = [
        (None, {"fields": ["name", "enabled"]}),
        (_("Duplicate guard"), {"fields": ["guarded", "window_seconds", "fingerprint_fields", "timeout_seconds"],
                                "description": _("An identical call (same fingerprint fields, same contact) within the "
                                                 "window is not run again; the model is told it was already done.")}),
        (_("A person in the loop"), {"fields": ["approval", "approval_ttl_seconds"],
                                     "description": _("operator: an operator applies each call in the admin or the "
                                                      "dashboard. user: the conversation's user is asked in the chat "
                                                      "(buttons on Telegram and the web chat, a yes/no reply on WhatsApp; "
                                                      "refused on api channels, where the asking agent could answer) "
                                                      "and their tap applies it, once.")}),
        (_("Limits"), {"fields": ["max_per_hour"],
                       "description": _("Calls a single contact may make of this action per hour (proposals count; "
                                        "failed and rejected ones do not). email_send starts at 10.")}),
    ]

    @admin.display(description=_("Fingerprint"))
    def fingerprint(self, policy: ToolPolicy) -> str:
        # The argument names are identifiers (<code>), the rest words in the reader's language.
        fields = policy.fingerprint_fields
        default = not fields
        if default:
            try:
                fields = registry.get(policy.name).fingerprint_fields
            except registry.UnknownTool:
                fields = ()
        shown = format_html_join(" + ", "<code>{}</code>", ((f,) for f in fields)) if fields \
            else gettext("all arguments")
        return format_html(gettext("{fields} (default)"), fields=shown) if default else shown

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        guard.ensure_policies()  # every registered tool shows up, even before its first call
        return super().changelist_view(request, extra_context)

    def save_model(self, request: HttpRequest, obj: ToolPolicy, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        guard.forget_policies()
        if obj.approval == ApprovalMode.USER:
            refusing = guard.unconfirmable_channels()
            if refusing:
                messages.warning(request, gettext(
                    "%(tool)s: the user's confirmation cannot be trusted on channels whose messages agent keys post "
                    "(the asker could answer), so calls in their conversations are refused: %(channels)s")
                    % {"tool": obj.name, "channels": ", ".join(refusing)})


@admin.register(ActionClaim)
class ActionClaimAdmin(TextsHold, BigTableAdmin, ListedLookupsOnly, ClaimAdminBase):
    # What an operator scans: which action, how it stands, with what, for whom, when, and
    # whether the guard caught a repeat; scope, lease, owner and proposal on the claim's page.
    list_display = ["id", "action", "state_shown", "arguments_cell", "conversation", "created_at", "duplicates"]
    list_filter = ["state", ("action", RecentValuesFilter), "live", ("channel_slug", RecentValuesFilter)]
    list_filter_submit = True
    search_fields = ["=id", "action", "scope", "fingerprint", "owner"]
    date_hierarchy = "created_at"
    linked_lookups = ("conversation_id",)  # a conversation's claims
    actions = ["reconcile_claims", "release_claims"]
    readonly_fields = [f.name for f in ActionClaim._meta.fields] + ["conversation", "turn", "proposal_link",
                                                                    "duplicates", "arguments_shown"]
    fieldsets = [
        (None, {"fields": ["action", "state", "live", "scope", "conversation", "turn", "channel_slug", "owner",
                           "agent_key_id", "proposal_link"]}),
        (_("Identity"), {"fields": ["arguments_shown", "fingerprint", "fingerprint_fields", "fingerprint_material"]}),
        (_("Timing"), {"fields": ["created_at", "expires_at", "lease_until", "finished_at"]}),
        (_("Outcome"), {"fields": ["result", "error", "duplicates"]}),
    ]

    def exact_matches(self, term: str) -> Q:
        scope = Q(scope=term)  # claim_lookup_idx leads with it
        row = numeric_id(term)
        return scope | row if row is not None else scope

    @admin.display(description=_("Conversation"))
    def conversation(self, claim: ActionClaim) -> str:
        return admin_link("conversation", claim.conversation_id, app="conversations", noun=_("conversation"))

    @display(description=_("state"), ordering="state", label=CLAIM_TONES)
    def state_shown(self, claim: ActionClaim) -> tuple[str, str]:
        return claim.state, claim.get_state_display()

    @admin.display(description=_("arguments"))
    def arguments_cell(self, claim: ActionClaim) -> SafeString:
        return admin_texts.pairs_line(in_declared_order(claim.action, claim.arguments), change_url(claim), length=60)

    @admin.display(description=_("arguments"))
    def arguments_shown(self, claim: ActionClaim) -> SafeString:
        return admin_texts.pairs(in_declared_order(claim.action, claim.arguments))

    @admin.display(description=_("Turn"))
    def turn(self, claim: ActionClaim) -> str:
        """Claims do not record their turn; a claim taken inside a turn is owned by the
        worker running it, and a conversation runs one turn at a time."""
        worker = claim.owner.removeprefix("worker:")
        if not claim.conversation_id or worker == claim.owner:
            return "—"
        turn_id = conversation_side().turn_running_at(claim.conversation_id, worker, claim.created_at)
        return admin_link("turn", turn_id, app="conversations", noun=_("turn"))

    @admin.display(description=_("Duplicates caught"), ordering="duplicates_caught")
    def duplicates(self, claim: ActionClaim) -> str | int:
        if not claim.duplicates_caught:
            return 0
        url = reverse("admin:audit_caughtduplicate_changelist") + "?" + urlencode({"target": f"claim {claim.pk}"})
        return format_html('<a href="{}">{}</a>', url, claim.duplicates_caught)

    @admin.display(description=_("Proposal"))
    def proposal_link(self, claim: ActionClaim) -> str:
        try:
            return admin_link("proposal", claim.proposal.pk)
        except Proposal.DoesNotExist:
            return "—"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ActionClaim]:
        return super().get_queryset(request).select_related("proposal")  # not a query per row

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: ActionClaim | None = None) -> bool:
        return False  # history: claims change only through the guard and the actions below

    def has_delete_permission(self, request: HttpRequest, obj: ActionClaim | None = None) -> bool:
        return False

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("tools.change_actionclaim")  # operators; auditors only read

    @admin.action(description=_("Reconcile uncertain claims (ask the tool whether it happened)"),
                  permissions=["operate"])
    def reconcile_claims(self, request: HttpRequest, queryset: QuerySet[ActionClaim]) -> None:
        settled = 0
        for claim in queryset.filter(state=ClaimState.UNCERTAIN):
            settled += guard.reconcile(claim, actor=f"operator:{request.user}") != ClaimState.UNCERTAIN
        self.message_user(request, ngettext("%(n)d claim settled; the rest cannot be looked up by their tool.",
                                            "%(n)d claims settled; the rest cannot be looked up by their tool.",
                                            settled) % {"n": settled})

    @admin.action(description=_("Release uncertain claims (it did not happen: allow a new attempt)"),
                  permissions=["operate"])
    def release_claims(self, request: HttpRequest, queryset: QuerySet[ActionClaim]) -> None:
        released = sum(guard.release(claim.pk, by=f"operator:{request.user}")
                       for claim in queryset.filter(state__in=[ClaimState.UNCERTAIN, ClaimState.IN_FLIGHT]))
        self.message_user(request, ngettext("Released %(n)d claim.", "Released %(n)d claims.", released)
                          % {"n": released})


@admin.register(Proposal)
class ProposalAdmin(TextsHold, ListedLookupsOnly, ProposalAdminBase):
    list_display = ["id", "action", "what", "state_shown", "expires", "decided_by", "buttons"]
    list_filter = ["state", "claim__action"]
    list_filter_submit = True
    ordering = ["-pk"]  # the newest first: the ones still waiting are there
    search_fields = ["=id", "claim__action", "decided_by"]
    actions = ["apply_selected", "reject_selected"]
    # (Not the list's "Apply / Reject…" link: on this page the decision is at the top.)
    readonly_fields = ["claim_link", "action", "arguments_in_full", "state", "created_at", "expires_in_full",
                       "decided_by", "decided_at", "result", "error", "asked"]
    fields = readonly_fields  # type: ignore[assignment]  # field names, which django-stubs reads as possible groups
    # Apply / Reject buttons (POST forms with the CSRF token) on the proposal's page.
    change_form_template = "admin/tools/proposal/change_form.html"

    @admin.display(description=_("Action"))
    def action(self, proposal: Proposal) -> str:
        return proposal.claim.action

    @admin.display(description=_("Arguments"))
    def what(self, proposal: Proposal) -> SafeString:
        arguments = in_declared_order(proposal.claim.action, proposal.claim.arguments)
        return admin_texts.pairs_line(arguments, change_url(proposal))  # the page shows them whole

    @admin.display(description=_("Arguments"))
    def arguments_in_full(self, proposal: Proposal) -> SafeString:
        """Everything the action will do, uncut: an operator approves what they read
        (every recipient of an email, its whole body)."""
        return admin_texts.pairs(in_declared_order(proposal.claim.action, proposal.claim.arguments))

    @display(description=_("state"), ordering="state", label=PROPOSAL_TONES)
    def state_shown(self, proposal: Proposal) -> tuple[str, str]:
        return proposal.state, proposal.get_state_display()

    @admin.display(description=_("expires"), ordering="expires_at")
    def expires(self, proposal: Proposal) -> str:
        """When an open one lapses, "in 1 day"; a decided one no longer does."""
        if not proposal.is_open:
            return "—"
        return format_html('<span title="{}">{}</span>', date_format(localtime(proposal.expires_at), "DATETIME_FORMAT"),
                           admin_texts.relative(proposal.expires_at))

    @admin.display(description=_("expires"))
    def expires_in_full(self, proposal: Proposal) -> str:
        moment = date_format(localtime(proposal.expires_at), "DATETIME_FORMAT")
        return f"{admin_texts.relative(proposal.expires_at)} ({moment})"

    @admin.display(description=_("Claim"))
    def claim_link(self, proposal: Proposal) -> str:
        return admin_link("actionclaim", proposal.claim_id)

    @admin.display(description=_("Asked in the chat"))
    def asked(self, proposal: Proposal) -> str:
        """Under approval = user: the question the conversation's user was sent (they
        decide with its buttons or a yes/no reply; an operator may still decide here)."""
        try:
            question = proposal.confirmation
        except Confirmation.DoesNotExist:
            return "—"
        return ngettext("“%(question)s” — %(n)d answer", "“%(question)s” — %(n)d answers", question.taps) % {
            "question": question.text, "n": question.taps}

    @admin.display(description=_("Decide"))
    def buttons(self, proposal: Proposal) -> str:
        if not proposal.is_open:
            return "—"
        return admin_link("proposal", proposal.pk, gettext("Apply / Reject…"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Proposal]:
        return super().get_queryset(request).select_related("claim")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Proposal | None = None) -> bool:
        return False

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Every field is read-only: a proposal is decided with Apply / Reject (its
        # template), never saved; a Save button would offer an edit that does not exist.
        extra_context = {**(extra_context or {}), "show_save": False, "show_save_and_continue": False,
                         "show_save_and_add_another": False}
        return super().changeform_view(request, object_id, form_url, extra_context)

    def get_urls(self) -> list[URLPattern]:
        return [
            path("<int:pk>/apply/", self.admin_site.admin_view(self.apply_view), name="tools_proposal_apply"),
            path("<int:pk>/reject/", self.admin_site.admin_view(self.reject_view), name="tools_proposal_reject"),
        ] + super().get_urls()

    def _decide(self, request: HttpRequest, pk: int, decide: Callable[..., Proposal]) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not request.user.has_perm("tools.change_proposal"):
            messages.error(request, gettext("You may not decide proposals."))
        else:
            get_object_or_404(Proposal, pk=pk)
            proposal = decide(pk, by=request.user.get_username())
            level = messages.SUCCESS if proposal.state in (ProposalState.APPLIED, ProposalState.REJECTED) else \
                messages.WARNING
            messages.add_message(request, level, gettext("Proposal %(id)s: %(state)s.") % {
                "id": pk, "state": proposal.get_state_display()})
        return HttpResponseRedirect(self._next_url(request, pk))

    @staticmethod
    def _next_url(request: HttpRequest, pk: int) -> str:
        """Back where the decision was made (the dashboard, the list), but only on this
        site: a forged form must not turn the admin into a redirect to anywhere."""
        wanted = request.POST.get("next")
        if not wanted:
            return reverse("admin:tools_proposal_changelist")
        if url_has_allowed_host_and_scheme(wanted, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
            return wanted
        return reverse("admin:tools_proposal_change", args=[pk])

    def apply_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._decide(request, pk, approvals.apply)

    def reject_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        return self._decide(request, pk, approvals.reject)

    @admin.action(description=_("Apply selected proposals (each runs once)"), permissions=["change"])
    def apply_selected(self, request: HttpRequest, queryset: QuerySet[Proposal]) -> None:
        done = [approvals.apply(p.pk, by=request.user.get_username()) for p in queryset]
        self.message_user(request, ", ".join(f"{p.pk}: {p.get_state_display()}" for p in done) or gettext("nothing"))

    @admin.action(description=_("Reject selected proposals"), permissions=["change"])
    def reject_selected(self, request: HttpRequest, queryset: QuerySet[Proposal]) -> None:
        done = [approvals.reject(p.pk, by=request.user.get_username()) for p in queryset]
        self.message_user(request, ", ".join(f"{p.pk}: {p.get_state_display()}" for p in done) or gettext("nothing"))


class CalendarEventInline(EventInlineBase):
    model = CalendarEvent
    extra = 0
    fields = ["title", "start", "end", "location", "uid"]
    readonly_fields = ["uid"]


@admin.register(Calendar)
class CalendarAdmin(CalendarAdminBase):
    list_display = ["__str__", "scope", "event_count", "feed"]
    search_fields = ["scope", "name"]
    readonly_fields = ["feed", "created_at"]
    inlines = [CalendarEventInline]

    @admin.display(description=_("Events"))
    def event_count(self, calendar: Calendar) -> int:
        return calendar.events.count()

    @admin.display(description=_("iCalendar feed"))
    def feed(self, calendar: Calendar) -> SafeString:
        url = reverse("calendar-feed", args=[calendar.feed_token])
        return format_html('<a href="{}">{}</a>', url, url)


@admin.register(CalendarEvent)
class CalendarEventAdmin(TextsHold, EventAdminBase):
    list_display = ["title_shown", "start", "end", "calendar", "location_shown", "created_at"]
    list_filter = ["calendar"]
    search_fields = ["title", "uid", "location"]
    date_hierarchy = "start"
    readonly_fields = ["uid", "created_at"]

    # What an agent wrote may be long: cut here, whole on the event's page.
    @admin.display(description=_("title"), ordering="title")
    def title_shown(self, event: CalendarEvent) -> SafeString:
        return admin_texts.name(event.title)

    @admin.display(description=_("location"))
    def location_shown(self, event: CalendarEvent) -> SafeString:
        return admin_texts.cell(event.location, change_url(event), length=60)


from tools.mcp import admin as mcp_admin  # noqa: E402,F401  (MCP servers and their tools)
