"""The operator's /metrics: controller-runtime's names for reconciles and the work queue, and the
operator's own families only.

cuda_agent.telemetry (which the operator imports for logs and traces) registers the trainer's and the agent
loop's families in prometheus_client's default registry; served from there, the operator exported them as
constant zeros. The operator now serves a registry of its own: scraped here over HTTP from the same
`serve_metrics` call the operator's startup makes, with a real WorkQueue read at scrape time as the
operator's startup wires it (`watch_queue`)."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import cuda_agent.telemetry  # noqa: F401  (the trainer's families, registered in the default registry)
from cuda_agent.operator import labels as lb
from cuda_agent.operator import metrics
from cuda_agent.operator.workqueue import WorkQueue
from cuda_agent.telemetry.metrics import serve_metrics

# What controller-runtime's dashboards and alerts query (kube-prometheus, Operator SDK).
CONTROLLER_RUNTIME = {
    "controller_runtime_reconcile": "counter",
    "controller_runtime_reconcile_errors": "counter",
    "controller_runtime_reconcile_time_seconds": "histogram",
    "controller_runtime_active_workers": "gauge",
    "controller_runtime_max_concurrent_reconciles": "gauge",
    "workqueue_depth": "gauge",
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
    metrics.watch_queue([lb.POOL_KIND, lb.RUN_KIND], 4, queue.depth_of, queue.active_of)
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


def test_operator_endpoint_serves_operator_and_process_families_only() -> None:
    names = {family.name for family in text_string_to_metric_families(scrape())}
    ours = {*CONTROLLER_RUNTIME, "cuda_agent_operator_queued_trainingruns"}
    assert ours <= names
    assert "process_cpu_seconds" in names  # the process's own collectors, as any exporter serves
    # (the text format lists a counter's and a histogram's `_created` samples as families of their own)
    ours_listed = {n for n in names if n.removesuffix("_created") in ours}
    foreign = sorted(n for n in names if n.startswith("cuda_agent_") and n not in ours_listed)
    assert foreign == []  # no cuda_agent_trainer_* / cuda_agent_episode* zeros
    assert not any(n.startswith("cuda_agent_operator_reconcile") for n in names)  # the old names are gone
