"""The channel form by platform (issue 53): the page shows the chosen platform's section
only, the agent is chosen among the registered ones, and a configuration that cannot work
is refused with its reason beside the field. The rules live where they belong — a
platform's required settings (Platform.missing_to_run), the windows' bounds
(conversations.windows.problems), the agent registry (Channel.unworkable) — so a new
platform or agent gets them without a change here."""

from django import forms
from django.conf import settings
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.utils.functional import lazy
from django.utils.text import format_lazy
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from unfold.admin import ModelAdmin
from unfold.decorators import display
from unfold.widgets import (
    UnfoldAdminPasswordWidget,
    UnfoldAdminSelectWidget,
    UnfoldAdminTextInputWidget,
    UnfoldBooleanSwitchWidget,
    UnfoldBooleanWidget,
)

from agentloop.core import admin_texts
from agentloop.core.redaction import SECRET_NAME
from conversations import platforms
from conversations.admin_routing import RoutingRulesInAdmin
from conversations.models import Channel
from delivery.admin import delivery_health_html

# Sections an operator rarely changes once the channel works start collapsed (a section
# with an error is opened by static/channels/channel_form.js).
COLLAPSED = ["collapse"]


class SecretField(forms.CharField):
    """Shown as a password input that never renders the stored value; left blank, it keeps it."""

    def has_changed(self, initial, data):
        return bool(data) and data != initial


def _label(name, spec=None):
    """A setting's label: its own (marked for translation), else its name capitalised."""
    return spec.label if spec is not None and spec.label else name.replace("_", " ").capitalize()


def _setting_in_a_sentence(name, spec) -> str:
    return str(_label(name, spec)).lower()


def _forget(name, spec) -> str:
    return gettext("Forget the %(setting)s") % {"setting": _setting_in_a_sentence(name, spec)}


# The form's fields are made once, at import: their texts stay lazy, read in each request's language.
_forget_label = lazy(_forget, str)


def _setting_field(spec) -> forms.Field:
    """A form field for one platform Setting (conversations.platforms.base.Setting)."""
    options = {"required": False, "label": None, "help_text": spec.help}
    if spec.secret:
        return SecretField(widget=UnfoldAdminPasswordWidget(render_value=False, attrs={"autocomplete": "new-password"}),
                           **options)
    if spec.choices:
        return forms.ChoiceField(choices=[("", "—")] + [(c, c) for c in spec.choices], widget=UnfoldAdminSelectWidget,
                                 **options)
    if isinstance(spec.default, bool):
        return forms.BooleanField(widget=UnfoldBooleanSwitchWidget, **options)
    if spec.default not in ("", None):
        options["help_text"] = format_lazy(_("{help} Default: {default}"), help=spec.help, default=spec.default)
    return forms.CharField(widget=UnfoldAdminTextInputWidget, **options)


def setting_fields() -> dict:
    """Every registered platform's settings as form fields named "<kind>_<name>", and a
    "forget_<kind>_<name>" box beside each secret."""
    fields = {}
    for platform in platforms.all_platforms():
        for name, spec in platform.settings.items():
            field = fields[f"{platform.kind}_{name}"] = _setting_field(spec)
            field.label = _label(name, spec)
            if spec.secret:
                fields[f"forget_{platform.kind}_{name}"] = forms.BooleanField(
                    required=False, label=_forget_label(name, spec), widget=UnfoldBooleanWidget)
    return fields


def _rarely_changed(spec) -> bool:
    # A setting with a default (an API root, a pace, a version) works untouched; the ones
    # without (a token, a secret, an id) are what an operator comes to the section for.
    return not spec.secret and not spec.required_to_send and spec.default not in ("", None, ())


def platform_fieldsets(kinds) -> list:
    """Per platform of `kinds`: a section of the settings an operator gives (each secret
    with its forget box), and a collapsed one of those that work with their default.
    Marked with its kind ("platform-telegram"): on the add page, where every platform's is
    rendered, static/channels/channel_form.js shows the chosen kind's only."""
    sets = []
    for kind in kinds:
        platform = platforms.get(kind)
        given, defaulted = [], []
        for name, spec in platform.settings.items():
            (defaulted if _rarely_changed(spec) else given).append(
                (f"{kind}_{name}", f"forget_{kind}_{name}") if spec.secret else f"{kind}_{name}")
        marks = ["platform-section", f"platform-{kind}"]
        if given:
            sets.append((_("%(platform)s settings") % {"platform": platform.label}, {"fields": given, "classes": marks}))
        if defaulted:
            sets.append((_("%(platform)s: settings that work with their default") % {"platform": platform.label},
                         {"fields": defaulted, "classes": [*marks, *COLLAPSED]}))
    return sets


# An agent_config secret (`secret`, a key named like one) is shown as this; posted back
# unchanged, the stored value is kept.
KEPT_SECRET = "•••••• stored (leave as is to keep it)"


def _is_agent_secret(name, value) -> bool:
    # `api_key_env` names a variable; the key itself is read from the environment.
    return isinstance(value, str) and bool(value) and bool(SECRET_NAME.search(name)) and not name.endswith("_env")


def _registered_agents() -> list[tuple[str, str]]:
    return [(name, name) for name in sorted(settings.AGENTLOOP_AGENTS)]


class AgentChoiceField(forms.ChoiceField):
    """The registered agents (settings.AGENTLOOP_AGENTS) as a select. Whether a value is
    registered is the model's rule (Channel.unworkable), which says why: not refused twice."""

    def valid_value(self, value):
        return True


class ChannelFormBase(forms.ModelForm):
    """The channel's own fields, and its platform's settings as fields of their own
    (stored in Channel.platform_settings, checked by the platform on save)."""

    agent = AgentChoiceField(choices=_registered_agents, initial=Channel._meta.get_field("agent").default,
                             widget=UnfoldAdminSelectWidget, label=_("Agent"), help_text=_(
        "What answers this channel's messages: one of the agents registered in AGENTLOOP_AGENTS."))

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
                    self.fields[key].widget.attrs["placeholder"] = gettext("•••••• stored — leave blank to keep")
            elif stored.get(name) not in (None, ""):
                self.initial[key] = stored[name]
        config = self.instance.agent_config
        if isinstance(config, dict) and any(_is_agent_secret(k, v) for k, v in config.items()):
            self.initial["agent_config"] = {k: KEPT_SECRET if _is_agent_secret(k, v) else v for k, v in config.items()}
        agent = self.instance.agent
        if agent and agent not in settings.AGENTLOOP_AGENTS:  # shown as it is, and refused on save
            self.fields["agent"].choices = [*_registered_agents(), (agent, gettext("%(name)s (not registered)")
                                                                      % {"name": agent})]

    def clean_agent_config(self):
        value = self.cleaned_data.get("agent_config")
        stored = self.instance.agent_config if isinstance(self.instance.agent_config, dict) else {}
        if not isinstance(value, dict):
            return value
        for name, given in value.items():
            if given == KEPT_SECRET:
                if name not in stored:
                    raise ValidationError(gettext("%(name)s: no stored value to keep; enter one") % {"name": name})
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
            self.add_error(f"{kind}_{name}", gettext(
                "The address it is sent to changed: enter the %(setting)s again (the stored one is never sent to a "
                "new host), or forget it.") % {"setting": _setting_in_a_sentence(name, platform.settings[name])})
        if cleaned.get("is_active", self.instance.is_active):
            for name in platform.missing_to_run(values):
                self.add_error(f"{kind}_{name}", gettext(
                    "An active %(platform)s channel needs its %(setting)s: enter it, or untick Active until you "
                    "have it.") % {"platform": platform.label, "setting": _setting_in_a_sentence(name, platform.settings[name])})
        # Checked by the model's clean (the platform's clean_settings), its messages
        # naming each setting.
        self.instance.platform_settings = values
        return cleaned


ChannelForm = type("ChannelForm", (ChannelFormBase,), setting_fields())

# The channels list's status label (its colour by key).
STATUS_ANSWERING, STATUS_BLOCKED, STATUS_OFF = "answering", "blocked", "off"


@admin.register(Channel)
class ChannelAdmin(RoutingRulesInAdmin, ModelAdmin):
    form = ChannelForm
    # What an operator scans: which channel, on what, answering or not, by which agent, how
    # long it waits (the rest — double texting, the platform's settings — on its page).
    list_display = ["slug", "name_cell", "kind", "status", "agent", "window_summary"]
    list_filter = ["kind", "is_active", "double_texting"]
    search_fields = ["slug", "name"]
    readonly_fields = ["poll_offset", "poll_owner", "poll_lease_until", "send_blocked", "created_at", "updated_at",
                       "delivery_health"]

    class Media:
        js = ["channels/channel_form.js"]

    def get_readonly_fields(self, request, obj=None):
        # A channel's kind is what its conversations, contacts and webhook URL were made by:
        # a saved channel keeps it (another platform is another channel).
        return [*super().get_readonly_fields(request, obj), *(["kind"] if obj else [])]

    def get_fieldsets(self, request, obj=None):
        # The page of a saved channel shows its own platform's section only; the add page
        # renders each platform's, and the kind chosen there decides which one is read.
        kinds = [obj.kind] if obj and obj.kind in dict(platforms.choices()) else [] if obj else \
            [kind for kind, _label in platforms.choices()]
        polled = bool(kinds) and obj is not None and platforms.get(obj.kind).connection() is not None
        return [
            (None, {"fields": ["slug", "name", "kind", "is_active", "language"]}),
            (_("Agent"), {"fields": ["agent", "agent_config"]}),
            *platform_fieldsets(kinds),
            (_("Debounce"), {"fields": [("window_closed", "window_greeting", "window_open", "window_neutral"),
                                        "greeting_words", "conjunction_words", ("max_wait", "max_messages"),
                                        ("window_media", "window_album", "media_at_once")],
                             "classes": COLLAPSED,
                             "description": _("Seconds to wait after a message, by how the last message ends. "
                                              "Each new message re-arms the window.")}),
            (_("Double texting, typing, edits and streaming"), {
                "fields": ["double_texting", "typing_mode", "status_reaction", "edits", "streaming"],
                "classes": COLLAPSED}),
            (_("Groups"), {"fields": ["group_replies"], "classes": COLLAPSED}),
            (_("Bots and loops"), {"fields": ["allowed_bots", ("loop_max_replies", "loop_window_seconds")],
                                   "classes": COLLAPSED, "description": "docs/routing.md#bots"}),
            (_("People in control"), {"fields": ["handoff_idle_minutes", "turns_per_contact_per_hour",
                                                 "tokens_per_contact_per_day"], "classes": COLLAPSED}),
            *([(_("Polling"), {"fields": ["poll_offset", "poll_owner", "poll_lease_until"], "classes": COLLAPSED})]
              if polled else []),
            (_("Delivery"), {"fields": ["send_blocked", "delivery_health", "recovery_freshness", "stale_recoveries",
                                        "time_zone"],
                            # Open while replies wait: why is the first thing to read.
                            "classes": [] if obj and obj.send_blocked else COLLAPSED,
                             "description": _("docs/ledger.md#the-rules: how long a reply may still go out, and a "
                                              "recovered reply the conversation has moved past.")}),
            *([(_("History"), {"fields": ["created_at", "updated_at"], "classes": COLLAPSED})] if obj else []),
        ]

    @admin.display(description=_("Delivery health"))
    def delivery_health(self, obj):
        return delivery_health_html(obj) if obj.pk else "—"

    @admin.display(description=_("windows (s)"))
    def window_summary(self, obj):
        # closed/greeting/open/neutral, as the Debounce section orders them (its help says which).
        return f"{obj.window_closed:g}/{obj.window_greeting:g}/{obj.window_open:g}/{obj.window_neutral:g}"

    @admin.display(description=_("name"), ordering="name")
    def name_cell(self, obj):
        return admin_texts.name(obj.name)

    @display(description=_("status"), label={STATUS_ANSWERING: "success", STATUS_BLOCKED: "danger",
                                              STATUS_OFF: "info"})
    def status(self, obj):
        if not obj.is_active:
            return STATUS_OFF, _("inactive")
        if obj.send_blocked:
            return STATUS_BLOCKED, _("sending blocked")
        return STATUS_ANSWERING, _("active")
