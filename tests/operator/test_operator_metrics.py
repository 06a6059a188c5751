"""The operator's /metrics holds its own families only.

cuda_agent.telemetry (which the operator imports for logs and traces) registers the trainer's and the agent
loop's families in prometheus_client's default registry; served from there, the operator exported them as
constant zeros. The operator now serves a registry of its own: scraped here over HTTP from the same
`serve_metrics` call the operator's startup makes."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

import cuda_agent.telemetry  # noqa: F401  (the trainer's families, registered in the default registry)
from cuda_agent.operator import metrics
from cuda_agent.telemetry.metrics import serve_metrics


def test_operator_endpoint_serves_operator_and_process_families_only() -> None:
    metrics.RECONCILES.labels("TrainingRun", "ok").inc()
    server = serve_metrics(0, host="127.0.0.1", registry=metrics.REGISTRY)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            names = {family.name for family in text_string_to_metric_families(response.read().decode())}
    finally:
        server.shutdown()
    ours = {
        "cuda_agent_operator_reconciles",
        "cuda_agent_operator_reconcile_duration_seconds",
        "cuda_agent_operator_workqueue_depth",
        "cuda_agent_operator_queued_trainingruns",
    }
    assert ours <= names
    assert "process_cpu_seconds" in names  # the process's own collectors, as any exporter serves
    # (the text format lists a counter's and a histogram's `_created` samples as families of their own)
    ours_listed = {n for n in names if n.removesuffix("_created") in ours}
    foreign = sorted(n for n in names if n.startswith("cuda_agent_") and n not in ours_listed)
    assert foreign == []  # no cuda_agent_trainer_* / cuda_agent_episode* zeros
