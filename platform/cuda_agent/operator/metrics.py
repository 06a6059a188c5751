"""The operator's own Prometheus metrics, served on `--metrics-port` (0: off) at /metrics.

Reconcile passes by kind and outcome, their durations, the work queue's depth and the TrainingRuns held
in phase Queued (waiting for their whole gang of GPUs): what tells a platform team whether the operator
keeps up and whether runs are waiting for capacity.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "cuda_agent_operator_reconciles",
    "Reconcile passes, by kind (SandboxPool, TrainingRun) and result (ok, error).",
    ["kind", "result"],
)
RECONCILE_SECONDS = Histogram(
    "cuda_agent_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
QUEUE_DEPTH = Gauge("cuda_agent_operator_workqueue_depth", "Objects marked dirty, waiting for a pass.")
QUEUED_RUNS = Gauge(
    "cuda_agent_operator_queued_trainingruns", "TrainingRuns in phase Queued (their GPU gang does not fit)."
)
