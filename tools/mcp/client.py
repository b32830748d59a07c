"""The MCP client side: one connection per registered server per process, kept open on
an event loop of its own (a daemon thread), used from any thread with a deadline.

The guard runs tools on threads; `call` blocks the calling thread until the answer or
the deadline. What a failed call means decides the claim's fate:

- `Unreachable`: nothing was sent (no connection could be opened, the request's
  connection was refused) — the action did not happen, its claim is released;
- `AnswerLost`: the request went out and no answer came back (the connection dropped,
  the deadline passed) — it may have happened, its claim becomes uncertain;
- `ServerError`: the server answered with a protocol error — it did not run.

Connection failures are told apart from losses by the HTTP transport itself: a connect
error is recorded on the call's attempt (a context variable the SDK's POST task
inherits), so only a refused connection is "not sent".

This module is what the rest of the product imports: the outcomes, what a connection is
opened with, and `hub`, which imports the SDK (tools/mcp/sdk_client.py) only when a
process first talks to an MCP server. The SDK and what it pulls in (pydantic models of the
whole protocol, starlette, uvicorn) cost every process start about a third of a second of
CPU, a second or more on a loaded machine (-X importtime); most processes never use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tools.mcp.outcomes import CONNECT_SECONDS, AnswerLost, ServerError, ServerSpec, Unreachable

if TYPE_CHECKING:
    import mcp_types

    from tools.mcp.sdk_client import Hub

__all__ = ["CONNECT_SECONDS", "AnswerLost", "LazyHub", "ServerError", "ServerSpec", "Unreachable", "hub"]


class LazyHub:
    """The process's connections (sdk_client.Hub), made on first use. `on_list_changed`
    may be set before: it is handed to the hub when it is made."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hub: Hub | None = None
        self.on_list_changed: Callable[[int], object] | None = None  # callable(server pk), run on a thread

    def _real(self) -> Hub:
        with self._lock:
            if self._hub is None:
                from tools.mcp.sdk_client import Hub  # the SDK's import cost, paid on first use (above)

                self._hub = Hub(on_list_changed=self._list_changed)
            return self._hub

    def _list_changed(self, pk: int) -> None:
        if self.on_list_changed is not None:
            self.on_list_changed(pk)

    def list_tools(self, spec: ServerSpec, deadline: float | None = None) -> list[mcp_types.Tool]:
        return self._real().list_tools(spec, deadline)

    def call(self, spec: ServerSpec, name: str, arguments: dict[str, Any],
             meta: dict[str, Any] | None = None) -> mcp_types.CallToolResult:
        """The server's CallToolResult; raises Unreachable, AnswerLost or ServerError."""
        return self._real().call(spec, name, arguments, meta)

    def forget(self, pk: int) -> None:
        """Close a server's connection (its row changed or was deleted); none made, none to close."""
        if self._hub is not None:
            self._hub.forget(pk)


hub = LazyHub()
