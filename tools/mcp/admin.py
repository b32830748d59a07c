"""The admin for MCP servers and their tools. Headers and a stdio command's environment
are secrets: shown as their names with a mask, never their values; a masked value
posted back keeps the stored one.

Operators register HTTP servers only, at URLs checked as media URLs are
(tools/mcp/reach.py). A stdio server runs a command on the machine: it is the machine
holder's (`manage.py addmcpserver --command`), shown read-only here to everyone,
superusers too, and never started by a web request (issue 51)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html
from django.utils.text import format_lazy
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from agentloop.core import admin_texts
from agentloop.core.admin_texts import TextsHold
from agentloop.core.redaction import MASK, forget_secrets, redact
from tools import guard
from tools.mcp import catalog
from tools.mcp.client import Unreachable, hub
from tools.mcp.models import McpServer, McpTool, McpTransport
from tools.models import ToolPolicy

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin, TabularInline
    from django.http import HttpRequest
    from django.utils.safestring import SafeString

    # unfold has no types; its ModelAdmin and TabularInline are Django's with a theme.
    ServerAdminBase = ModelAdmin[McpServer]
    ToolAdminBase = ModelAdmin[McpTool]
    ToolInlineBase = TabularInline[McpTool, McpServer]
    ServerFormBase = forms.ModelForm[McpServer]
else:
    from unfold.admin import ModelAdmin, TabularInline

    ServerAdminBase = ToolAdminBase = ModelAdmin
    ToolInlineBase = TabularInline
    ServerFormBase = forms.ModelForm


def masked(values: dict[str, Any] | None) -> dict[str, str]:
    return {name: MASK for name in (values or {})}


class SecretMapField(forms.JSONField):
    """A JSON object of secrets, shown masked."""

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, str):  # a bound form's raw text
            return value
        return json.dumps(masked(value or {}))


class McpServerForm(ServerFormBase):
    url = forms.URLField(required=False, max_length=500, assume_scheme="https",
                         help_text=_("Streamable HTTP: the server's endpoint."))
    headers = SecretMapField(required=False, help_text=format_lazy(_(
        "Names and values, e.g. {{\"Authorization\": \"Bearer …\"}}. Values are shown as {mask}: leave them so to "
        "keep them."), mask=MASK))
    transport = forms.ChoiceField(choices=[(McpTransport.HTTP.value, McpTransport.HTTP.label)],
                                  initial=McpTransport.HTTP,
                                  help_text=_("stdio servers are registered on the machine: manage.py addmcpserver."))

    class Meta:
        model = McpServer
        fields = "__all__"

    def _kept(self, name: str) -> dict[str, str]:
        given = self.cleaned_data.get(name) or {}
        if not isinstance(given, dict):
            raise forms.ValidationError(gettext("a JSON object of names and values"))
        stored = getattr(self.instance, name) or {} if self.instance.pk else {}
        return {key: stored.get(key, "") if value == MASK else str(value) for key, value in given.items()}

    def clean_headers(self) -> dict[str, str]:
        return self._kept("headers")

    def clean(self) -> dict[str, Any] | None:
        data = super().clean()  # ModelForm's: its cleaned_data, never None
        if not (data and data.get("url")):
            self.add_error("url", gettext("a streamable HTTP server needs its URL"))
        return data


class McpToolInline(ToolInlineBase):
    model = McpTool
    extra = 0
    can_delete = False
    fields = ["offered_as", "present", "refused", "hints", "reconcile_with", "policy"]
    readonly_fields = ["offered_as", "present", "refused", "hints", "policy"]

    @admin.display(description=_("Hints from this server"))
    def hints(self, row: McpTool) -> str:
        return row.hints()

    @admin.display(description=_("Policy"))
    def policy(self, row: McpTool) -> str:
        policy = ToolPolicy.objects.filter(name=row.offered_as).first()
        if policy is None:
            return "—"
        return format_html('<a href="../../../toolpolicy/{}/change/">{}</a>', policy.pk, gettext(
            "guard %(guard)s, approval %(approval)s") % {"guard": gettext("on") if policy.guarded else gettext("off"),
                                                         "approval": policy.approval})


@admin.register(McpServer)
class McpServerAdmin(TextsHold, ServerAdminBase):
    form = McpServerForm
    list_display = ["name", "transport", "endpoint", "enabled", "trusted", "listed_at", "problem"]
    list_filter = ["enabled", "trusted", "transport"]
    filter_horizontal = ["channels"]
    readonly_fields = ["listed_at", "last_error", "internal_url"]
    # A stdio server, read-only: the machine holder's command and the names of its environment.
    stdio_fields = ["name", "transport", "command", "environment", "channels", "enabled", "trusted",
                    "timeout_seconds", "max_result_bytes", "refresh_seconds", "listed_at", "last_error"]
    inlines = [McpToolInline]

    @admin.display(description=_("URL or command"))
    def endpoint(self, server: McpServer) -> SafeString:
        return admin_texts.name(redact(server.url or " ".join(server.command), server.secrets()), 80)

    @admin.display(description=_("Environment"))
    def environment(self, server: McpServer) -> str:
        return ", ".join(f"{name}={MASK}" for name in server.env) or "—"

    @staticmethod
    def _is_stdio(obj: McpServer | None) -> bool:
        return obj is not None and obj.transport != McpTransport.HTTP

    def get_fields(self, request: HttpRequest, obj: McpServer | None = None) -> Any:
        return self.stdio_fields if self._is_stdio(obj) else super().get_fields(request, obj)

    def get_readonly_fields(self, request: HttpRequest, obj: McpServer | None = None) -> list[str] | tuple[str, ...]:
        return self.stdio_fields if self._is_stdio(obj) else self.readonly_fields

    def has_change_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return not self._is_stdio(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: McpServer | None = None) -> bool:
        return not self._is_stdio(obj) and super().has_delete_permission(request, obj)

    @admin.display(description=_("Last problem"))
    def problem(self, server: McpServer) -> SafeString:
        return admin_texts.cell(redact(server.last_error, server.secrets()), length=120)

    def save_related(self, request: HttpRequest, form: McpServerForm, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        server = form.instance
        forget_secrets()
        guard.forget_policies()  # and the MCP tools cached with them
        hub.forget(server.pk)
        if server.enabled and not self._is_stdio(server):  # never a command from a web request
            try:
                names = catalog.refresh(server)
                messages.info(request, ngettext("%(server)s: %(n)d tool listed", "%(server)s: %(n)d tools listed",
                                                len(names)) % {"server": server.name, "n": len(names)})
            except Unreachable as exc:
                messages.warning(request, str(exc))


@admin.register(McpTool)
class McpToolAdmin(TextsHold, ToolAdminBase):
    list_display = ["offered_as", "server", "present", "refused", "hints", "reconcile_with", "listed_at"]
    list_filter = ["server", "present"]
    fields = ["server", "name", "offered_as", "refused", "description", "input_schema", "annotations", "present",
              "reconcile_with", "listed_at"]
    readonly_fields = ["server", "name", "offered_as", "refused", "description", "input_schema", "annotations",
                       "present", "listed_at"]

    @admin.display(description=_("Hints from its server"))
    def hints(self, row: McpTool) -> str:
        return row.hints()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
