from urllib.parse import urlencode

from django.contrib import admin, messages
from django.db.models import OuterRef, Subquery
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from unfold.admin import ModelAdmin, TabularInline
from unfold.decorators import display

from agentloop.core import admin_texts
from agentloop.core.admin_texts import TextsHold
from agentloop.core.big_tables import BigTableAdmin, numeric_id, per_channel
from conversations import admin_channels, admin_keys, erasure  # noqa: F401 -- they register ChannelAdmin, AgentKeyAdmin
from conversations.admin_people import HoldActions, LimitActions, LimitedFilter
from conversations.media import links
from conversations.models import (
    Contact,
    ContextNote,
    Conversation,
    ConversationState,
    InboundMessage,
    MediaFile,
    MediaState,
    MessageBuffer,
    Turn,
    TurnState,
    WorkerHeartbeat,
)


def link(obj, label=None):
    if obj is None:
        return "—"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or obj)


def changelist_link(url_name, label, **query):
    return format_html('<a href="{}?{}">{}</a>', reverse(f"admin:{url_name}_changelist"), urlencode(query), label)


def change_url(obj):
    return reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])


# A turn's state as a label: a failed one stands out, a running one is told apart.
TURN_TONES = admin_texts.tones(TurnState, failed="danger", running="info", ready="info")


class ReadOnlyAdmin:
    """A page the operator reads and cannot change (the worker, the ingest or the ledger
    writes these rows): no Save button offered on it."""

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Contact)
class ContactAdmin(TextsHold, LimitActions, ModelAdmin):
    list_display = ["name_shown", "platform_id", "username", "language", "channel", "limited", "created_at"]
    list_filter = ["channel", "language", LimitedFilter]
    search_fields = ["platform_id", "display_name", "username"]
    actions = ["forget", "lift_limits"]

    @admin.display(description=_("contact"), ordering="display_name")
    def name_shown(self, obj):
        return admin_texts.name(str(obj))  # a name with no space wraps rather than widen the list

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if "language" in form.changed_data:  # what texts are written in reads the conversations' copy
            Conversation.objects.filter(contact=obj).update(language=obj.language)

    @admin.action(description=_("Erase these people's data (texts, files, names, ids)"), permissions=["delete"])
    def forget(self, request, queryset):
        for contact in queryset.select_related("channel"):
            try:
                erasure.forget(contact.channel.slug, contact.platform_id, by=f"admin:{request.user.get_username()}")
            except erasure.Busy as exc:
                self.message_user(request, gettext("contact %(id)s: %(problem)s") % {"id": contact.pk, "problem": exc},
                                  messages.WARNING)
            else:
                self.message_user(request, gettext("contact %(id)s: erased") % {"id": contact.pk})


class TurnInline(TextsHold, TabularInline):
    model = Turn
    fields = ["state", "flush_reason", "input_shown", "reply_shown", "created_at", "finished_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ["-pk"]

    def has_add_permission(self, request, obj=None):
        return False

    # A message may be 10,000 characters: its start here, the whole a click away.
    @admin.display(description=_("merged input"))
    def input_shown(self, obj):
        return admin_texts.toggle(obj.merged_input)

    @admin.display(description=_("reply text"))
    def reply_shown(self, obj):
        return admin_texts.toggle(obj.reply_text)


@admin.register(Conversation)
class ConversationAdmin(TextsHold, BigTableAdmin, HoldActions, ModelAdmin):
    list_display = ["__str__", "channel", "chat_id", "is_group", "state_shown", "last_turn_state", "created_at"]
    list_filter = ["channel", "is_group", "state"]
    list_filter_submit = True
    search_fields = ["chat_id", "sender_id", "contact__display_name", "contact__username"]
    readonly_fields = ["channel", "contact", "chat_id", "sender_id", "is_group", "state", "held_by", "held_at",
                       "person_active_at", "created_at", "related"]
    inlines = [TurnInline]
    actions = ["forget", "take_over", "give_back"]

    def get_queryset(self, request):
        # The last turn's state in the page's one query, not one query per row.
        last = Turn.objects.filter(conversation=OuterRef("pk")).order_by("-pk").values("state")[:1]
        return super().get_queryset(request).select_related("channel", "contact").annotate(last_turn=Subquery(last))

    @admin.action(description=_("Erase the data of these conversations' people"), permissions=["delete"])
    def forget(self, request, queryset):
        contacts = Contact.objects.filter(pk__in=queryset.values("contact_id"))
        ContactAdmin.forget(self, request, contacts)

    @display(description=_("state"), ordering="state", label=admin_texts.tones(ConversationState, person="info"))
    def state_shown(self, obj):
        return obj.state, obj.get_state_display()

    @display(description=_("last turn"), label=TURN_TONES)
    def last_turn_state(self, obj):
        state = getattr(obj, "last_turn", None)
        return (state, Turn(state=state).get_state_display()) if state else "—"

    @admin.display(description=_("Related"))
    def related(self, obj):
        if not obj.pk:
            return "—"
        links = [
            format_html('<a href="{}">{}</a>', reverse("console-story", args=[obj.pk]),
                        gettext("the whole story, in time order")),
            changelist_link("conversations_inboundmessage", gettext("messages"), conversation__id__exact=obj.pk),
            changelist_link("delivery_outboundmessage", gettext("ledger rows"), conversation__id__exact=obj.pk),
            changelist_link("tools_actionclaim", gettext("action claims"), conversation_id=obj.pk),
            changelist_link("audit_auditevent", gettext("audit events"), conversation_id=obj.pk),
            changelist_link("conversations_contextnote", gettext("notes for the agent"), conversation__id__exact=obj.pk),
        ]
        return format_html_join(" · ", "{}", ((item,) for item in links))


@admin.register(InboundMessage)
class InboundMessageAdmin(TextsHold, ReadOnlyAdmin, BigTableAdmin, ModelAdmin):
    list_display = ["platform_message_id", "channel", "kind", "disposition", "short_text", "buffer_link",
                    "received_at"]
    list_filter = ["channel", "kind", "disposition"]
    list_filter_submit = True
    search_fields = ["platform_message_id", "text", "sender_name"]
    date_hierarchy = "received_at"
    # Newest first along the date's index (a day of the drill-down is a range of it), and
    # each row's channel and buffer in the page's query.
    ordering = ["-received_at", "-pk"]
    list_select_related = ["channel", "buffer"]
    readonly_fields = [f.name for f in InboundMessage._meta.fields]

    def exact_matches(self, term):
        return per_channel(InboundMessage, platform_message_id=term)

    @admin.display(description=_("text"))
    def short_text(self, obj):
        return admin_texts.cell(obj.text, change_url(obj))

    @admin.display(description=_("buffer"))
    def buffer_link(self, obj):
        return link(obj.buffer, gettext("buffer %(id)s") % {"id": obj.buffer_id}) if obj.buffer_id else "—"

    def has_add_permission(self, request):
        return False


@admin.register(MediaFile)
class MediaFileAdmin(ModelAdmin):
    """Files users sent: what each is, whether it was fetched, and why not (read only:
    the worker owns their state)."""

    list_display = ["pk", "thumbnail", "kind", "state", "channel", "file_name", "content_type", "size", "created_at"]
    list_filter = ["state", "kind", "channel"]
    search_fields = ["file_name", "file_key"]
    date_hierarchy = "created_at"
    readonly_fields = ["preview", *[f.name for f in MediaFile._meta.fields]]

    @admin.display(description="")
    def thumbnail(self, obj):
        return self._image(obj, 48) if self._shown(obj) else "—"

    @admin.display(description=_("file"))
    def preview(self, obj):
        if not self._shown(obj):
            return "—" if obj.state != MediaState.STORED else format_html(
                '<a href="{}">{}</a>', links.path_for(obj.pk), gettext("open (%(type)s)") % {"type": obj.content_type})
        return format_html('{}<br><a href="{}">{}</a>', self._image(obj, 160), links.path_for(obj.pk),
                           gettext("open the whole image"))

    @staticmethod
    def _shown(obj):
        return obj.state == MediaState.STORED and obj.content_type.startswith("image/")

    @staticmethod
    def _image(obj, height):
        # A signed link (conversations.media.links) to a small JPEG: this page is staff-only,
        # and the link lapses like an agent's.
        return format_html('<img src="{}?thumbnail=1" alt="{}" style="max-height:{}px">',
                           links.path_for(obj.pk), obj.file_name or obj.kind, height)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(MessageBuffer)
class MessageBufferAdmin(TextsHold, ReadOnlyAdmin, ModelAdmin):
    # The window's kind and length are on the buffer's page.
    list_display = ["pk", "conversation_shown", "state", "message_count", "flush_at", "seconds_left_display",
                    "flush_reason"]
    list_select_related = ["conversation__channel", "conversation__contact"]
    list_filter = ["state", "flush_reason", "window_kind", "conversation__channel"]
    readonly_fields = [f.name for f in MessageBuffer._meta.fields] + ["turn_link"]

    @admin.display(description=_("conversation"))
    def conversation_shown(self, obj):
        return admin_texts.name(str(obj.conversation), 40)

    @admin.display(description=_("seconds left"))
    def seconds_left_display(self, obj):
        left = obj.seconds_left(timezone.now())
        return "—" if left is None else f"{left:.1f}"

    @admin.display(description=_("turn"))
    def turn_link(self, obj):
        return link(getattr(obj, "turn", None))

    def has_add_permission(self, request):
        return False


@admin.register(Turn)
class TurnAdmin(TextsHold, ReadOnlyAdmin, BigTableAdmin, ModelAdmin):
    # What an operator scans: which conversation, how it went, what came in and went out;
    # the flush reason, the effect, the timings and the rest are on the turn's page.
    list_display = ["pk", "conversation_shown", "state_shown", "short_input", "short_reply", "created_at"]
    list_filter = ["state", "flush_reason", "fired_effect", "conversation__channel"]
    list_filter_submit = True
    search_fields = ["merged_input", "reply_text"]
    date_hierarchy = "created_at"
    ordering = ["-created_at", "-pk"]  # along turn_created_idx, as the drill-down's days
    list_select_related = ["conversation__channel", "conversation__contact"]
    readonly_fields = [f.name for f in Turn._meta.fields] + ["ledger_rows"]

    def exact_matches(self, term):
        return numeric_id(term)  # "turn 12", as the audit log and the story name it

    @admin.display(description=_("Replies"))
    def ledger_rows(self, obj):
        return changelist_link("delivery_outboundmessage", gettext("ledger rows of this turn"), turn__id__exact=obj.pk)

    @display(description=_("state"), ordering="state", label=TURN_TONES)
    def state_shown(self, obj):
        return obj.state, obj.get_state_display()

    @admin.display(description=_("conversation"))
    def conversation_shown(self, obj):
        return admin_texts.name(str(obj.conversation), 40)

    @admin.display(description=_("merged input"))
    def short_input(self, obj):
        return admin_texts.cell(obj.merged_input, change_url(obj), length=60)

    @admin.display(description=_("reply text"))
    def short_reply(self, obj):
        return admin_texts.cell(obj.reply_text, change_url(obj), length=60)

    def has_add_permission(self, request):
        return False


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(ReadOnlyAdmin, ModelAdmin):
    list_display = ["owner", "hostname", "pid", "started_at", "seen_at"]
    readonly_fields = ["owner", "hostname", "pid", "started_at", "seen_at"]


@admin.register(ContextNote)
class ContextNoteAdmin(TextsHold, ModelAdmin):
    """What the agent is told besides the chat (e.g. a person's decision on a proposal)."""

    list_display = ["pk", "conversation", "short_text", "created_at"]
    list_filter = ["conversation__channel"]
    search_fields = ["text"]
    date_hierarchy = "created_at"
    readonly_fields = ["conversation", "text", "created_at"]

    @admin.display(description=_("text"))
    def short_text(self, obj):
        return admin_texts.cell(obj.text, change_url(obj))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
