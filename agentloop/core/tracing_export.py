"""The tracing pipeline of a process that traces (agentloop.core.tracing decides; a
process that does not never imports this module, nor OpenTelemetry's SDK).

Spans go to a TracerProvider of our own, through a batch span processor — a bounded
queue (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048; a span that finds it full is dropped, never
waited for) emptied by its own thread every `OTEL_BSP_SCHEDULE_DELAY` ms — into the
OTLP/HTTP exporter, whose every export has a deadline (`OTEL_EXPORTER_OTLP_TIMEOUT`
seconds, EXPORT_SECONDS here by default). Ending a span is an append to that queue:
a collector that is slow or gone costs a message nothing.

The SDK reads the rest of its variables itself: the exporter's headers
(`OTEL_EXPORTER_OTLP_HEADERS`: a collector's credentials, never logged here), the
sampler (`OTEL_TRACES_SAMPLER`; its default follows the stored parent's decision, so a
trace sampled at admission is kept to its last send), the resource's attributes.

The exporter's own log lines (a warning per retry, an error per batch lost) are held
back: a collector that is away is said once, when the first batch is lost, with the
reason (redacted), and its return once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from agentloop.core import traceparent
from agentloop.core.redaction import redact

log = logging.getLogger("agentloop.tracing")

# Seconds one export may take, retries included, unless OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT
# says (the library's own default, 10, held a stopping process twice as long).
EXPORT_SECONDS = 5.0
# Seconds a stopping process gives what is still queued to go out.
SHUTDOWN_SECONDS = 2.0
DEFAULT_ENDPOINT = "http://localhost:4318"  # OTLP/HTTP's
TIMEOUT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
# The loggers whose lines this module says once instead (see FaultReporting): the
# exporter's (its HTTP client logs through the first), the batch processor's.
EXPORTER_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "opentelemetry.exporter.otlp.common.http",
                    "opentelemetry.exporter.otlp.proto.http._common")
PROCESSOR_LOGGER = "opentelemetry.sdk._shared_internal"
KINDS = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER, "client": SpanKind.CLIENT}
# Longest error text put on a span (after redaction).
MAX_ERROR_CHARS = 200


class Pipeline:
    """One process's tracer, processor and exporter."""

    def __init__(self, process: str, hostname: str):
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "agentloop",
                                    "agentloop.process": process, "host.name": hostname,
                                    "process.pid": os.getpid()})
        endpoint = _endpoint()
        self.exporter = FaultReporting(OTLPSpanExporter(endpoint=endpoint, timeout=_export_timeout()), endpoint)
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("agentloop")
        log.info("tracing: spans of this %s process go to %s", process, self.exporter.where)

    def start(self, name: str, parent: str | None, *, links: Iterable[str | None], kind: str,
              attributes: Mapping[str, Any] | None) -> Span:
        otel_span = self.tracer.start_span(name, context=_parent_context(parent), kind=KINDS[kind],
                                           attributes=clean(attributes), links=_links(links))
        context = otel_span.get_span_context()
        return Span(otel_span, traceparent.format(context.trace_id, context.span_id, int(context.trace_flags)))

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush and stop within `timeout` seconds (SHUTDOWN_SECONDS): on a thread of its
        own, not waited for beyond that (a daemon: the process may exit under it)."""
        timeout = SHUTDOWN_SECONDS if timeout is None else timeout
        self.exporter.deadline = time.monotonic() + timeout
        stopping = threading.Thread(target=self.provider.shutdown, name="tracing-shutdown", daemon=True)
        stopping.start()
        stopping.join(timeout)


def _endpoint() -> str:
    """Where spans are posted, read as the OTLP exporter reads it: the traces endpoint
    whole, or the base endpoint with /v1/traces, or the OTLP/HTTP default."""
    whole = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if whole:
        return whole
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or DEFAULT_ENDPOINT
    return f"{base.removesuffix('/')}/v1/traces"


def _export_timeout() -> float | None:
    """None: the exporter reads the variable itself."""
    return None if any(os.environ.get(name) for name in TIMEOUT_VARIABLES) else EXPORT_SECONDS


def _parent_context(stored: str | None) -> otel_context.Context | None:
    """The context a span starts in: under a stored traceparent, else the current one."""
    ids = traceparent.parse(stored)
    if ids is None:
        return None  # the current context: the span current here, or none (a new trace)
    return trace.set_span_in_context(NonRecordingSpan(_span_context(ids)), otel_context.Context())


def _links(traceparents: Iterable[str | None]) -> list[Link]:
    found = (traceparent.parse(tp) for tp in traceparents)
    return [Link(_span_context(ids)) for ids in found if ids is not None]


def _span_context(ids: tuple[int, int, int]) -> SpanContext:
    trace_id, span_id, flags = ids
    return SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True, trace_flags=TraceFlags(flags & 0xFF))


class Span:
    """A recording span of ours; NoSpan (agentloop.core.tracing) is its do-nothing twin."""

    __slots__ = ("_span", "_token", "traceparent")

    def __init__(self, otel_span: Any, stored: str):
        self._span = otel_span
        self._token: Any = None
        self.traceparent = stored

    def set(self, attributes: Mapping[str, Any]) -> None:
        """Ids, counts, outcomes: None values are left out."""
        self._span.set_attributes(clean(attributes))

    def fail(self, error: object) -> None:
        """Mark it failed, with the error's text redacted."""
        self._span.set_status(Status(StatusCode.ERROR, error_text(error)))

    def end(self) -> None:
        self._span.end()

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind: Any, error: Any, tb: Any) -> Literal[False]:
        try:
            # A cancellation (a BaseException: /stop, a shutdown) is not a failure.
            if isinstance(error, Exception):
                self.fail(error)
        finally:
            otel_context.detach(self._token)
            self._span.end()
        return False


def clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: value for key, value in (attributes or {}).items() if value is not None}


def error_text(error: object) -> str:
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return redact(text)[:MAX_ERROR_CHARS]


class FaultReporting(SpanExporter):
    """The OTLP exporter, its faults said once: the first batch lost after a success (or
    at the start) is logged with the reason the exporter gave, redacted; the next success
    says it is back. The exporter's own lines (one per retry and per batch) are held back
    by a filter on its loggers, which keeps the last one as the reason; the processor's
    "queue full" (a line every 20 s while spans are dropped) is said once per fault too.

    Past `deadline` (set when the process stops) a batch is dropped at once."""

    def __init__(self, inner: OTLPSpanExporter, endpoint: str):
        self.inner = inner
        self.deadline: float | None = None
        self.failing = False
        self.queue_full = False
        self.reason = ""
        self.lost = 0
        self.where = _where(endpoint)
        for name in EXPORTER_LOGGERS:
            logging.getLogger(name).addFilter(self._keep_reason)
        logging.getLogger(PROCESSOR_LOGGER).addFilter(self._once_when_full)

    def _keep_reason(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and not self.reason:  # the first says most ("Read timed out")
            self.reason = redact(record.getMessage())[:300]
        return False

    def _once_when_full(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Queue full"):
            return True
        if not self.queue_full:
            self.queue_full = True
            log.warning("tracing: the span queue is full (the collector at %s does not keep up); spans are "
                        "dropped while it is", self.where)
        return False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self.deadline is not None and time.monotonic() > self.deadline:
            return SpanExportResult.FAILURE
        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            if self.failing:
                log.warning("tracing: the collector at %s takes spans again (%d lost meanwhile)", self.where,
                            self.lost)
            self.failing, self.queue_full, self.lost, self.reason = False, False, 0, ""
            return result
        self.lost += len(spans)
        if not self.failing:
            self.failing = True
            log.warning("tracing: spans could not be sent to the collector at %s (%s); they are dropped until "
                        "it takes them again", self.where, self.reason or "no answer")
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()  # type: ignore[no-untyped-call]  # the OTLP exporter leaves it unannotated

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _where(endpoint: str) -> str:
    """The collector's scheme, host and port: never a user or password in the URL."""
    parts = urlsplit(endpoint)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"
