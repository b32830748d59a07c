from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, Subquery
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from agentloop.core.big_tables import BigTableAdmin, numeric_id, per_channel
from agentloop.core.redaction import SECRET_NAME
from conversations import admin_keys, erasure, platforms  # noqa: F401 -- admin_keys registers AgentKeyAdmin
from conversations.admin_people import HoldActions, LimitActions, LimitedFilter
from conversations.admin_routing import RoutingRulesInAdmin
from conversations.media import links
from conversations.models import (
    Channel,
    Contact,
    ContextNote,
    Conversation,
    InboundMessage,
    MediaFile,
    MediaState,
    MessageBuffer,
    Turn,
    WorkerHeartbeat,
)
from delivery.admin import delivery_health_html


def link(obj, label=None):
    if obj is None:
        return "—"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or obj)


def changelist_link(url_name, label, **query):
    return format_html('<a href="{}?{}">{}</a>', reverse(f"admin:{url_name}_changelist"), urlencode(query), label)


class SecretField(forms.CharField):
    """Shown as a password input that never renders the stored value; left blank, it keeps it."""

    def has_changed(self, initial, data):
        return bool(data) and data != initial


def _label(name) -> str:
    return name.replace("_", " ").capitalize()


def _setting_field(spec) -> forms.Field:
    """A form field for one platform Setting (conversations.platforms.base.Setting)."""
    options = {"required": False, "label": None, "help_text": spec.help}
    if spec.secret:
        return SecretField(widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
                           **options)
    if spec.choices:
        return forms.ChoiceField(choices=[("", "—")] + [(c, c) for c in spec.choices], **options)
    if isinstance(spec.default, bool):
        return forms.BooleanField(**options)
    if spec.default not in ("", None):
        options["help_text"] = f"{spec.help} Default: {spec.default}".strip()
    return forms.CharField(**options)


def setting_fields() -> dict:
    """Every registered platform's settings as form fields named "<kind>_<name>", and a
    "forget_<kind>_<name>" box beside each secret."""
    fields = {}
    for platform in platforms.all_platforms():
        for name, spec in platform.settings.items():
            field = fields[f"{platform.kind}_{name}"] = _setting_field(spec)
            field.label = _label(name)
            if spec.secret:
                fields[f"forget_{platform.kind}_{name}"] = forms.BooleanField(
                    required=False, label=f"Forget the {_label(name).lower()}")
    return fields


def platform_fieldsets() -> list:
    """One fieldset per platform: its settings, each secret with its forget box."""
    sets = []
    for platform in platforms.all_platforms():
        rows = [(f"{platform.kind}_{name}", f"forget_{platform.kind}_{name}") if spec.secret
                else f"{platform.kind}_{name}" for name, spec in platform.settings.items()]
        if rows:
            sets.append((f"{platform.label} settings", {"fields": rows, "classes": ["collapse"],
                                                         "description": f"Used when the kind is {platform.label}."}))
    return sets


# An agent_config secret (`secret`, a key named like one) is shown as this; posted back
# unchanged, the stored value is kept.
KEPT_SECRET = "•••••• stored (leave as is to keep it)"


def _is_agent_secret(name, value) -> bool:
    # `api_key_env` names a variable; the key itself is read from the environment.
    return isinstance(value, str) and bool(value) and bool(SECRET_NAME.search(name)) and not name.endswith("_env")


class ChannelFormBase(forms.ModelForm):
    """The channel's own fields, and its platform's settings as fields of their own
    (stored in Channel.platform_settings, checked by the platform on save)."""

    class Meta:
        model = Channel
        fields = []  # the admin adds the rest (from its fieldsets)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.instance.platform_settings or {}
        platform = platforms.get(self.instance.kind) if self.instance.kind in dict(platforms.choices()) else None
        for name, spec in (platform.settings.items() if platform else ()):
            key = f"{platform.kind}_{name}"
            if key not in self.fields:
                continue
            if spec.secret:
                if stored.get(name):
                    self.fields[key].widget.attrs["placeholder"] = "•••••• stored — leave blank to keep"
            elif stored.get(name) not in (None, ""):
                self.initial[key] = stored[name]
        config = self.instance.agent_config
        if isinstance(config, dict) and any(_is_agent_secret(k, v) for k, v in config.items()):
            self.initial["agent_config"] = {k: KEPT_SECRET if _is_agent_secret(k, v) else v for k, v in config.items()}

    def clean_agent_config(self):
        value = self.cleaned_data.get("agent_config")
        stored = self.instance.agent_config if isinstance(self.instance.agent_config, dict) else {}
        if not isinstance(value, dict):
            return value
        for name, given in value.items():
            if given == KEPT_SECRET:
                if name not in stored:
                    raise ValidationError(f"{name}: no stored value to keep; enter one")
                value[name] = stored[name]
        return value

    def clean(self):
        cleaned = super().clean()
        kind = cleaned.get("kind") or self.instance.kind
        try:
            platform = platforms.get(kind)
        except LookupError:
            return cleaned  # the kind field reports it
        # The stored values count only while the kind stays the same.
        stored = (self.instance.platform_settings or {}) if kind == self.instance.kind else {}
        values, given = {}, set()
        for name, spec in platform.settings.items():
            value = cleaned.get(f"{kind}_{name}")
            if spec.secret:
                given |= {name} if value else set()
                value = "" if cleaned.get(f"forget_{kind}_{name}") else (value or stored.get(name, ""))
            if value not in (None, ""):
                values[name] = value
        for name in platform.secrets_to_give_again(stored, values, given):
            self.add_error(f"{kind}_{name}", f"The address it is sent to changed: enter the {_label(name).lower()} "
                                             f"again (the stored one is never sent to a new host), or forget it.")
        # Checked by the model's clean (the platform's clean_settings), its messages
        # naming each setting.
        self.instance.platform_settings = values
        return cleaned


ChannelForm = type("ChannelForm", (ChannelFormBase,), setting_fields())


@admin.register(Channel)
class ChannelAdmin(RoutingRulesInAdmin, admin.ModelAdmin):
    form = ChannelForm
    list_display = ["slug", "name", "kind", "is_active", "send_blocked", "double_texting", "window_summary", "agent"]
    list_filter = ["kind", "is_active", "double_texting"]
    search_fields = ["slug", "name"]
    readonly_fields = ["poll_offset", "poll_owner", "poll_lease_until", "send_blocked", "created_at", "updated_at",
                       "delivery_health"]
    fieldsets = [
        (None, {"fields": ["slug", "name", "kind", "is_active", "language"]}),
        ("Debounce", {"fields": [("window_closed", "window_greeting", "window_open", "window_neutral"),
                                 "greeting_words", "conjunction_words", ("max_wait", "max_messages"),
                                 ("window_media", "window_album", "media_at_once")],
                      "description": "Seconds to wait after a message, by how the last message ends. "
                                     "Each new message re-arms the window."}),
        ("Double texting, typing, edits and streaming", {"fields": ["double_texting", "typing_mode",
                                                                  "status_reaction", "edits", "streaming"]}),
        ("Groups", {"fields": ["group_replies"]}),
        ("Bots and loops", {"fields": ["allowed_bots", ("loop_max_replies", "loop_window_seconds")],
                            "description": "docs/routing.md#bots"}),
        ("People in control", {"fields": ["handoff_idle_minutes", "turns_per_contact_per_hour",
                                          "tokens_per_contact_per_day"]}),
        ("Agent", {"fields": ["agent", "agent_config"]}),
        *platform_fieldsets(),
        ("Polling", {"fields": ["poll_offset", "poll_owner", "poll_lease_until"], "classes": ["collapse"]}),
        ("Delivery", {"fields": ["send_blocked", "delivery_health", "recovery_freshness", "stale_recoveries", "time_zone"],
                      "description": "docs/ledger.md#the-rules: how long a reply may still go out, and a recovered "
                                     "reply the conversation has moved past."}),
        ("History", {"fields": ["created_at", "updated_at"], "classes": ["collapse"]}),
    ]

    @admin.display(description="Delivery health")
    def delivery_health(self, obj):
        return delivery_health_html(obj) if obj.pk else "—"

    @admin.display(description="windows (closed/greeting/open/neutral)")
    def window_summary(self, obj):
        return f"{obj.window_closed}/{obj.window_greeting}/{obj.window_open}/{obj.window_neutral} s"


@admin.register(Contact)
class ContactAdmin(LimitActions, admin.ModelAdmin):
    list_display = ["__str__", "platform_id", "username", "language", "channel", "limited", "created_at"]
    list_filter = ["channel", "language", LimitedFilter]
    search_fields = ["platform_id", "display_name", "username"]
    actions = ["forget", "lift_limits"]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if "language" in form.changed_data:  # what texts are written in reads the conversations' copy
            Conversation.objects.filter(contact=obj).update(language=obj.language)

    @admin.action(description="Erase these people's data (texts, files, names, ids)", permissions=["delete"])
    def forget(self, request, queryset):
        for contact in queryset.select_related("channel"):
            try:
                erasure.forget(contact.channel.slug, contact.platform_id, by=f"admin:{request.user.get_username()}")
            except erasure.Busy as exc:
                self.message_user(request, f"contact {contact.pk}: {exc}", messages.WARNING)
            else:
                self.message_user(request, f"contact {contact.pk}: erased")


class TurnInline(admin.TabularInline):
    model = Turn
    fields = ["state", "flush_reason", "merged_input", "fired_effect", "created_at", "finished_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True
    ordering = ["-pk"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Conversation)
class ConversationAdmin(BigTableAdmin, HoldActions, admin.ModelAdmin):
    list_display = ["__str__", "channel", "chat_id", "is_group", "state", "last_turn_state", "created_at"]
    list_filter = ["channel", "is_group", "state"]
    search_fields = ["chat_id", "sender_id", "contact__display_name", "contact__username"]
    readonly_fields = ["channel", "contact", "chat_id", "sender_id", "is_group", "state", "held_by", "held_at",
                       "person_active_at", "created_at", "related"]
    inlines = [TurnInline]
    actions = ["forget", "take_over", "give_back"]

    def get_queryset(self, request):
        # The last turn's state in the page's one query, not one query per row.
        last = Turn.objects.filter(conversation=OuterRef("pk")).order_by("-pk").values("state")[:1]
        return super().get_queryset(request).select_related("channel", "contact").annotate(last_turn=Subquery(last))

    @admin.action(description="Erase the data of these conversations' people", permissions=["delete"])
    def forget(self, request, queryset):
        contacts = Contact.objects.filter(pk__in=queryset.values("contact_id"))
        ContactAdmin.forget(self, request, contacts)

    @admin.display(description="last turn")
    def last_turn_state(self, obj):
        return getattr(obj, "last_turn", None) or "—"

    @admin.display(description="Related")
    def related(self, obj):
        if not obj.pk:
            return "—"
        links = [
            format_html('<a href="{}">the whole story, in time order</a>', reverse("console-story", args=[obj.pk])),
            changelist_link("conversations_inboundmessage", "messages", conversation__id__exact=obj.pk),
            changelist_link("delivery_outboundmessage", "ledger rows", conversation__id__exact=obj.pk),
            changelist_link("tools_actionclaim", "action claims", conversation_id=obj.pk),
            changelist_link("audit_auditevent", "audit events", conversation_id=obj.pk),
            changelist_link("conversations_contextnote", "notes for the agent", conversation__id__exact=obj.pk),
        ]
        return format_html_join(" · ", "{}", ((item,) for item in links))


@admin.register(InboundMessage)
class InboundMessageAdmin(BigTableAdmin, admin.ModelAdmin):
    list_display = ["platform_message_id", "channel", "kind", "disposition", "short_text", "buffer_link",
                    "received_at"]
    list_filter = ["channel", "kind", "disposition"]
    search_fields = ["platform_message_id", "text", "sender_name"]
    date_hierarchy = "received_at"
    # Newest first along the date's index (a day of the drill-down is a range of it), and
    # each row's channel and buffer in the page's query.
    ordering = ["-received_at", "-pk"]
    list_select_related = ["channel", "buffer"]
    readonly_fields = [f.name for f in InboundMessage._meta.fields]

    def exact_matches(self, term):
        return per_channel(InboundMessage, platform_message_id=term)

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text[:60]

    @admin.display(description="buffer")
    def buffer_link(self, obj):
        return link(obj.buffer, f"buffer {obj.buffer_id}") if obj.buffer_id else "—"

    def has_add_permission(self, request):
        return False


@admin.register(MediaFile)
class MediaFileAdmin(admin.ModelAdmin):
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

    @admin.display(description="file")
    def preview(self, obj):
        if not self._shown(obj):
            return "—" if obj.state != MediaState.STORED else format_html(
                '<a href="{}">open ({})</a>', links.path_for(obj.pk), obj.content_type)
        return format_html('{}<br><a href="{}">open the whole image</a>', self._image(obj, 160),
                           links.path_for(obj.pk))

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
class MessageBufferAdmin(admin.ModelAdmin):
    list_display = ["pk", "conversation", "state", "message_count", "window_kind", "window_seconds",
                    "flush_at", "seconds_left_display", "flush_reason"]
    list_filter = ["state", "flush_reason", "window_kind", "conversation__channel"]
    readonly_fields = [f.name for f in MessageBuffer._meta.fields] + ["turn_link"]

    @admin.display(description="seconds left")
    def seconds_left_display(self, obj):
        left = obj.seconds_left(timezone.now())
        return "—" if left is None else f"{left:.1f}"

    @admin.display(description="turn")
    def turn_link(self, obj):
        return link(getattr(obj, "turn", None))

    def has_add_permission(self, request):
        return False


@admin.register(Turn)
class TurnAdmin(BigTableAdmin, admin.ModelAdmin):
    list_display = ["pk", "conversation", "state", "flush_reason", "short_input", "fired_effect", "created_at",
                    "finished_at"]
    list_filter = ["state", "flush_reason", "fired_effect", "conversation__channel"]
    search_fields = ["merged_input", "reply_text"]
    date_hierarchy = "created_at"
    ordering = ["-created_at", "-pk"]  # along turn_created_idx, as the drill-down's days
    list_select_related = ["conversation__channel", "conversation__contact"]
    readonly_fields = [f.name for f in Turn._meta.fields] + ["ledger_rows"]

    def exact_matches(self, term):
        return numeric_id(term)  # "turn 12", as the audit log and the story name it

    @admin.display(description="Replies")
    def ledger_rows(self, obj):
        return changelist_link("delivery_outboundmessage", "ledger rows of this turn", turn__id__exact=obj.pk)

    @admin.display(description="merged input")
    def short_input(self, obj):
        return obj.merged_input[:80]

    def has_add_permission(self, request):
        return False


@admin.register(WorkerHeartbeat)
class WorkerHeartbeatAdmin(admin.ModelAdmin):
    list_display = ["owner", "hostname", "pid", "started_at", "seen_at"]
    readonly_fields = ["owner", "hostname", "pid", "started_at", "seen_at"]


@admin.register(ContextNote)
class ContextNoteAdmin(admin.ModelAdmin):
    """What the agent is told besides the chat (e.g. a person's decision on a proposal)."""

    list_display = ["pk", "conversation", "short_text", "created_at"]
    list_filter = ["conversation__channel"]
    search_fields = ["text"]
    date_hierarchy = "created_at"
    readonly_fields = ["conversation", "text", "created_at"]

    @admin.display(description="text")
    def short_text(self, obj):
        return obj.text[:80]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
