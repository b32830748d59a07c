"""The MCP servers an operator registered, and the tools each one lists."""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils.translation import gettext_lazy as _

SERVER_NAME = r"^[a-z0-9][a-z0-9-]{0,29}$"
# A tool is offered as "<server>__<tool>": server names have no "_", so the split is unambiguous.
SEPARATOR = "__"


class McpTransport(models.TextChoices):
    HTTP = "http", _("Streamable HTTP (a URL)")
    STDIO = "stdio", _("stdio (a local command)")


class McpServer(models.Model):
    """One MCP server whose tools the agents of its channels may call (behind the guard)."""

    name = models.CharField(_("name"), max_length=30, unique=True, validators=[RegexValidator(SERVER_NAME)],
                            help_text=_("Lower-case letters, digits and '-': its tools are offered as <name>__<tool>."))
    transport = models.CharField(_("transport"), max_length=8, choices=McpTransport.choices, default=McpTransport.HTTP)
    url = models.URLField(_("URL"), max_length=500, blank=True, help_text=_("Streamable HTTP: the server's endpoint (https)."))
    # The machine holder's, never an operator's (tools/mcp/reach.py): set by manage.py
    # addmcpserver, read-only in the admin.
    internal_url = models.CharField(
        _("internal URL"), max_length=500, blank=True, editable=False,
        help_text=_("The URL the machine's holder allowed to be http and reach a private address (manage.py "
                    "addmcpserver --internal): only while `url` is exactly this one."))
    command = models.JSONField(_("command"), default=list, blank=True, editable=False,
                               help_text=_('stdio: the command and its arguments, e.g. ["python", "server.py"] '
                                           "(manage.py addmcpserver --command only)."))
    # Secrets, like a channel's: masked in the admin, redacted wherever text is written, never logged.
    headers = models.JSONField(_("headers"), default=dict, blank=True, help_text=_("HTTP headers sent with every request (secret)."))
    env = models.JSONField(_("env"), default=dict, blank=True, editable=False,
                           help_text=_("stdio: environment of the command (secret)."))
    channels = models.ManyToManyField("conversations.Channel", verbose_name=_("channels"), blank=True, related_name="mcp_servers",
                                      help_text=_("The channels whose agents are offered this server's tools."))
    enabled = models.BooleanField(_("enabled"), default=True)
    trusted = models.BooleanField(
        _("trusted"), default=False, help_text=_("Trust its tool annotations when creating policies: readOnlyHint makes a tool "
                                                 "unguarded. Untrusted, hints are only shown; every tool is guarded."))
    timeout_seconds = models.FloatField(_("timeout seconds"), default=30.0, validators=[MinValueValidator(0.1)],
                                        help_text=_("A call with no answer after this long is uncertain."))
    max_result_bytes = models.PositiveIntegerField(_("max result bytes"), default=65536,
                                                   validators=[MinValueValidator(256), MaxValueValidator(1 << 20)],
                                                   help_text=_("A longer result is cut to this size for the model."))
    refresh_seconds = models.PositiveIntegerField(_("refresh seconds"), default=300, validators=[MinValueValidator(5)],
                                                  help_text=_("Its tool list is read again at least this often."))
    listed_at = models.DateTimeField(_("listed at"), null=True, blank=True, help_text=_("When its tools were last listed."))
    last_error = models.TextField(_("last error"), blank=True, help_text=_("Why it was last unreachable (redacted)."))
    updated_at = models.DateTimeField(_("updated at"), auto_now=True)

    class Meta:
        verbose_name = _("MCP server")
        verbose_name_plural = _("MCP servers")
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def secrets(self) -> list[str]:
        return [str(v) for v in [*self.headers.values(), *self.env.values()] if v]

    def clean(self) -> None:
        from tools.mcp.reach import check_url

        if self.transport == McpTransport.HTTP and self.url:
            try:
                check_url(self.url, internal=self.url == self.internal_url)
            except ValueError as exc:
                raise ValidationError({"url": str(exc)}) from None


class McpTool(models.Model):
    """A tool an MCP server listed (kept while it is listed; `present` off when it goes away)."""

    # No index of its own: the unique (server, name) starts with it.
    server = models.ForeignKey(McpServer, verbose_name=_("server"), on_delete=models.CASCADE, related_name="tools", db_index=False)
    name = models.CharField(_("name"), max_length=128, help_text=_("The tool's name on its server."))
    offered_as = models.CharField(_("offered as"), max_length=64, unique=True, help_text=_("Its name for models and its policy."))
    description = models.TextField(_("description"), blank=True)
    input_schema = models.JSONField(_("input schema"), default=dict)
    annotations = models.JSONField(_("annotations"), default=dict, blank=True, help_text=_("Hints from that server (not trusted "
                                                                                           "unless the server is)."))
    present = models.BooleanField(_("present"), default=True, help_text=_("Off: its server no longer lists it."))
    refused = models.CharField(_("refused"), max_length=200, blank=True,
                               help_text=_("Why it is not offered: its schema or description is over the cap."))
    reconcile_with = models.CharField(
        _("reconcile with"), max_length=128, blank=True,
        help_text=_("A read-only tool of the same server that looks this action up after an interrupted call: it "
                    "is called with the call's arguments it accepts; a result with found: false (or empty) means "
                    "the action did not happen, any other result that it did."))
    listed_at = models.DateTimeField(_("listed at"), null=True, blank=True)

    class Meta:
        verbose_name = _("MCP tool")
        verbose_name_plural = _("MCP tools")
        ordering = ["offered_as"]
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="mcp_tool_once_per_server")]

    def __str__(self) -> str:
        return self.offered_as

    def hints(self) -> str:
        shown = [name for name in ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
                 if name in self.annotations]
        return ", ".join(f"{name}={self.annotations[name]}" for name in shown) or "none"
