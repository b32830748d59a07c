"""manage.py addmcpserver NAME --url URL [--header K=V]… [--channel SLUG]… — register an
MCP server (or `--command "python server.py"` for stdio) and list its tools.

Run by whoever holds the machine: a stdio server's command, and `--internal` (this URL
may be http and reach a private address), are set only here, never in the admin
(tools/mcp/reach.py, issue 51)."""

import shlex
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentloop.core.redaction import forget_secrets, redact
from tools import guard
from tools.mcp import catalog
from tools.mcp.client import Unreachable, hub
from tools.mcp.models import McpServer, McpTransport


def pair(value: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep or not name:
        raise ValueError(value)
    return name.strip(), val


class Command(BaseCommand):
    help = "Register (or update) an MCP server whose tools the agents of the given channels may call."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Lower-case letters, digits, '-': its tools are offered as NAME__tool.")
        where = parser.add_mutually_exclusive_group(required=True)
        where.add_argument("--url", help="A streamable HTTP endpoint.")
        where.add_argument("--command", help="A local command speaking MCP on stdio (shell-quoted).")
        parser.add_argument("--header", action="append", type=pair, default=[], metavar="K=V",
                            help="An HTTP header (secret: never printed).")
        parser.add_argument("--env", action="append", type=pair, default=[], metavar="K=V",
                            help="stdio: an environment variable of the command (secret).")
        parser.add_argument("--channel", action="append", default=[], metavar="SLUG",
                            help="A channel whose agents are offered its tools (repeatable).")
        parser.add_argument("--internal", action="store_true",
                            help="This URL may be http and reach a private address (a server on your own network); "
                                 "an operator who changes the URL loses that.")
        parser.add_argument("--trusted", action="store_true",
                            help="Trust its annotations (readOnlyHint tools run unguarded).")
        parser.add_argument("--timeout", type=float, help="Seconds before a call without answer is uncertain.")
        parser.add_argument("--no-list", action="store_true", help="Do not connect to list its tools now.")

    def handle(self, *args: Any, **options: Any) -> None:
        name, url, command, channel = options["name"], options.get("url"), options.get("command"), options["channel"]
        header, env = options.get("header") or (), options.get("env") or ()
        # conversations' Channel, through the server's own many-to-many field.
        channel_model = McpServer.channels.field.related_model
        # A model class of a layer above, unnamed here: its manager as Django finds it at run time.
        channels = list(channel_model.objects.filter(slug__in=channel))  # type: ignore[attr-defined]
        missing = sorted(set(channel) - {c.slug for c in channels})
        if missing:
            raise CommandError(f"unknown channel(s): {', '.join(missing)}")
        server = McpServer.objects.filter(name=name).first() or McpServer(name=name)
        server.transport = McpTransport.HTTP if url else McpTransport.STDIO
        server.url = url or ""
        server.internal_url = server.url if options.get("internal") else ""
        server.command = shlex.split(command) if command else []
        server.headers, server.env = dict(header), dict(env)
        server.trusted = options["trusted"]
        if options.get("timeout"):
            server.timeout_seconds = options["timeout"]
        try:
            server.full_clean()
        except ValidationError as exc:
            raise CommandError(redact("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()),
                                      server.secrets())) from exc
        created = server.pk is None
        server.save()
        server.channels.add(*channels)
        forget_secrets()
        guard.forget_policies()  # and the MCP tools cached with them
        hub.forget(server.pk)
        self.stdout.write(f"{'created' if created else 'updated'} MCP server {server.name} "
                          f"({server.transport}; {len(server.headers)} header(s), channels: "
                          f"{', '.join(sorted(c.slug for c in server.channels.all())) or 'none'})")
        if options["no_list"]:
            return
        try:
            names = catalog.refresh(server)
        except Unreachable as exc:
            self.stderr.write(f"warning: {exc}; its tools are listed when it answers")
            return
        for tool_name in names:
            self.stdout.write(f"  {server.name}__{tool_name}")
