"""One local episode traced end to end: the agent loop (scripted policy) in this process and a real
sandbox server (fake judge, tests/sandbox) as a subprocess both export OTLP/HTTP to an in-process
collector; the episode must be one trace of its own, linked to the trainer's step, from the episode span
into the server's judge phases. The
server's /metrics is scraped and parsed with prometheus_client's parser."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from otlp_collector import OtlpCollector, ReceivedSpan
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parents[1] / "agent"))

from agent_helpers import SMOLLM2_GGUF, smollm2_dir, start_sandbox
from sandbox_helpers import RunningServer, cleanup

from cuda_agent.agent import AgentConfig, AgentLoop, ChatCodec, Trajectory, openai_tools
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.replay import ReplayBackend
from cuda_agent.sandbox.client import SandboxClient
from cuda_agent.telemetry import Stage, TelemetryConfig, configure_tracing, span
from cuda_agent.telemetry import tracing as tracing_module

TASK = TaskRef(
    source=(Path(__file__).parents[2] / "examples" / "tasks" / "relu_mul_add.py").read_text(),
    name="relu_mul_add",
)
SERVER_SPAN = ProtoSpan.SpanKind.SPAN_KIND_SERVER
CLIENT_SPAN = ProtoSpan.SpanKind.SPAN_KIND_CLIENT
TOKENIZER_CACHE = Path.home() / ".cache" / "cuda-agent" / "tokenizers"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(scope="module")
def traced_server(collector: OtlpCollector) -> Iterator[RunningServer]:
    """A sandbox server exporting its spans to the collector, as a pod of pool `pool-a` would."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds: spans reach the collector soon after they end
        "CUDA_AGENT_POOL_NAME": "pool-a",
        "POD_NAME": "pool-a-0",
    }
    running = start_sandbox(env=env)
    try:
        yield running
    finally:
        cleanup(running)


def smollm2_tokenizer() -> Any:
    """SmolLM2's tokenizer and chat template. Reading them from the GGUF file takes 10-20 s, so the first
    read is saved in the fast tokenizer format under ~/.cache/cuda-agent (loads in well under a second)."""
    from transformers import AutoTokenizer

    cache = TOKENIZER_CACHE / SMOLLM2_GGUF.removesuffix(".gguf")
    if (cache / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(cache)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir(), gguf_file=SMOLLM2_GGUF)
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=cache.name, dir=cache.parent))
    tokenizer.save_pretrained(partial)
    with contextlib.suppress(OSError):  # another run saved it first
        partial.rename(cache)
    shutil.rmtree(partial, ignore_errors=True)
    return tokenizer


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    return ChatCodec(smollm2_tokenizer(), openai_tools(AgentConfig().tools))


@pytest.fixture(scope="module")
def episode(
    collector: OtlpCollector, traced_server: RunningServer, codec: ChatCodec
) -> Iterator[tuple[Trajectory, list[ReceivedSpan], dict[str, float]]]:
    """The trainer's side: run > step > one episode (`verify` over bash, then done and judged), with
    the trainer's Prometheus samples before and after."""
    saved = tracing_module._provider
    tracing_module._provider = None
    provider = configure_tracing(
        TelemetryConfig(
            service_name="cuda-agent-trainer",
            otlp_endpoint=collector.url,
            resource_attributes={"cuda_agent.run": "tr-traced"},
        ),
        set_global=False,
    )
    labels = {"end": "finished", "reward": "3"}
    before = REGISTRY.get_sample_value("cuda_agent_episodes_total", labels) or 0.0
    replies = [call("Bash", command="verify"), "Done."]
    backend = ReplayBackend(replies, codec.tokenizer)

    async def main() -> Trajectory:
        async with SandboxClient(traced_server.url) as client:
            loop = AgentLoop(backend, client, codec, AgentConfig())
            with span(Stage.RUN, run="tr-traced"), span(Stage.STEP, stage="ppo", step=1):
                return await loop.run(TASK, SamplingParams(max_tokens=256), "ep-traced")

    try:
        trajectory = asyncio.run(main())
        assert provider.force_flush()
    finally:
        provider.shutdown()
        tracing_module._provider = saved
    counted = {
        "episodes": (REGISTRY.get_sample_value("cuda_agent_episodes_total", labels) or 0.0) - before,
        "in_flight": REGISTRY.get_sample_value("cuda_agent_episodes_in_flight") or 0.0,
    }
    # The server exports in its own batches: wait for its last request (the session's deletion) and
    # both judge runs' last phase.
    spans = collector.wait_for(
        lambda got: (
            sum(s.name == Stage.PROFILE for s in got) >= 2
            and any(s.name == "DELETE /v1/sessions/{session_id}" for s in got)
        )
    )
    yield trajectory, spans, counted


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{name}: {len(found)} spans"
    return found[0]


def test_one_trace_per_episode_from_the_trainer_into_the_judge_linked_to_its_step(
    episode: tuple[Trajectory, list[ReceivedSpan], dict[str, float]],
) -> None:
    trajectory, spans, _ = episode
    assert trajectory.end == "finished" and trajectory.reward == 3
    by_id = {s.span_id: s for s in spans}

    def parent(s: ReceivedSpan) -> ReceivedSpan:
        assert s.parent_id in by_id, f"{s.name}'s parent was not exported"
        return by_id[s.parent_id]

    run = _one(spans, Stage.RUN)
    assert run.parent_id == ""
    step, episode_span = _one(spans, Stage.STEP), _one(spans, Stage.EPISODE)
    assert parent(step) is run and step.trace_id == run.trace_id
    # The episode is the root of a trace of its own, with a Link to the step that ran it; every other
    # span, the sandbox server's included, is in the episode's trace, which its record names.
    assert episode_span.parent_id == "" and episode_span.trace_id != run.trace_id
    assert episode_span.links == [(step.trace_id, step.span_id)]
    assert trajectory.trace_id == episode_span.trace_id and trajectory.span_id == episode_span.span_id
    others = [s for s in spans if s.name not in (Stage.RUN, Stage.STEP)]
    assert {s.trace_id for s in others} == {episode_span.trace_id}, "the episode's spans are in its trace"
    assert {s.resource["service.name"] for s in others} == {"cuda-agent-trainer", "cuda-agent-sandbox"}
    assert episode_span.attributes["cuda_agent.episode_id"] == "ep-traced"
    assert episode_span.attributes["cuda_agent.reward"] == 3.0
    assert episode_span.attributes["cuda_agent.end"] == "finished"

    turns = [s for s in spans if s.name == Stage.TURN]
    assert len(turns) == 2 and all(parent(t) is episode_span for t in turns)
    generates = [s for s in spans if s.name == Stage.GENERATE]
    assert sorted(parent(g).span_id for g in generates) == sorted(t.span_id for t in turns)

    def through_client(caller: ReceivedSpan, route: str) -> ReceivedSpan:
        """The server's request span under `caller`, through the CLIENT span of OpenTelemetry's aiohttp
        instrumentation, whose attributes follow the stable HTTP semantic conventions."""
        (client,) = [s for s in spans if s.parent_id == caller.span_id and s.kind == CLIENT_SPAN]
        (request,) = [s for s in spans if s.parent_id == client.span_id]
        assert request.kind == SERVER_SPAN and request.name == f"POST {route}"
        session = str(request.attributes["cuda_agent.session_id"])
        assert client.name == "POST" and client.attributes["http.request.method"] == "POST"
        assert str(client.attributes["url.full"]).endswith(route.replace("{session_id}", session))
        assert client.attributes["http.response.status_code"] == 200
        assert client.attributes["server.address"] == "127.0.0.1"
        assert client.resource["service.name"] == "cuda-agent-trainer"
        return request

    # turn 0: the Bash tool call -> its HTTP request -> the server's request span -> the judge run
    # `verify` started over the session's judge channel -> the judge's phases.
    tool_call = _one(spans, Stage.TOOL_CALL)
    assert parent(tool_call) in turns and tool_call.attributes["cuda_agent.tool"] == "bash"
    bash_request = through_client(tool_call, "/v1/sessions/{session_id}/tools/bash")
    assert bash_request.attributes["http.response.status_code"] == 200

    # The episode's end: the agent loop's judge -> POST .../judge -> judge_run (profile) -> phases.
    judge = _one(spans, Stage.JUDGE)
    assert parent(judge) is episode_span and judge.attributes["cuda_agent.reward"] == 3
    judge_request = through_client(judge, "/v1/sessions/{session_id}/judge")

    judge_runs = {parent(s).span_id: s for s in spans if s.name == Stage.JUDGE_RUN}
    assert set(judge_runs) == {bash_request.span_id, judge_request.span_id}
    assert judge_runs[bash_request.span_id].attributes["cuda_agent.stage"] == "verify"
    final = judge_runs[judge_request.span_id]
    assert final.attributes["cuda_agent.stage"] == "profile" and final.attributes["cuda_agent.reward"] == 3
    assert final.attributes["cuda_agent.device"] == "cpu"
    for run_span in judge_runs.values():
        phases = sorted((s for s in spans if s.parent_id == run_span.span_id), key=lambda s: s.start_ns)
        assert [s.name for s in phases] == ["build", "verify", "profile"]
        assert phases[0].attributes["cuda_agent.compiled"] is True
        assert phases[1].attributes["cuda_agent.correct"] is True
        assert phases[2].attributes["cuda_agent.speedup_vs_compile"] == 1.5
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(phases))

    # Session lifecycle requests are children of the episode too (through their CLIENT spans).
    clients = [s for s in spans if s.kind == CLIENT_SPAN and parent(s) is episode_span]
    requests = {s.name for s in spans if s.kind == SERVER_SPAN and parent(s) in clients}
    assert {"POST /v1/sessions", "DELETE /v1/sessions/{session_id}"} <= requests

    # Each side names itself: the trainer's spans and the sandbox pod's, with run / pool / pod.
    trainer, server = run.resource, judge_request.resource
    assert trainer["service.name"] == "cuda-agent-trainer" and trainer["cuda_agent.run"] == "tr-traced"
    assert server["service.name"] == "cuda-agent-sandbox"
    assert server["cuda_agent.pool"] == "pool-a" and server["k8s.pod.name"] == "pool-a-0"
    assert {s.resource["service.name"] for s in judge_runs.values()} == {"cuda-agent-sandbox"}


def test_trainer_counts_the_episode(episode: tuple[Trajectory, list[ReceivedSpan], dict[str, float]]) -> None:
    _, _, counted = episode
    assert counted == {"episodes": 1.0, "in_flight": 0.0}


def test_server_metrics_parse_and_count_the_episode(
    episode: tuple[Trajectory, list[ReceivedSpan], dict[str, float]], traced_server: RunningServer
) -> None:
    with urllib.request.urlopen(traced_server.url + "/metrics", timeout=30) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    assert content_type.startswith("text/plain")
    parsed = list(text_string_to_metric_families(text))
    families = {f.name: f for f in parsed}
    assert len(families) == len(parsed), "two families share a name"

    def sample(family: str, name: str, **labels: str) -> float:
        values = [s.value for s in families[family].samples if s.name == name and s.labels == labels]
        assert len(values) == 1, (name, labels, families[family].samples)
        return values[0]

    p = "cuda_agent_sandbox_"
    assert families[p + "tool_calls"].type == "counter"
    # The workspace read at the start of the episode, then the agent's `verify`.
    assert sample(p + "tool_calls", p + "tool_calls_total", outcome="ok", tool="bash") == 2
    assert sample(p + "judge_runs", p + "judge_runs_total", outcome="reward3", stage="verify") == 1
    assert sample(p + "judge_runs", p + "judge_runs_total", outcome="reward3", stage="profile") == 1
    assert families[p + "judge_run_seconds"].type == "histogram"
    assert sample(p + "judge_run_seconds", p + "judge_run_seconds_count", stage="profile") == 1
    assert sample(p + "judge_queue_wait_seconds", p + "judge_queue_wait_seconds_count") == 2
    assert sample(p + "sessions_created", p + "sessions_created_total") == 1
    assert families[p + "queued_judge_jobs"].type == "gauge"
    assert sample(p + "queued_judge_jobs", p + "queued_judge_jobs") == 0
    assert sample(p + "judge_runs_in_flight", p + "judge_runs_in_flight") == 0
    assert sample(p + "active_sessions", p + "active_sessions") == 0
    assert sample(p + "judge_intact", p + "judge_intact") == 1

    # A Prometheus that asks for OpenMetrics gets it, and it parses as OpenMetrics.
    request = urllib.request.Request(
        traced_server.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        openmetrics = {f.name: f for f in openmetrics_families(response.read().decode())}  # type: ignore[no-untyped-call]
    calls = [s for s in openmetrics[p + "tool_calls"].samples if s.name == p + "tool_calls_total"]
    assert {(s.labels["tool"], s.labels["outcome"], s.value) for s in calls} == {("bash", "ok", 2.0)}
