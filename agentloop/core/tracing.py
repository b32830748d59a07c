"""Optional OpenTelemetry traces of a message's path: admitted (the web process) → its
buffer flushed into a turn → the turn (the agent's call, each tool call through the
guard) → each send of its reply (docs/metrics.md, "Traces").

**Off unless configured** (`AGENTLOOP_TRACING`, or an OTLP endpoint in the
environment: `decide`). Off, nothing of OpenTelemetry is imported by this module, and
every call here reads one module-level value and hands back a shared span that does
nothing.

**Across processes** a trace travels in the rows the path writes anyway: each step
stores the W3C `traceparent` of its span (an inbound message its admission's, a turn
its flush's, a ledger row its turn's), and the next step — in whichever process, after
whatever crash — starts its span under it. A turn merging several messages is the child
of its first message's admission and links to every message's.

**Ids and counts only** on spans: never a text, a name or a platform id; an error's text
is redacted (agentloop.core.redaction) before it is put on one.

**Our own TracerProvider**, not the global one: libraries that trace through the global
API (the MCP SDK does) export nothing through it, so no span but ours, with attributes
we chose, leaves the process. Spans go out through a batch processor (a bounded queue,
dropped when full) on its thread, each export bounded by the exporter's deadline: a
collector that is slow or gone never holds a message up (agentloop.core.tracing_export).
"""

from __future__ import annotations

import atexit
import contextvars
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from agentloop.core.redaction import redact

if TYPE_CHECKING:
    from django.conf import LazySettings

    from agentloop.core.tracing_export import Pipeline, Span

# The environment variables that name a collector (the OTLP exporter's own).
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SWITCH_VALUES = ("auto", "true", "false")

_state: Pipeline | Literal[False] | None = None  # None: not decided yet in this process; False: off; else the pipeline
_lock = threading.Lock()


def decide(switch: str, environ: Mapping[str, str]) -> bool:
    """Whether this process traces: `AGENTLOOP_TRACING` true or false says so; `auto` (the
    default) traces when a collector is named (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT).
    OpenTelemetry's own off switches (`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`)
    win over both."""
    if switch not in SWITCH_VALUES:
        raise ValueError(f"AGENTLOOP_TRACING must be one of {', '.join(SWITCH_VALUES)}, not {switch!r}")
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    if switch == "auto":
        return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)
    return switch == "true"


def on() -> bool:
    """Whether spans are recorded in this process (decided at the first call)."""
    state = _state
    if state is None:
        state = _start()
    return state is not False


def _start() -> Pipeline | Literal[False]:
    global _state
    with _lock:
        if _state is None:
            from django.conf import settings

            _state = _pipeline(settings) if decide(settings.AGENTLOOP_TRACING, os.environ) else False
        return _state


def _pipeline(settings: LazySettings) -> Pipeline | Literal[False]:
    """This process's pipeline; False (and said once) when the SDK refuses its
    configuration (a malformed OTEL_* value): no trace is worth a message."""
    try:
        # Imported only here: a process that does not trace never loads the SDK.
        from agentloop.core import tracing_export

        pipeline = tracing_export.Pipeline(settings.AGENTLOOP_PROCESS or "command", settings.AGENTLOOP_HOSTNAME)
    except Exception as exc:
        logging.getLogger("agentloop.tracing").error("tracing is off in this process: %s", redact(str(exc))[:300])
        return False
    atexit.register(shutdown)
    return pipeline


def shutdown(timeout: float | None = None) -> None:
    """Export what is queued, within `timeout` seconds at most (at exit: a collector that
    does not answer must not hold a stopping process up)."""
    state = _state
    if state is not None and state is not False:
        state.shutdown(timeout)


class NoSpan:
    """What every call gets while tracing is off: does nothing, costs nothing."""

    traceparent = None

    def __enter__(self) -> NoSpan:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        return False

    def set(self, attributes: Mapping[str, Any]) -> None:
        pass

    def fail(self, error: object) -> None:
        pass

    def end(self) -> None:
        pass


NO_SPAN = NoSpan()


def span(name: str, parent: str | None = None, *, links: Iterable[str | None] = (), kind: str = "internal",
         attributes: Mapping[str, Any] | None = None) -> Span | NoSpan:
    """A span started now (a tracing_export.Span): under `parent` (a stored traceparent)
    when given and valid, else under the span current in this context (a new trace if
    none), linked to the spans of `links` (traceparents; empty ones skipped). `kind`: internal, server or
    client. Use it as a context manager (current while inside; an exception marks it
    failed) or call `end()` yourself. NO_SPAN while tracing is off."""
    state = _state if _state is not None else _start()  # on(), keeping what it decided
    if state is False:
        return NO_SPAN
    return state.start(name, parent, links=links, kind=kind, attributes=attributes)


def carry(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` to be run on another thread (an executor's) under the span current here:
    executors do not carry context variables. `fn` itself while tracing is off."""
    if not on():
        return fn
    return functools.partial(contextvars.copy_context().run, fn)
