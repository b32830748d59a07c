"""A real MCP server, written with the SDK's high-level server (MCPServer), for tests:
a ticket desk.

- `create_ticket(subject, body?, priority?)` creates a ticket and appends every
  execution to the log file (one JSON line each) — what the tests count;
- `find_ticket(subject)` (readOnlyHint) looks one up: `{"found": false}` or the ticket;
- `close_all_tickets()` (destructiveHint) closes every ticket;
- `enable_escalation()` adds an `escalate_ticket` tool and says so (tools/list_changed);
- with `--long-description N`, a tool `long_winded` whose description is N characters,
  with `--wide-schema N` a tool `wide_schema` whose one parameter's description is N
  characters (a listing too big to read, or a tool too big to offer).

Its state is the log file, so a restarted server still finds what it created. When the
file `<log>.hang` exists, `create_ticket` records its execution, then never answers
(the test kills it there).

    python -m tests.fakes.mcp_tickets --port N --log FILE [--stdio] [--require-header K=V]
        [--long-description N] [--wide-schema N]
"""

import argparse
import json
import os
import time
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations
from pydantic import Field


def build(log: Path, long_description=0, wide_schema=0) -> MCPServer:
    server = MCPServer("tickets")
    if long_description:
        server.add_tool(lambda: {"said": True}, name="long_winded", description="blah " * (long_description // 5))
    if wide_schema:
        def wide(value: Annotated[str, Field(description="x" * wide_schema)]) -> dict:
            return {"value": value}

        server.add_tool(wide, name="wide_schema", description="A tool with a very wide schema.")

    def tickets():
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    @server.tool(description="Open a support ticket.",
                 annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False))
    def create_ticket(subject: str, body: str = "", priority: str = "normal") -> dict:
        ticket = {"id": len(tickets()) + 1, "subject": subject, "body": body, "priority": priority,
                  "pid": os.getpid(), "at": time.time()}
        with log.open("a") as out:
            out.write(json.dumps(ticket) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if Path(f"{log}.hang").exists():
            while True:  # received, done, and never answered
                time.sleep(1)
        return {"ticket": ticket["id"], "subject": subject}

    @server.tool(description="Look a ticket up by its subject.", annotations=ToolAnnotations(readOnlyHint=True))
    def find_ticket(subject: str) -> dict:
        found = [t for t in tickets() if t["subject"] == subject]
        return {"found": True, "ticket": found[0]["id"], "subject": subject} if found else {"found": False}

    @server.tool(description="Close every ticket.", annotations=ToolAnnotations(destructiveHint=True))
    def close_all_tickets() -> dict:
        with log.open("a") as out:
            out.write(json.dumps({"closed_all": True, "at": time.time()}) + "\n")
        return {"closed": len(tickets())}

    @server.tool(description="Add the escalate_ticket tool (the list changes: tools/list_changed).")
    async def enable_escalation(ctx: Context) -> dict:
        server.add_tool(lambda ticket: {"escalated": ticket}, name="escalate_ticket",
                        description="Escalate a ticket.")
        await ctx.notify_tools_changed()
        return {"enabled": True}

    return server


class RequireHeader:
    """ASGI: refuse requests without the header (a server protected by a secret)."""

    def __init__(self, app, name, value):
        self.app, self.name, self.value = app, name.lower().encode(), value.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (self.name, self.value) not in scope["headers"]:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no"})
            return
        await self.app(scope, receive, send)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--stdio", action="store_true")
    parser.add_argument("--require-header", default="")
    parser.add_argument("--long-description", type=int, default=0)
    parser.add_argument("--wide-schema", type=int, default=0)
    args = parser.parse_args()
    server = build(Path(args.log), args.long_description, args.wide_schema)
    if args.stdio:
        server.run("stdio")
        return
    import uvicorn

    app = server.streamable_http_app()
    if args.require_header:
        name, _, value = args.require_header.partition("=")
        app = RequireHeader(app, name, value)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
