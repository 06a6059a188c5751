"""CLIENT spans of the HTTP requests that were not traced before: `SyncSandboxClient` (urllib; spans it
makes itself) and the operator's own requests (aiohttp, OpenTelemetry's client instrumentation): its
probe of sandbox pods' /v1/status and its API client.

The sandbox client's requests go to a real sandbox server (fake judge, tests/sandbox) exporting OTLP to an
in-process collector: each request's `traceparent` must arrive there, as the parent of the server's
request span. The operator's API client talks to a stand-in apiserver (aiohttp on 127.0.0.1) that keeps
the `traceparent` each request carried: the local control plane's apiserver does not export traces, so
only a stand-in can show what arrived. This process's spans are read from an InMemorySpanExporter."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import urllib.error
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from otlp_collector import OtlpCollector

sys.path.insert(0, str(Path(__file__).parents[1] / "agent"))

from agent_helpers import start_sandbox
from sandbox_helpers import RunningServer, cleanup

from cuda_agent.operator.demand import ProbeSettings, probe_pods
from cuda_agent.operator.kube import Kube, Ref
from cuda_agent.operator.views import PodView
from cuda_agent.sandbox.client import SandboxError, SyncSandboxClient
from cuda_agent.telemetry import Stage, TelemetryConfig, configure_tracing, span
from cuda_agent.telemetry import tracing as tracing_module

TASK_SOURCE = (Path(__file__).parents[2] / "examples" / "tasks" / "relu_mul_add.py").read_text()
SERVER_SPAN = ProtoSpan.SpanKind.SPAN_KIND_SERVER


@pytest.fixture(scope="module")
def traced_server(collector: OtlpCollector) -> Iterator[RunningServer]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    running = start_sandbox(env=env)
    try:
        yield running
    finally:
        cleanup(running)


@pytest.fixture
def memory() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    """This process's spans, in memory; the global provider and the module's are left as they were."""
    saved = tracing_module._provider
    tracing_module._provider = None
    exporter = InMemorySpanExporter()
    provider = configure_tracing(
        TelemetryConfig(service_name="cuda-agent-test", traces_exporter="none"),
        processors=[SimpleSpanProcessor(exporter)],
        set_global=False,
    )
    try:
        yield exporter, provider
    finally:
        provider.shutdown()
        tracing_module._provider = saved


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def client_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]


def hex_id(value: int) -> str:
    return f"{value:016x}"


def test_sync_sandbox_client_requests_are_client_spans_that_parent_the_servers_spans(
    memory: tuple[InMemorySpanExporter, TracerProvider],
    traced_server: RunningServer,
    collector: OtlpCollector,
) -> None:
    exporter, _ = memory
    client = SyncSandboxClient(traced_server.url)
    gone = closed_port()
    with span(Stage.RUN, run="sync-client") as run:
        session = client.create_session(TASK_SOURCE, name="relu_mul_add")
        client.delete_session(session.session_id)
        with pytest.raises(SandboxError):
            client.get_session("no-such-session")
        client.status()
        with pytest.raises(urllib.error.URLError):
            SyncSandboxClient(f"http://127.0.0.1:{gone}", timeout_s=5).status()

    spans = client_spans(exporter)
    assert [s.name for s in spans] == ["POST", "DELETE", "GET", "GET", "GET"]
    create, delete, missing, status, refused = spans
    port = int(traced_server.url.rsplit(":", 1)[1])
    for one in spans:
        assert one.parent is not None and one.parent.span_id == run.get_span_context().span_id
        assert one.attributes is not None
        assert one.attributes["http.request.method"] == one.name
        assert one.attributes["server.address"] == "127.0.0.1"
    assert create.attributes == {
        "http.request.method": "POST",
        "url.full": f"{traced_server.url}/v1/sessions",
        "server.address": "127.0.0.1",
        "server.port": port,
        "http.response.status_code": 201,  # the session was created
    }
    assert create.status.status_code == StatusCode.UNSET
    assert delete.attributes is not None and missing.attributes is not None
    assert delete.attributes["url.full"] == f"{traced_server.url}/v1/sessions/{session.session_id}"
    assert missing.attributes["http.response.status_code"] == 404
    assert missing.attributes["error.type"] == "404" and missing.status.status_code == StatusCode.ERROR
    assert status.attributes is not None and status.attributes["url.full"] == f"{traced_server.url}/v1/status"
    assert refused.attributes is not None and refused.attributes["server.port"] == gone
    assert "http.response.status_code" not in refused.attributes
    assert refused.attributes["error.type"] == "URLError" and refused.status.status_code == StatusCode.ERROR
    assert [event.name for event in refused.events] == ["exception"]

    # Each request's traceparent arrived: the server's request span is the CLIENT span's child, in the
    # caller's trace (/v1/status is not traced by the server).
    traced = (create, delete, missing)
    wanted = {hex_id(s.get_span_context().span_id) for s in traced}
    received = collector.wait_for(
        lambda got: wanted <= {s.parent_id for s in got if s.kind == SERVER_SPAN}, timeout_s=30
    )
    for client_span in traced:
        child = [s for s in received if s.parent_id == hex_id(client_span.get_span_context().span_id)]
        assert len(child) == 1 and child[0].kind == SERVER_SPAN
        assert child[0].trace_id == f"{client_span.get_span_context().trace_id:032x}"
        assert child[0].attributes["http.request.method"] == client_span.name


def test_the_operators_http_requests_are_client_spans_of_its_pass(
    memory: tuple[InMemorySpanExporter, TracerProvider], traced_server: RunningServer, tmp_path: Path
) -> None:
    """A pool pass's probe of a pod's /v1/status (the real sandbox server, through an endpoint map) and
    the API client's GET (the stand-in apiserver) are CLIENT spans under the reconcile span, and the
    apiserver received the CLIENT span's traceparent."""
    exporter, _ = memory
    arrived: list[str] = []

    async def config_map(request: web.Request) -> web.Response:
        arrived.append(request.headers.get("traceparent", ""))
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "present"}})

    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({"ns/pool-0": traced_server.url}))
    pod = PodView("pool-0", "Running", True, "10.0.0.1", None, None, False, ())
    config = tmp_path / "kubeconfig"

    async def scenario() -> tuple[int, str, int]:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns/configmaps/{name}", config_map)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {"token": "t"}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        kube = await Kube.connect(config)
        try:
            with span(Stage.RECONCILE, resource="SandboxPool", namespace="ns", name="pool") as current:
                loads = await probe_pods("ns", [pod], 8470, ProbeSettings(endpoint_map=endpoints))
                assert await kube.get(Ref("ConfigMap", "ns", "present")) is not None
        finally:
            await kube.close()
            await runner.cleanup()
        assert loads[0].active_sessions is not None  # the pod answered
        return port, hex_id(current.get_span_context().trace_id), current.get_span_context().span_id

    apiserver_port, _, reconcile_id = asyncio.run(scenario())
    probe, api_get = client_spans(exporter)
    for one in (probe, api_get):
        assert one.name == "GET"
        assert one.parent is not None and one.parent.span_id == reconcile_id
        assert one.attributes is not None and one.attributes["http.response.status_code"] == 200
        assert one.attributes["http.request.method"] == "GET"
    assert probe.attributes is not None and api_get.attributes is not None
    assert probe.attributes["url.full"] == f"{traced_server.url}/v1/status"
    assert api_get.attributes["url.full"] == (
        f"http://127.0.0.1:{apiserver_port}/api/v1/namespaces/ns/configmaps/present"
    )
    assert (api_get.attributes["server.address"], api_get.attributes["server.port"]) == (
        "127.0.0.1",
        apiserver_port,
    )
    context = api_get.get_span_context()
    flags = int(context.trace_flags)
    assert arrived == [f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"]
