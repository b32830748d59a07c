"""A replay's tools (agentloop.console.replay): while `sandboxed()` holds, the guard
decides every call as it always does — the claim, the caught duplicate, the proposal —
but the tool's effect is never run: a stub answers in its place, so a replayed
conversation books no event, writes no file and sends no mail.

The boundary is the tool's `run()`, outside our code (a calendar server, SMTP): everything
of ours between the agent and that call is the real one. A context variable, not a
setting: it holds for the replay's own calls (its thread, and the event loop it runs its
agent on — asgiref carries the context across both ways), never for a worker's or a
request's running meanwhile in the same process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from tools.registry import Tool, ToolCall

_SANDBOXED: ContextVar[bool] = ContextVar("agentloop_tools_sandboxed", default=False)


@contextmanager
def sandboxed() -> Iterator[None]:
    """Tools called inside this block run their stub, not their effect."""
    token = _SANDBOXED.set(True)
    try:
        yield
    finally:
        _SANDBOXED.reset(token)


def active() -> bool:
    return _SANDBOXED.get()


def run(tool: Tool, call: ToolCall) -> dict[str, Any]:
    """The tool's effect — or, sandboxed, what a stub answers in its place (the guard
    records it as the claim's result, as it would the real one)."""
    if not active():
        return tool.run(call)
    return stub_result(tool, call)


def stub_result(tool: Tool, call: ToolCall) -> dict[str, Any]:
    """A result shaped like a tool's own (the demo agent reads `events` of a listing):
    marked, so nobody mistakes it for a real effect."""
    return {"sandbox": True, "tool": tool.name, "arguments": call.arguments, "events": [],
            "note": "a replay: the tool's effect was not run"}
