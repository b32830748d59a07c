"""Helpers for the MCP tests: the ticket desk (tests/fakes/mcp_tickets.py) as a real
process, and its log of executions."""

import json
import sys
from pathlib import Path

import httpx

from tests.conftest import free_port, wait_until

HEADER_SECRET = "mcp-hdr-Secret-55f0a9c1"


class TicketDesk:
    """The ticket desk started by `processes` on a port of its own (kept across restarts)."""

    def __init__(self, processes, tmp_path: Path, *, require_header=True, options=()):
        self.processes = processes
        self.options = list(options)  # more of the fake's flags (--long-description N, …)
        self.log = tmp_path / "tickets.log"
        self.port = free_port()
        self.require_header = require_header
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self):
        args = [sys.executable, "-m", "tests.fakes.mcp_tickets", "--port", str(self.port), "--log", str(self.log)]
        if self.require_header:
            args += ["--require-header", f"X-Desk-Key={HEADER_SECRET}"]
        args += self.options
        self.proc = self.processes.start("tickets", args)

        def answers():
            assert self.proc.popen.poll() is None, self.proc.output()
            try:
                httpx.get(self.url, timeout=1)
                return True
            except httpx.HTTPError:
                return False

        wait_until(answers, timeout=20, message="the MCP ticket desk")
        return self

    def hang_next(self, on=True):
        hang = Path(f"{self.log}.hang")
        hang.touch() if on else hang.unlink(missing_ok=True)

    def executions(self, tool="create_ticket"):
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [r for r in rows if ("closed_all" in r) == (tool == "close_all_tickets")]


def register(desk, *channels, name="desk", **options):
    """As the machine's holder registers it: the desk listens on 127.0.0.1 over http, so
    `--internal` lets this URL reach a private address (tools/mcp/reach.py)."""
    from django.core.management import call_command

    headers = [f"X-Desk-Key={HEADER_SECRET}"] if desk.require_header else []
    call_command("addmcpserver", name, url=desk.url, header=[h.split("=", 1) for h in headers],
                 channel=list(channels), internal=True, **options)
    from tools.models import McpServer

    return McpServer.objects.get(name=name)
