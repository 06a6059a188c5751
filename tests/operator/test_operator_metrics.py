"""The operator's /metrics: controller-runtime's names for reconciles and the work queue, and the
operator's own families only.

cuda_agent.telemetry (which the operator imports for logs and traces) registers the trainer's and the agent
loop's families in prometheus_client's default registry; served from there, the operator exported them as
constant zeros. The operator now serves a registry of its own: scraped here over HTTP from the same
`serve_metrics` call the operator's startup makes, with a real WorkQueue read at scrape time as the
operator's startup wires it (`watch_queue`, `WorkQueueMetrics`)."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

import cuda_agent.telemetry  # noqa: F401  (the trainer's families, registered in the default registry)
from cuda_agent.operator import labels as lb
from cuda_agent.operator import metrics
from cuda_agent.operator.kube import Kube, KubeError, Ref
from cuda_agent.operator.workqueue import Key, WorkQueue
from cuda_agent.telemetry.metrics import serve_metrics

# What controller-runtime's dashboards and alerts query (kube-prometheus, Operator SDK).
CONTROLLER_RUNTIME = {
    "controller_runtime_reconcile": "counter",
    "controller_runtime_reconcile_errors": "counter",
    "controller_runtime_reconcile_time_seconds": "histogram",
    "controller_runtime_active_workers": "gauge",
    "controller_runtime_max_concurrent_reconciles": "gauge",
    "workqueue_depth": "gauge",
    # client-go's work-queue families (controller-runtime registers them for its queues)
    "workqueue_adds": "counter",
    "workqueue_retries": "counter",
    "workqueue_queue_duration_seconds": "histogram",
    "workqueue_work_duration_seconds": "histogram",
    "workqueue_unfinished_work_seconds": "gauge",
    "workqueue_longest_running_processor_seconds": "gauge",
}

# client-go's rest client families, for the operator's own requests to the apiserver.
REST_CLIENT = {
    "rest_client_requests": "counter",
    "rest_client_request_duration_seconds": "histogram",
}


def scrape() -> str:
    server = serve_metrics(0, host="127.0.0.1", registry=metrics.REGISTRY)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    finally:
        server.shutdown()


def test_controller_runtime_names_per_controller() -> None:
    queue = WorkQueue(settle=3600.0)  # keys stay dirty: no worker runs here

    async def mark_dirty() -> None:
        for key in [(lb.RUN_KIND, "ns", "a"), (lb.RUN_KIND, "ns", "b"), (lb.POOL_KIND, "ns", "p")]:
            queue.add(key)

    asyncio.run(mark_dirty())
    metrics.watch_queue([lb.POOL_KIND, lb.RUN_KIND], 4, queue)
    metrics.RECONCILES.labels("trainingrun", metrics.SUCCESS).inc()
    metrics.RECONCILES.labels("trainingrun", metrics.REQUEUE_AFTER).inc()
    metrics.RECONCILES.labels("sandboxpool", metrics.ERROR).inc()
    metrics.RECONCILE_ERRORS.labels("sandboxpool").inc()
    metrics.RECONCILE_SECONDS.labels("trainingrun").observe(0.02)

    families = {f.name: f for f in text_string_to_metric_families(scrape())}
    assert {name: families[name].type for name in CONTROLLER_RUNTIME} == CONTROLLER_RUNTIME

    def value(sample: str, /, **labels: str) -> float:
        found = [
            s.value for f in families.values() for s in f.samples if s.name == sample and s.labels == labels
        ]
        assert len(found) == 1, (sample, labels)
        return found[0]

    assert value("controller_runtime_reconcile_total", controller="trainingrun", result="success") >= 1
    assert value("controller_runtime_reconcile_total", controller="trainingrun", result="requeue_after") >= 1
    assert value("controller_runtime_reconcile_total", controller="sandboxpool", result="error") >= 1
    assert value("controller_runtime_reconcile_errors_total", controller="sandboxpool") >= 1
    assert value("controller_runtime_reconcile_time_seconds_count", controller="trainingrun") >= 1
    assert value("workqueue_depth", name="trainingrun") == 2
    assert value("workqueue_depth", name="sandboxpool") == 1
    assert value("controller_runtime_active_workers", controller="trainingrun") == 0
    assert value("controller_runtime_max_concurrent_reconciles", controller="sandboxpool") == 4


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def read(scraped: Samples, sample: str, name: str) -> float:
    return scraped.get((sample, (("name", name),)), 0.0)


def test_work_queue_families_follow_the_real_queue() -> None:
    """A real WorkQueue with the operator's WorkQueueMetrics and two workers, read from /metrics text: a
    run key added five times before its pass is one add, one wait and one pass; while that pass runs the
    unfinished-work and longest-running gauges count its seconds, and both are 0 once it ends. A pool key
    whose first pass handles its error (`failed`) and second raises is retried twice: three adds, three
    passes."""
    run: Key = (lb.RUN_KIND, "ns", "wq-run")
    pool: Key = (lb.POOL_KIND, "ns", "wq-pool")
    settle, run_pass = 0.05, 0.4

    async def scenario() -> tuple[Samples, Samples, Samples]:
        queue = WorkQueue(settle=settle, failure_base=0.01, metrics=metrics.WorkQueueMetrics())
        metrics.watch_queue([lb.POOL_KIND, lb.RUN_KIND], 2, queue)
        before = samples(await asyncio.to_thread(scrape))
        queue.open()
        pool_passes = [0]
        running = asyncio.Event()

        async def reconcile(key: Key) -> float | None:
            if key == run:
                running.set()
                await asyncio.sleep(run_pass)
                return None
            pool_passes[0] += 1
            if pool_passes[0] == 1:
                return queue.failed(key)  # e.g. a refused apply, reported in the status
            if pool_passes[0] == 2:
                raise RuntimeError("apiserver went away")
            return None

        workers = [asyncio.create_task(queue.work(reconcile)) for _ in range(2)]
        for _ in range(5):
            queue.add(run)
        queue.add(pool)
        await running.wait()
        await asyncio.sleep(run_pass / 2)
        during = samples(await asyncio.to_thread(scrape))
        await asyncio.sleep(run_pass)
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        queue.cancel_timers()
        return before, during, samples(scrape())

    before, during, after = asyncio.run(scenario())

    def delta(sample: str, name: str) -> float:
        return read(after, sample, name) - read(before, sample, name)

    assert read(during, "workqueue_unfinished_work_seconds", "trainingrun") >= run_pass / 2
    assert read(during, "workqueue_longest_running_processor_seconds", "trainingrun") >= run_pass / 2
    assert read(after, "workqueue_unfinished_work_seconds", "trainingrun") == 0
    assert read(after, "workqueue_longest_running_processor_seconds", "trainingrun") == 0
    assert delta("workqueue_adds_total", "trainingrun") == 1  # five adds before the pass: one key
    assert delta("workqueue_queue_duration_seconds_count", "trainingrun") == 1
    assert delta("workqueue_queue_duration_seconds_sum", "trainingrun") >= settle  # waited out the settle
    assert delta("workqueue_work_duration_seconds_count", "trainingrun") == 1
    assert delta("workqueue_work_duration_seconds_sum", "trainingrun") >= run_pass
    assert delta("workqueue_retries_total", "trainingrun") == 0
    assert delta("workqueue_retries_total", "sandboxpool") == 2  # the handled error and the raise
    assert delta("workqueue_adds_total", "sandboxpool") == 3  # the event and two retries
    assert delta("workqueue_work_duration_seconds_count", "sandboxpool") == 3
    assert delta("workqueue_queue_duration_seconds_count", "sandboxpool") == 3
    # client-go's buckets: 10 ns to 10 s, tenfold
    buckets = sorted(
        float(dict(labels)["le"])
        for (sample, labels) in after
        if sample == "workqueue_work_duration_seconds_bucket" and ("name", "trainingrun") in labels
    )
    assert buckets == [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, float("inf")]


def test_operator_endpoint_serves_operator_and_process_families_only() -> None:
    names = {family.name for family in text_string_to_metric_families(scrape())}
    ours = {*CONTROLLER_RUNTIME, *REST_CLIENT, "cuda_agent_operator_queued_trainingruns"}
    assert ours <= names
    assert "process_cpu_seconds" in names  # the process's own collectors, as any exporter serves
    # (the text format lists a counter's and a histogram's `_created` samples as families of their own)
    ours_listed = {n for n in names if n.removesuffix("_created") in ours}
    foreign = sorted(n for n in names if n.startswith("cuda_agent_") and n not in ours_listed)
    assert foreign == []  # no cuda_agent_trainer_* / cuda_agent_episode* zeros
    assert not any(n.startswith("cuda_agent_operator_reconcile") for n in names)  # the old names are gone


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_rest_client_families_count_the_operators_api_requests(tmp_path: Path) -> None:
    """`Kube.connect` (the operator's API client, from a kubeconfig) against a stand-in apiserver on
    127.0.0.1: an aiohttp app rather than the local control plane, because a 500 and a refused connection
    are what this checks besides 200 and 404 (the cluster test reads these families from a real operator).
    Each request counts once under client-go's names, by code, method and host:port; a request that got
    no answer is code `<error>`; the latency histogram has client-go's buckets."""

    async def config_map(request: web.Request) -> web.Response:
        if request.match_info["name"] == "present":
            return web.json_response({"kind": "ConfigMap", "metadata": {"name": "present"}})
        return web.json_response({"kind": "Status", "message": "not found"}, status=404)

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "message": "etcd is down"}, status=500)

    async def scenario() -> tuple[str, str, Samples, Samples]:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/ns/configmaps/{name}", config_map)
        app.router.add_patch("/api/v1/namespaces/ns/configmaps/{name}", refuse)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        with socket.socket() as closed:  # a port nothing listens on
            closed.bind(("127.0.0.1", 0))
            gone = closed.getsockname()[1]
        before = samples(await asyncio.to_thread(scrape))
        kube = await Kube.connect(kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}"))
        unreachable = await Kube.connect(kubeconfig(tmp_path / "gone", f"http://127.0.0.1:{gone}"))
        try:
            assert await kube.get(Ref("ConfigMap", "ns", "present")) is not None
            assert await kube.get(Ref("ConfigMap", "ns", "present")) is not None
            assert await kube.get(Ref("ConfigMap", "ns", "missing")) is None
            with pytest.raises(KubeError, match="etcd is down"):
                await kube.merge_patch(Ref("ConfigMap", "ns", "present"), {"data": {"a": "b"}})
            with pytest.raises(aiohttp.ClientConnectionError):
                await unreachable.get(Ref("ConfigMap", "ns", "present"))
        finally:
            await kube.close()
            await unreachable.close()
            await runner.cleanup()
        return f"127.0.0.1:{port}", f"127.0.0.1:{gone}", before, samples(await asyncio.to_thread(scrape))

    host, gone, before, after = asyncio.run(scenario())

    def delta(sample: str, **labels: str) -> float:
        key = (sample, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("rest_client_requests_total", code="200", method="GET", host=host) == 2
    assert delta("rest_client_requests_total", code="404", method="GET", host=host) == 1
    assert delta("rest_client_requests_total", code="500", method="PATCH", host=host) == 1
    assert delta("rest_client_requests_total", code="<error>", method="GET", host=gone) == 1
    assert delta("rest_client_request_duration_seconds_count", verb="GET", host=host) == 3
    assert delta("rest_client_request_duration_seconds_count", verb="PATCH", host=host) == 1
    assert delta("rest_client_request_duration_seconds_count", verb="GET", host=gone) == 1
    buckets = sorted(
        float(dict(labels)["le"])
        for (sample, labels) in after
        if sample == "rest_client_request_duration_seconds_bucket"
        and ("host", host) in labels
        and ("verb", "GET") in labels
    )
    assert buckets == [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, float("inf")]
