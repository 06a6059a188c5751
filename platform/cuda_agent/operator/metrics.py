"""The operator's own Prometheus metrics, served on `--metrics-port` (0: off) at /metrics.

Reconcile passes by kind and outcome, their durations, the work queue's depth and the TrainingRuns held
in phase Queued (waiting for their whole gang of GPUs): what tells a platform team whether the operator
keeps up and whether runs are waiting for capacity.

They live in a registry of their own (with the process's own collectors), not prometheus_client's default
one: the operator imports cuda_agent.telemetry, whose trainer and agent-loop families register in the
default registry, and those must not appear here as constant zeros. Each process serves its own families
(the trainer's on CUDA_AGENT_METRICS_PORT, a sandbox server's on its --metrics-port).
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

REGISTRY = CollectorRegistry()
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

RECONCILES = Counter(
    "cuda_agent_operator_reconciles",
    "Reconcile passes, by kind (SandboxPool, TrainingRun) and result (ok, error).",
    ["kind", "result"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "cuda_agent_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass.",
    ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "cuda_agent_operator_workqueue_depth", "Objects marked dirty, waiting for a pass.", registry=REGISTRY
)
QUEUED_RUNS = Gauge(
    "cuda_agent_operator_queued_trainingruns",
    "TrainingRuns in phase Queued (their GPU gang does not fit).",
    registry=REGISTRY,
)
