"""Tracing and structured logging with the real OpenTelemetry SDK: spans captured by the SDK's
in-memory exporter, and one export over OTLP/HTTP to a receiver on 127.0.0.1."""

from __future__ import annotations

import io
import itertools
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cuda_agent.telemetry import (
    Stage,
    TelemetryConfig,
    build_exporter,
    configure_logging,
    configure_tracing,
    span,
    span_attributes,
)
from cuda_agent.telemetry import tracing as tracing_module


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Route span() into an in-memory exporter for one test, leaving the global provider alone."""
    monkeypatch.setattr(tracing_module, "_provider", None)
    exporter = InMemorySpanExporter()
    configure_tracing(
        TelemetryConfig(traces_exporter="none"), processors=[SimpleSpanProcessor(exporter)], set_global=False
    )
    yield exporter


def _by_name(finished: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in finished}


def test_spans_nest_run_step_episode_turn_tool_call_judge_stages(spans: InMemorySpanExporter) -> None:
    with (
        span(Stage.RUN, run="tr-1"),
        span(Stage.STEP, step=3),
        span(Stage.EPISODE, task="relu_fused", episode=7),
        span(Stage.TURN, turn=2),
        span(Stage.TOOL_CALL, tool="judge"),
    ):
        for stage in (Stage.BUILD, Stage.VERIFY, Stage.PROFILE):
            with span(stage):
                pass

    found = _by_name(spans.get_finished_spans())
    assert set(found) == {"run", "step", "episode", "turn", "tool_call", "build", "verify", "profile"}
    chain = ["run", "step", "episode", "turn", "tool_call"]
    assert found["run"].parent is None
    for parent, child in itertools.pairwise(chain):
        assert found[child].parent is not None
        assert found[child].parent.span_id == found[parent].context.span_id
    for stage in ("build", "verify", "profile"):
        assert found[stage].parent is not None
        assert found[stage].parent.span_id == found["tool_call"].context.span_id
    assert len({s.context.trace_id for s in found.values()}) == 1
    assert found["episode"].attributes == {"cuda_agent.task": "relu_fused", "cuda_agent.episode": 7}
    assert found["run"].resource.attributes["service.name"] == "cuda-agent"


def test_exception_marks_the_span_failed_and_propagates(spans: InMemorySpanExporter) -> None:
    with pytest.raises(RuntimeError, match="nvcc exited with 1"), span(Stage.BUILD) as current:
        current.set_attribute("cuda_agent.compiler", "nvcc")
        raise RuntimeError("nvcc exited with 1")
    (build,) = spans.get_finished_spans()
    assert build.status.status_code == trace.StatusCode.ERROR
    assert build.attributes is not None and build.attributes["cuda_agent.compiler"] == "nvcc"
    (event,) = build.events
    assert event.name == "exception"
    assert event.attributes is not None and event.attributes["exception.message"] == "nvcc exited with 1"


def test_span_attributes_are_converted_to_otel_types() -> None:
    assert span_attributes(
        {
            "reward": 3,
            "speedup": 1.25,
            "passed": True,
            "skipped": None,
            "checkpoint": Path("/ckpt/step-1"),
            "shapes": [16, 32],
            "mixed": [1, "a"],
            "stage": Stage.VERIFY,
        }
    ) == {
        "cuda_agent.reward": 3,
        "cuda_agent.speedup": 1.25,
        "cuda_agent.passed": True,
        "cuda_agent.checkpoint": "/ckpt/step-1",
        "cuda_agent.shapes": (16, 32),
        "cuda_agent.mixed": ("1", "a"),
        "cuda_agent.stage": "verify",
    }


def test_exporter_follows_otel_environment() -> None:
    auto = TelemetryConfig.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"})
    assert auto.exporter == "otlp"
    assert auto.traces_url == "http://collector:4318/v1/traces"
    assert isinstance(build_exporter(auto), OTLPSpanExporter)

    explicit = TelemetryConfig.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"})
    assert explicit.traces_url == "http://c:4318/custom"

    assert TelemetryConfig.from_env({}).exporter == "none"
    assert build_exporter(TelemetryConfig.from_env({})) is None
    console = TelemetryConfig.from_env({"OTEL_TRACES_EXPORTER": "Console"})
    assert isinstance(build_exporter(console), ConsoleSpanExporter)

    with pytest.raises(ValueError, match="environment variable OTEL_TRACES_EXPORTER='zipkin'"):
        TelemetryConfig.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})


class _Collector(BaseHTTPRequestHandler):
    """Minimal OTLP/HTTP receiver: keeps each POST's path, content type and body."""

    received: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_spans_reach_an_otlp_http_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing_module, "_provider", None)
    _Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        config = TelemetryConfig(
            service_name="trainer",
            otlp_endpoint=f"http://127.0.0.1:{server.server_port}",
            resource_attributes={"cuda_agent.run": "tr-1"},
        )
        provider = configure_tracing(config, set_global=False)
        with span(Stage.RUN, run="tr-1"), span(Stage.STEP, step=1):
            pass
        assert provider.force_flush()
        provider.shutdown()
    finally:
        server.shutdown()
        server.server_close()

    assert _Collector.received, "the exporter sent nothing"
    path, content_type, body = _Collector.received[0]
    assert path == "/v1/traces"
    assert content_type == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = request.resource_spans
    resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert resource["service.name"] == "trainer"
    assert resource["cuda_agent.run"] == "tr-1"
    names = {s.name for scope in resource_spans.scope_spans for s in scope.spans}
    assert names == {"run", "step"}


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    stream = io.StringIO()
    configure_logging("DEBUG", "json", stream)
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_logs_carry_trace_context_and_extras(
    spans: InMemorySpanExporter, log_stream: io.StringIO
) -> None:
    log = logging.getLogger("cuda_agent.trainer")
    log.info("outside any span")
    with span(Stage.EPISODE, task="softmax") as current:
        log.warning("turn %d hit the context limit", 150, extra={"task": "softmax", "tokens": 131072})
        try:
            raise ValueError("bad tool call")
        except ValueError:
            log.exception("tool failed")

    outside, inside, failed = (json.loads(line) for line in log_stream.getvalue().splitlines())
    assert outside["message"] == "outside any span" and "trace_id" not in outside
    assert inside["level"] == "WARNING"
    assert inside["logger"] == "cuda_agent.trainer"
    assert inside["message"] == "turn 150 hit the context limit"
    assert inside["trace_id"] == trace.format_trace_id(current.get_span_context().trace_id)
    assert inside["span_id"] == trace.format_span_id(current.get_span_context().span_id)
    assert (inside["task"], inside["tokens"]) == ("softmax", 131072)
    assert "ValueError: bad tool call" in failed["exception"]


def test_configure_logging_replaces_its_own_handler(log_stream: io.StringIO) -> None:
    root = logging.getLogger()
    before = len(root.handlers)
    second = io.StringIO()
    configure_logging("INFO", "text", second)
    assert len(root.handlers) == before
    logging.getLogger("x").info("plain text line")
    assert "INFO x: plain text line" in second.getvalue()
    assert log_stream.getvalue() == ""
    with pytest.raises(ValueError, match="log format 'xml'"):
        configure_logging("INFO", "xml")
