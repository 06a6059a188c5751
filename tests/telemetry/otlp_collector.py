"""An OTLP/HTTP trace receiver on 127.0.0.1 for tests: it decodes each POST to /v1/traces as the
collector would (ExportTraceServiceRequest, protobuf from opentelemetry-proto) and keeps the spans with
their service's resource attributes. No OpenTelemetry collector binary can run here; the protocol and
the exporters on both sides are the real ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(any_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span as the collector decoded it."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: list[tuple[str, str]]  # (trace_id, span_id) of each span this one links to

    @classmethod
    def decode(cls, span: Span, resource: dict[str, Any]) -> ReceivedSpan:
        return cls(
            name=span.name,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex(),
            kind=span.kind,
            start_ns=span.start_time_unix_nano,
            end_ns=span.end_time_unix_nano,
            attributes={kv.key: any_value(kv.value) for kv in span.attributes},
            resource=resource,
            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        )


class OtlpCollector:
    """`url` is the base endpoint (OTEL_EXPORTER_OTLP_ENDPOINT); `requests` keeps (path, content type)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.receive(self.path, self.headers["Content-Type"], body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def receive(self, path: str, content_type: str, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                received += [ReceivedSpan.decode(s, resource) for s in scope.spans]
        with self._lock:
            self.requests.append((path, content_type))
            self.spans += received

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 60.0
    ) -> list[ReceivedSpan]:
        """The spans received once `done(spans)` holds (exporters batch: spans arrive late)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if done(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)


@contextmanager
def running_collector() -> Iterator[OtlpCollector]:
    collector = OtlpCollector()
    thread = threading.Thread(target=collector.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        collector.server.shutdown()
        collector.server.server_close()
