"""What an MCP call can end in, and what a connection is opened with: shared by the light
side (client.py, imported everywhere) and the SDK side (sdk_client.py, imported on first use)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.mcp.models import McpServer

CONNECT_SECONDS = 5.0
# A stdio server is a process to start before its handshake: an interpreter importing its
# SDK, or `npx` unpacking a package, takes seconds on a loaded machine (1.2 s idle for the
# SDK's own server here, over 5 s with the test suite running beside it).
STDIO_START_SECONDS = 20.0


class Unreachable(Exception):
    """The server could not be reached: the request was not sent."""


class AnswerLost(Exception):
    """The request was sent and its answer never came back: it may have run."""


class ServerError(Exception):
    """The server refused the request with a protocol error: it did not run."""


@dataclass(frozen=True)
class ServerSpec:
    """What a connection is opened with (a snapshot of an McpServer row)."""

    pk: int
    name: str
    transport: str
    url: str = ""
    command: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()  # (name, value) pairs
    env: tuple[tuple[str, str], ...] = ()
    timeout: float = 30.0
    internal: bool = False  # its URL is the one the machine's holder allowed (tools/mcp/reach.py)
    version: str = ""  # the row's updated_at: a changed server is connected anew

    @classmethod
    def of(cls, server: McpServer) -> ServerSpec:
        return cls(pk=server.pk, name=server.name, transport=server.transport, url=server.url,
                   command=tuple(server.command or ()), headers=tuple(sorted((server.headers or {}).items())),
                   env=tuple(sorted((server.env or {}).items())), timeout=float(server.timeout_seconds),
                   internal=bool(server.url) and server.url == server.internal_url,
                   version=server.updated_at.isoformat() if server.updated_at else "")

    @property
    def open_seconds(self) -> float:
        """How long opening a connection may take: starting the command, or connecting."""
        return STDIO_START_SECONDS if self.transport == "stdio" else CONNECT_SECONDS

    def secrets(self) -> list[str]:
        return [str(v) for _, v in (*self.headers, *self.env) if v]
