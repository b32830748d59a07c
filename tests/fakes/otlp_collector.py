"""A local OpenTelemetry collector speaking OTLP/HTTP: `POST /v1/traces` with a protobuf
`ExportTraceServiceRequest` (gzip or plain), decoded with opentelemetry-proto and kept as
`Span` records; answered `200` with an `ExportTraceServiceResponse`, as a collector
(Jaeger, Tempo, the OpenTelemetry Collector) does.

    with OtlpCollector() as collector:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        ...
        collector.wait_for(lambda spans: any(s.name == "agentloop.send" for s in spans))
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import time
import zlib
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.fakes.server import FakeServer, TrackedHandler

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUS = {0: "unset", 1: "ok", 2: "error"}


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    kind: str
    attributes: dict
    links: tuple  # ((trace id, span id), …)
    status: str
    status_message: str
    resource: dict = field(default_factory=dict)  # service.name, agentloop.process, …
    start_ns: int = 0
    end_ns: int = 0


def value(any_value: AnyValue):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


def attributes(pairs) -> dict:
    return {pair.key: value(pair.value) for pair in pairs}


def decode(body: bytes, encoding: str) -> list[Span]:
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(Span(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(), kind=KINDS.get(s.kind, str(s.kind)),
                    attributes=attributes(s.attributes),
                    links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                    status=STATUS.get(s.status.code, str(s.status.code)), status_message=s.status.message,
                    resource=resource, start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano))
    return spans


class Handler(TrackedHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.rstrip("/") != "/v1/traces":
            return self._answer(404, b"")
        if self.headers.get("Content-Type", "").split(";")[0] != "application/x-protobuf":
            return self._answer(415, b"")
        try:
            spans = decode(body, self.headers.get("Content-Encoding", ""))
        except Exception:  # a collector answers a body it cannot read with 400
            return self._answer(400, b"")
        with self.server._cond:
            self.server.requests += 1
            self.server.received.extend(spans)
            self.server._cond.notify_all()
        self._answer(200, ExportTraceServiceResponse().SerializeToString())

    def _answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class OtlpCollector(FakeServer):
    def __init__(self, port=0):
        super().__init__(("127.0.0.1", port), Handler)
        self.received: list[Span] = []
        self.requests = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def spans(self, name=None) -> list[Span]:
        with self._cond:
            return [s for s in self.received if name is None or s.name == name]

    def wait_for(self, predicate, timeout=15.0) -> list[Span]:
        """Wait until `predicate(spans received)` holds; the spans then, or AssertionError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(list(self.received)):
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted(s.name for s in self.received)
                    raise AssertionError(f"the collector did not receive the spans awaited in {timeout}s: {names}")
                self._cond.wait(left)
            return list(self.received)


@contextlib.contextmanager
def silent_endpoint():
    """The URL of a collector that takes connections and never answers: a listening
    socket nobody accepts from (the kernel's backlog completes the handshakes)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
