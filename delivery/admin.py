from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from agentloop.core import admin_texts
from agentloop.core.admin_texts import TextsHold
from agentloop.core.big_tables import BigTableAdmin, numeric_id, per_channel
from agentloop.core.redaction import hide_secrets
from audit.listed_lookups import ListedLookupsOnly
from delivery import attachments, ledger, templates
from delivery.models import OutboundMessage, OutboundState, ScheduledMessage, ScheduleState, UnreachableChat

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from django.contrib.admin import ModelAdmin as DjangoModelAdmin
    from django.db.models import Model, Q, QuerySet
    from django.http import HttpRequest
    from django.utils.safestring import SafeString
    from django_stubs_ext import StrOrPromise

    # unfold has no types: its ModelAdmin is Django's with a theme, and its display()
    # Django's with a label (a state shown in its colour).
    ModelAdmin = DjangoModelAdmin[Any]
    _Shown = TypeVar("_Shown", bound=Callable[..., Any])

    def display(**options: Any) -> Callable[[_Shown], _Shown]: ...
else:
    from unfold.admin import ModelAdmin
    from unfold.decorators import display


class AgeFilter(admin.SimpleListFilter):
    title = _("age")
    parameter_name = "age"
    SPANS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}

    def lookups(self, request: HttpRequest, model_admin: ModelAdmin) -> list[tuple[str, StrOrPromise]]:
        return [("1h", _("Last hour")), ("24h", _("Last 24 hours")), ("7d", _("Last 7 days")),
                ("stale", _("Older than 24 hours"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[OutboundMessage]) -> QuerySet[OutboundMessage]:
        now = timezone.now()
        value = self.value()
        if value == "stale":
            return queryset.filter(created_at__lte=now - ledger.FRESHNESS)
        if value in self.SPANS:
            return queryset.filter(created_at__gt=now - self.SPANS[value])
        return queryset


# A ledger row's state as a label: given up is red, a retry orange, one on its way blue;
# delivered, the usual case, stays plain.
LEDGER_TONES = admin_texts.tones(OutboundState, failed="warning", unreachable="danger", abandoned="danger",
                                  pending="info", attempting="info")


def change_url(obj: Model) -> str:
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


@admin.register(OutboundMessage)
class LedgerRowAdmin(TextsHold, BigTableAdmin, ListedLookupsOnly, ModelAdmin):
    # What an operator scans: where to, how it stands, how often tried, what it says, when;
    # kind, marker, outcome and the timings are on the row's page.
    list_display = ["pk", "channel", "chat_id", "state_shown", "attempts", "short_text", "created_at"]
    list_filter = ["state", "channel", AgeFilter, "kind", "last_outcome", "needs_marker"]
    list_filter_submit = True
    search_fields = ["=pk", "text", "chat_id"]  # never error texts: they are not for probing
    date_hierarchy = "created_at"
    ordering = ["-created_at", "-pk"]  # along outbound_created_idx, as the drill-down's days
    # A conversation's, a turn's, an unreachable chat's rows (conversations.admin, below).
    # state__in: the overview's "replies given up" (abandoned or unreachable, agentloop.console.overview).
    linked_lookups = ("conversation__id__exact", "turn__id__exact", "chat_id", "state__in")
    actions = ["retry_now", "abandon"]
    readonly_fields = [f.name for f in OutboundMessage._meta.fields] + ["conversation_link", "turn_link",
                                                                        "chunk_progress", "error_shown",
                                                                        "unreachable_link", "files_shown",
                                                                        "template_shown"]
    fieldsets = [
        (None, {"fields": ["state", "kind", "channel", "chat_id", "thread_id", "reply_target", "conversation_link",
                           "turn_link", "text", "files_shown", "template_shown", "dedup_key"]}),
        (_("Delivery"), {"fields": ["attempts", "flood_waits", "extra_resends", "needs_marker", "chunk_progress",
                                 "last_outcome",
                                 "error_shown", "unreachable_link", "owner", "claim_token", "platform_message_id"]}),
        (_("Timing"), {"fields": ["created_at", "claimed_at", "next_attempt_at", "delivered_at", "retried_at"]}),
    ]

    def exact_matches(self, term: str) -> Q:
        by_chat = per_channel(OutboundMessage, chat_id=term)
        row = numeric_id(term)
        return by_chat | row if row is not None else by_chat

    @admin.display(description=_("Chunks"))
    def chunk_progress(self, row: OutboundMessage) -> str:
        """A long reply's chunks: how many are known delivered and whether the next had started."""
        total = len(row.chunks) or 1
        done = total if row.state == "delivered" else row.chunks_delivered
        started = row.chunks_started > row.chunks_delivered and done < total
        shown = gettext("%(done)s of %(total)s delivered") % {"done": done, "total": total}
        return shown + (gettext("; chunk %(next)s was started") % {"next": done + 1} if started else "")

    @admin.display(description=_("Files"))
    def files_shown(self, row: OutboundMessage) -> str:
        """The files the reply carries after its text (delivery.attachments), in order."""
        return "; ".join(attachments.listed(row.chunks)) or "—"

    @admin.display(description=_("Sent as template"))
    def template_shown(self, row: OutboundMessage) -> str:
        """An approved template the row goes out as (outside WhatsApp's window), filled."""
        return templates.shown(row.template) or "—"

    @display(description=_("state"), ordering="state", label=LEDGER_TONES)
    def state_shown(self, row: OutboundMessage) -> tuple[str, str]:
        return row.state, row.get_state_display()

    @admin.display(description=_("text"))
    def short_text(self, row: OutboundMessage) -> str:
        return admin_texts.cell(row.text, change_url(row))

    @admin.display(description=_("Conversation"))
    def conversation_link(self, row: OutboundMessage) -> str:
        url = reverse("admin:conversations_conversation_change", args=[row.conversation_id])
        return format_html('<a href="{}">{}</a>', url, row.conversation_id)

    @admin.display(description=_("Turn"))
    def turn_link(self, row: OutboundMessage) -> str:
        if not row.turn_id:
            return "—"
        return format_html('<a href="{}">{}</a>', reverse("admin:conversations_turn_change", args=[row.turn_id]),
                           gettext("turn %(id)s") % {"id": row.turn_id})

    @admin.display(description=_("Last error"))
    def error_shown(self, row: OutboundMessage) -> str:
        return hide_secrets(row.last_error)

    @admin.display(description=_("Unreachable chat"))
    def unreachable_link(self, row: OutboundMessage) -> str:
        chat = UnreachableChat.objects.filter(channel_id=row.channel_id, chat_id=row.chat_id).first()
        if chat is None:
            return "—"
        url = reverse("admin:delivery_unreachablechat_change", args=[chat.pk])
        return format_html('<a href="{}">{}</a>', url, gettext("since %(when)s") % {"when": chat.since})

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboundMessage]:
        return super().get_queryset(request).select_related("channel")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # rows change through the ledger and the actions below

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # history; old rows are pruned by the daily schedule

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("delivery.change_outboundmessage")  # operators; auditors only read

    @admin.action(description=_("Retry now (one more resend, labelled as recovered)"), permissions=["operate"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[OutboundMessage]) -> None:
        moved = ledger.retry_now(queryset.values_list("pk", flat=True), by=request.user.get_username())
        self.message_user(request, ngettext("%(n)d row will be resent now.", "%(n)d rows will be resent now.", moved)
                          % {"n": moved})

    @admin.action(description=_("Abandon (never send)"), permissions=["operate"])
    def abandon(self, request: HttpRequest, queryset: QuerySet[OutboundMessage]) -> None:
        abandoned = ledger.abandon(queryset.values_list("pk", flat=True), by=request.user.get_username())
        self.message_user(request, ngettext("%(n)d row abandoned.", "%(n)d rows abandoned.", abandoned)
                          % {"n": abandoned})


@admin.register(UnreachableChat)
class UnreachableChatAdmin(TextsHold, ListedLookupsOnly, ModelAdmin):
    list_display = ["chat_id", "channel", "error_cell", "since", "last_failure_at", "failures_shown", "rows"]
    list_filter = ["channel"]
    search_fields = ["chat_id"]
    fields = ["channel", "chat_id", "error_shown", "since", "last_failure_at", "failures", "rows"]
    readonly_fields = fields  # type: ignore[assignment]  # names only (django-stubs: fields may be groups)

    @admin.display(description=_("Error"), ordering="error")
    def error_shown(self, chat: UnreachableChat) -> str:
        return hide_secrets(chat.error)

    @admin.display(description=_("Error"), ordering="error")
    def error_cell(self, chat: UnreachableChat) -> str:
        return admin_texts.cell(hide_secrets(chat.error), change_url(chat))

    @admin.display(description=_("failures"), ordering="failures")
    def failures_shown(self, chat: UnreachableChat) -> str:
        return admin_texts.count(chat.failures)

    @admin.display(description=_("Ledger rows"))
    def rows(self, chat: UnreachableChat) -> str:
        url = reverse("admin:delivery_outboundmessage_changelist") + "?" + urlencode(
            {"channel__id__exact": chat.channel_id, "chat_id": chat.chat_id})
        return format_html('<a href="{}">{}</a>', url, gettext("rows to this chat"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False  # the ledger keeps it; a reply that reaches the chat again clears it


@admin.register(ScheduledMessage)
class ScheduledMessageAdmin(TextsHold, ListedLookupsOnly, ModelAdmin):
    """Messages that go out by themselves (docs/schedules.md). An operator schedules one
    into a conversation here; a worker sends each tick once, through the ledger."""

    list_display = ["id", "conversation_shown", "short_text", "due", "state_shown", "source", "ticks_sent"]
    list_filter = ["state", "source"]
    list_filter_submit = True
    ordering = ["-due_at", "-pk"]  # the furthest ahead first, down to what went out
    raw_id_fields = ["conversation"]
    fieldsets = [
        (None, {"fields": ["conversation", "text", "due_at", "repeat_every", "cancel_on_reply", "state", "source",
                           "reason", "ticks_sent", "last_sent_at", "last_tick", "created_at"]}),
        (_("Outside WhatsApp's 24-hour window"), {
            "fields": ["template_name", "template_language", "template_fill"],
            "description": _("Outside the window a tick goes out as an approved template, filled with the text: "
                             "this one, or (each field left empty) the one the channel's WhatsApp settings name. "
                             "With none it waits until the user writes.")}),
    ]
    readonly_fields = ["state", "source", "reason", "ticks_sent", "last_sent_at", "last_tick", "created_at"]
    actions = ["cancel"]

    @admin.display(description=_("Last tick's delivery"))
    def last_tick(self, schedule: ScheduledMessage) -> str:
        """Its newest tick's ledger row: delivered, waiting, or refused and why (a template
        WhatsApp refused is a permanent failure, its reason on the row). On the change page
        only: the prefix match is no indexed lookup, fine once, not once per listed row."""
        row = (OutboundMessage.objects.filter(dedup_key__startswith=f"schedule:{schedule.pk}:")
               .order_by("-created_at").values("pk", "state", "last_error").first())
        if row is None:
            return "—"
        url = reverse("admin:delivery_outboundmessage_change", args=[row["pk"]])
        error = f": {hide_secrets(row['last_error'])}" if row["state"] != "delivered" and row["last_error"] else ""
        return format_html('<a href="{}">{}</a>{}', url, row["state"], error)

    @admin.display(description=_("conversation"), ordering="conversation")
    def conversation_shown(self, schedule: ScheduledMessage) -> str:
        return admin_texts.name(str(schedule.conversation), 40)

    @admin.display(description=_("text"))
    def short_text(self, schedule: ScheduledMessage) -> str:
        return admin_texts.cell(schedule.text, change_url(schedule), length=60)

    @admin.display(description=_("due"), ordering="due_at")
    def due(self, schedule: ScheduledMessage) -> str:
        return format_html('<span title="{}">{}</span>', schedule.due_at, admin_texts.relative(schedule.due_at))

    @display(description=_("state"), ordering="state", label=admin_texts.tones(ScheduleState, scheduled="info"))
    def state_shown(self, schedule: ScheduledMessage) -> tuple[str, str]:
        return schedule.state, schedule.get_state_display()

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduledMessage]:
        return super().get_queryset(request).select_related("conversation__channel", "conversation__contact")

    def has_change_permission(self, request: HttpRequest, obj: ScheduledMessage | None = None) -> bool:
        # Only a waiting one changes; a sent tick is the ledger's (its row is there).
        return super().has_change_permission(request, obj) and (obj is None or obj.state == ScheduleState.SCHEDULED)

    @admin.action(description=_("Cancel the selected scheduled messages"))
    def cancel(self, request: HttpRequest, queryset: QuerySet[ScheduledMessage]) -> None:
        ids = list(queryset.filter(state=ScheduleState.SCHEDULED).values_list("pk", flat=True))
        cancelled = ScheduledMessage.transition(ids, ScheduleState.SCHEDULED, ScheduleState.CANCELLED,
                                                reason=f"cancelled by {request.user}")
        self.message_user(request, ngettext("%(n)d scheduled message cancelled.", "%(n)d scheduled messages cancelled.",
                                            cancelled) % {"n": cancelled})


def delivery_health_html(channel: Any) -> SafeString:  # conversations' Channel
    """The channel page's delivery summary: last error and unreachable chats."""
    health = ledger.channel_health(channel.pk)
    last = health["last_error"]
    parts = [format_html("<p><b>{}</b> {} <small>({})</small></p>", gettext("Last error:"), hide_secrets(last["last_error"]),
                         last["claimed_at"]) if last else format_html("<p>{}</p>", gettext("No delivery errors."))]
    if health["unreachable"]:
        items = format_html_join("", "<li>{} — {} ({})</li>", ((chat, hide_secrets(error), gettext("since %(when)s") % {
            "when": since}) for chat, error, since in health["unreachable"]))
        url = reverse("admin:delivery_unreachablechat_changelist") + f"?channel__id__exact={channel.pk}"
        parts.append(format_html('<p><b><a href="{}">{}</a>:</b></p><ul>{}</ul>', url, gettext("Unreachable chats"), items))
    rows = reverse("admin:delivery_outboundmessage_changelist") + f"?channel__id__exact={channel.pk}"
    open_rows = OutboundMessage.objects.filter(channel=channel, state__in=OutboundMessage.OPEN).count()
    parts.append(format_html('<p><a href="{}">{}</a> ({})</p>', rows, gettext("Ledger rows of this channel"),
                             gettext("%(n)s open") % {"n": open_rows}))
    return format_html("".join(["{}"] * len(parts)), *parts)


