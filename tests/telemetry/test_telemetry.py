"""Tracing, metrics and structured logging with the real OpenTelemetry SDK and prometheus_client: spans
captured by the SDK's in-memory exporter, exports over OTLP/HTTP to a receiver on 127.0.0.1 and to a file,
trace context carried across a process boundary, /metrics scraped and parsed with prometheus_client's
parser. The end-to-end episode trace is test_episode_trace.py."""

from __future__ import annotations

import importlib.metadata
import io
import itertools
import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_collector import running_collector
from prometheus_client import REGISTRY, Metric
from prometheus_client.parser import text_string_to_metric_families

from cuda_agent.api.sandbox import JudgeResult, JudgeRun
from cuda_agent.sandbox.server.judge_runner import _trace_run as trace_judge_run
from cuda_agent.sandbox.server.metrics import Metrics
from cuda_agent.telemetry import (
    Stage,
    TelemetryConfig,
    attached,
    build_exporter,
    configure_logging,
    configure_tracing,
    inject_context,
    log_fields,
    past_span,
    record_step,
    serve_metrics,
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


def _parent_id(child: ReadableSpan) -> int:
    assert child.parent is not None, f"{child.name} has no parent"
    return child.parent.span_id


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
        assert _parent_id(found[child]) == found[parent].context.span_id
    for phase in ("build", "verify", "profile"):
        assert _parent_id(found[phase]) == found["tool_call"].context.span_id
    assert len({s.context.trace_id for s in found.values()}) == 1
    assert found["episode"].attributes == {"cuda_agent.task": "relu_fused", "cuda_agent.episode": 7}
    assert found["run"].resource.attributes["service.name"] == "cuda-agent"
    # Which release produced the span (the installed distribution's version, as `cuda-agent --version`).
    assert found["run"].resource.attributes["service.version"] == importlib.metadata.version("cuda-agent")


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


def test_spans_reach_an_otlp_http_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing_module, "_provider", None)
    with running_collector() as collector:
        config = TelemetryConfig(
            service_name="trainer",
            otlp_endpoint=collector.url,
            resource_attributes={"cuda_agent.run": "tr-1"},
        )
        provider = configure_tracing(config, set_global=False)
        with span(Stage.RUN, run="tr-1"), span(Stage.STEP, step=1):
            pass
        assert provider.force_flush()
        provider.shutdown()

    assert collector.requests, "the exporter sent nothing"
    assert collector.requests[0] == ("/v1/traces", "application/x-protobuf")
    assert {s.name for s in collector.spans} == {"run", "step"}
    (run,) = (s for s in collector.spans if s.name == "run")
    assert run.resource["service.name"] == "trainer"
    assert run.resource["cuda_agent.run"] == "tr-1"
    assert run.attributes == {"cuda_agent.run": "tr-1"}


def test_resource_and_exporters_follow_the_environment(tmp_path: Path) -> None:
    env = {
        "CUDA_AGENT_RUN_NAME": "tr-7",
        "CUDA_AGENT_RUN_NAMESPACE": "team-a",
        "CUDA_AGENT_POOL_NAME": "h200-pool",
        "HOSTNAME": "trainer-xyz",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "CUDA_AGENT_METRICS_PORT": "9464",
    }
    config = TelemetryConfig.from_env(env, service_name="cuda-agent-trainer")
    assert config.service_name == "cuda-agent-trainer"
    assert config.resource_attributes == {
        "cuda_agent.run": "tr-7",
        "cuda_agent.pool": "h200-pool",
        "k8s.namespace.name": "team-a",
        "k8s.pod.name": "trainer-xyz",
    }
    assert config.metrics_port == 9464 and config.exporter == "none"
    # The downward API's names win over the fallbacks; OTEL_SERVICE_NAME over the process's default.
    pod = TelemetryConfig.from_env(
        {**env, "POD_NAME": "pool-0", "POD_NAMESPACE": "gpu", "OTEL_SERVICE_NAME": "mine"}, service_name="x"
    )
    assert pod.resource_attributes["k8s.pod.name"] == "pool-0"
    assert pod.resource_attributes["k8s.namespace.name"] == "gpu"
    assert pod.service_name == "mine"
    # Outside a pod HOSTNAME names a machine, not a pod.
    laptop = TelemetryConfig.from_env({"HOSTNAME": "laptop"})
    assert "k8s.pod.name" not in laptop.resource_attributes

    with pytest.raises(ValueError, match="environment variable CUDA_AGENT_METRICS_PORT='http'"):
        TelemetryConfig.from_env({"CUDA_AGENT_METRICS_PORT": "http"})

    traces = tmp_path / "traces.jsonl"
    to_file = TelemetryConfig.from_env({"CUDA_AGENT_TRACES_FILE": str(traces)})
    assert to_file.exporter == "file"
    with pytest.raises(ValueError, match="CUDA_AGENT_TRACES_FILE"):
        build_exporter(TelemetryConfig(traces_exporter="file"))


def test_file_exporter_writes_one_json_span_per_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(tracing_module, "_provider", None)
    traces = tmp_path / "traces.jsonl"
    provider = configure_tracing(TelemetryConfig(traces_file=str(traces)), set_global=False)
    with span(Stage.EPISODE, episode_id="e1"), span(Stage.TURN, turn=0):
        pass
    provider.shutdown()
    lines = [json.loads(line) for line in traces.read_text().splitlines()]
    assert [line["name"] for line in lines] == ["turn", "episode"]
    assert lines[0]["parent_id"] == lines[1]["context"]["span_id"]
    assert lines[1]["attributes"] == {"cuda_agent.episode_id": "e1"}


def test_context_crosses_a_process_boundary_as_traceparent(spans: InMemorySpanExporter) -> None:
    assert inject_context() == {}, "outside a span there is nothing to send"
    with span(Stage.STEP, step=1) as step:
        headers = {"Content-Type": "application/json"}
        carrier = inject_context(headers)
    trace_id = trace.format_trace_id(step.get_span_context().trace_id)
    assert carrier["traceparent"].split("-")[1] == trace_id
    assert headers["traceparent"] == carrier["traceparent"]

    # The callee (another process: only the carrier crossed) opens its spans under the caller's.
    with attached(carrier), span("actor.train_ppo", rank=0):
        pass
    with attached(None), span("unrelated"):
        pass
    found = _by_name(spans.get_finished_spans())
    callee = found["actor.train_ppo"]
    assert callee.parent is not None and callee.parent.span_id == step.get_span_context().span_id
    assert callee.context.trace_id == step.get_span_context().trace_id
    assert found["unrelated"].parent is None


def test_past_span_records_an_interval_that_ended_elsewhere(spans: InMemorySpanExporter) -> None:
    with span(Stage.JUDGE_RUN, stage="profile") as judge_run:
        past_span(Stage.BUILD, 1_000, 5_000, compiled=True)
        past_span(Stage.VERIFY, 5_000, 4_000)  # an end before the start is clamped
    found = _by_name(spans.get_finished_spans())
    build, verify = found["build"], found["verify"]
    assert (build.start_time, build.end_time) == (1_000, 5_000)
    assert (verify.start_time, verify.end_time) == (5_000, 5_000)
    assert build.attributes == {"cuda_agent.compiled": True}
    assert build.parent is not None and build.parent.span_id == judge_run.get_span_context().span_id


def test_judge_run_span_holds_the_judges_phases(spans: InMemorySpanExporter) -> None:
    """The server's record of one judge process: outcome attributes, the real judge's step breakdown,
    and a child span per phase that ran, laid end to end with the judge's own durations."""
    result = JudgeResult.model_validate(
        {
            "reward": 2,
            "compiled": True,
            "correct": True,
            "speedup": {"eager": 1.4, "compile": 0.9},
            "seconds": {"build": 1.0, "verify": 0.5, "profile": 2.0},
            "build_cached": False,
            "steps_s": {"references": 0.25, "trials.worker": 0.5},
        }
    )
    run = JudgeRun(stage="profile", result=result, exit_code=0, queue_wait_s=0.5, wall_s=4.0)
    with span(Stage.JUDGE_RUN) as judge_run:
        trace_judge_run(judge_run, run)
    failed = JudgeResult(reward=-1, compiled=False, correct=False, seconds={"build": 3.0, "verify": 0.0})
    with span("failed_build") as failed_run:
        trace_judge_run(failed_run, JudgeRun(stage="compile", result=failed, exit_code=0, wall_s=3.0))
    with span("no_result") as crashed:
        trace_judge_run(
            crashed, JudgeRun(stage="profile", error="judge failed with exit code 1", exit_code=1)
        )

    finished = spans.get_finished_spans()
    found = _by_name(finished)
    attributes = found["judge_run"].attributes
    assert attributes is not None
    assert attributes["cuda_agent.reward"] == 2 and attributes["cuda_agent.queue_wait_s"] == 0.5
    assert attributes["cuda_agent.steps_s.references"] == 0.25
    assert attributes["cuda_agent.steps_s.trials.worker"] == 0.5
    phases = sorted(_children(finished, found["judge_run"]), key=_start)
    assert [p.name for p in phases] == ["build", "verify", "profile"]
    assert [(_end(p) - _start(p)) / 1e9 for p in phases] == pytest.approx([1.0, 0.5, 2.0])
    assert all(_end(a) == _start(b) for a, b in itertools.pairwise(phases))
    assert phases[0].attributes == {"cuda_agent.compiled": True, "cuda_agent.build_cached": False}
    assert phases[2].attributes == {
        "cuda_agent.speedup_vs_eager": 1.4,
        "cuda_agent.speedup_vs_compile": 0.9,
    }
    # A build that failed has no verify or profile span; a judge without a result has no phases.
    assert [s.name for s in _children(finished, found["failed_build"])] == ["build"]
    assert _children(finished, found["no_result"]) == []
    crashed_attributes = found["no_result"].attributes
    assert crashed_attributes is not None
    assert crashed_attributes["cuda_agent.error"] == "judge failed with exit code 1"


def _children(finished: tuple[ReadableSpan, ...], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in finished if s.parent is not None and s.parent.span_id == parent.context.span_id]


def _start(s: ReadableSpan) -> int:
    assert s.start_time is not None
    return s.start_time


def _end(s: ReadableSpan) -> int:
    assert s.end_time is not None
    return s.end_time


def _scrape(url: str) -> dict[str, Metric]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return {f.name: f for f in text_string_to_metric_families(response.read().decode())}


def _value(family: Metric, name: str, **labels: str) -> float:
    (value,) = [s.value for s in family.samples if s.name == name and s.labels == labels]
    return value


def test_trainer_step_metrics_are_served_for_prometheus() -> None:
    syncs_before = REGISTRY.get_sample_value("cuda_agent_trainer_weight_sync_seconds_count") or 0.0
    step_metrics = {
        "reward": 1.5,
        "pass_rate": 0.5,
        "faster_than_compile_rate": 0.25,
        "weight_sync_s": 0.2,
        "rollout_s": 2.0,
        "kl": 0.01,
    }
    record_step("ppo", 3, step_metrics, generated_tokens=400, rollout_gpus=2)
    server = serve_metrics(0, host="127.0.0.1")
    try:
        families = _scrape(f"http://127.0.0.1:{server.server_port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    stage = {"stage": "ppo"}
    assert _value(families["cuda_agent_trainer_step"], "cuda_agent_trainer_step", **stage) == 3
    assert _value(families["cuda_agent_trainer_reward"], "cuda_agent_trainer_reward", **stage) == 1.5
    assert _value(families["cuda_agent_trainer_pass_rate"], "cuda_agent_trainer_pass_rate", **stage) == 0.5
    name = "cuda_agent_trainer_rollout_tokens_per_second_per_gpu"
    assert _value(families[name], name, **stage) == 100.0  # 400 tokens / 2 s / 2 GPUs
    sync = families["cuda_agent_trainer_weight_sync_seconds"]
    assert sync.type == "histogram"
    assert _value(sync, "cuda_agent_trainer_weight_sync_seconds_count") == syncs_before + 1


def test_sandbox_metrics_render_through_prometheus_client() -> None:
    metrics = Metrics()
    metrics.inc("tool_calls_total", "tool calls", tool="bash", outcome="ok")
    metrics.inc("tool_calls_total", "tool calls", 2, tool="bash", outcome="error")
    metrics.inc("sessions_created_total", "sessions created")
    metrics.observe("judge_run_seconds", "judge time", 0.3, stage="profile")
    metrics.gauge("active_sessions", "sessions open now", lambda: [({}, 4)])
    metrics.gauge("gpu_lock_queue", "waiting", lambda: [({"gpu": "0"}, 1), ({"gpu": "1"}, 0)])
    metrics.counter_callback("gpu_lock_queued_seconds_total", "waited", lambda: [({"gpu": "0"}, 2.5)])
    text, content_type = metrics.render()
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}

    p = "cuda_agent_sandbox_"
    calls = families[p + "tool_calls"]
    assert calls.type == "counter"
    assert _value(calls, p + "tool_calls_total", outcome="error", tool="bash") == 2
    assert metrics.counter_value("tool_calls_total", tool="bash", outcome="ok") == 1
    assert metrics.counter_value("tool_calls_total", tool="write", outcome="ok") == 0
    assert metrics.counter_sum("tool_calls_total") == 3
    assert metrics.counter_value("never_counted_total") == 0
    assert _value(families[p + "sessions_created"], p + "sessions_created_total") == 1
    seconds = families[p + "judge_run_seconds"]
    assert seconds.type == "histogram"
    assert _value(seconds, p + "judge_run_seconds_bucket", stage="profile", le="0.5") == 1
    assert _value(seconds, p + "judge_run_seconds_bucket", stage="profile", le="0.25") == 0
    assert _value(families[p + "active_sessions"], p + "active_sessions") == 4
    assert _value(families[p + "gpu_lock_queue"], p + "gpu_lock_queue", gpu="0") == 1
    waited = families[p + "gpu_lock_queued_seconds"]
    assert waited.type == "counter"
    assert _value(waited, p + "gpu_lock_queued_seconds_total", gpu="0") == 2.5
    # A family keeps the label names of its first use: a call with others is a bug, refused.
    with pytest.raises(ValueError):
        metrics.inc("tool_calls_total", "tool calls", tool="bash")


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


def test_fields_are_keys_of_the_json_line_and_key_value_pairs_of_the_text_line(
    log_stream: io.StringIO,
) -> None:
    """log_fields: a step's metrics (or any mapping) as fields; a key a LogRecord already has is renamed
    instead of making logging raise. The text format keeps the same fields after the message."""
    log = logging.getLogger("cuda_agent.trainer.driver")
    metrics = {"stage": "ppo", "step": 3, "reward": 1.25, "clip_fraction": 0.125, "name": "x"}
    log.info("ppo step 3 done", extra=log_fields(metrics))
    line = json.loads(log_stream.getvalue())
    assert line["message"] == "ppo step 3 done"
    assert (line["stage"], line["step"], line["reward"], line["clip_fraction"]) == ("ppo", 3, 1.25, 0.125)
    assert line["name_"] == "x" and line["logger"] == "cuda_agent.trainer.driver"

    text = io.StringIO()
    configure_logging("INFO", "text", text)
    log.info("ppo step 3 done", extra=log_fields(metrics))
    expected = "ppo step 3 done stage=ppo step=3 reward=1.25 clip_fraction=0.125 name_=x"
    assert text.getvalue().rstrip().endswith(f"INFO cuda_agent.trainer.driver: {expected}")
    # A library's own bookkeeping attributes can be left out of the line (the operator hides Kopf's).
    hidden = io.StringIO()
    configure_logging("INFO", "json", hidden, hidden=("settings",))
    log.info("kopf line", extra={"settings": object(), "k8s_ref": {"name": "r"}})
    kopf_line = json.loads(hidden.getvalue())
    assert "settings" not in kopf_line and kopf_line["k8s_ref"] == {"name": "r"}


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
