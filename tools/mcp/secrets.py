"""The secrets registered MCP servers hold — header values, stdio environments — for the
masking of error texts (agentloop.core.redaction reads them through
settings.AGENTLOOP_SECRET_SOURCES, each source in a savepoint of its own when inside a
transaction: it sits layers below)."""

from __future__ import annotations

from agentloop.core.redaction import MIN_SECRET
from tools.mcp.models import McpServer


def of_every_server() -> list[str]:
    rows = McpServer.objects.values_list("headers", "env")
    return [str(value) for maps in rows for values in maps if isinstance(values, dict)
            for value in values.values() if value and len(str(value)) >= MIN_SECRET]
