"""The operator's own Prometheus metrics, served on `--metrics-port` (0: off) at /metrics.

Reconcile passes, their durations and the work queue carry the names controller-runtime exports
(`controller_runtime_reconcile_total{controller,result}`, `controller_runtime_reconcile_errors_total`,
`controller_runtime_reconcile_time_seconds`, `controller_runtime_active_workers`,
`controller_runtime_max_concurrent_reconciles`) and client-go's work-queue families (`workqueue_depth`,
`workqueue_adds_total`, `workqueue_retries_total`, `workqueue_queue_duration_seconds`,
`workqueue_work_duration_seconds`, `workqueue_unfinished_work_seconds`,
`workqueue_longest_running_processor_seconds`, each by `name`), so the dashboards and alerts written for Go
operators (kube-prometheus, the Operator SDK's) read this one unchanged. A controller is a kind, named as
controller-runtime names it by default: the lowercase kind (`trainingrun`, `sandboxpool`); the work
queue's `name` label is the controller's (one queue serves both kinds; each key is counted under its
kind). Besides them, the TrainingRuns held in phase Queued (waiting for their whole gang of GPUs): whether
runs are waiting for capacity.

They live in a registry of their own (with the process's own collectors), not prometheus_client's default
one: the operator imports cuda_agent.telemetry, whose trainer and agent-loop families register in the
default registry, and those must not appear here as constant zeros. Each process serves its own families
(the trainer's on CUDA_AGENT_METRICS_PORT, a sandbox server's on its --metrics-port).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import Protocol

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

# controller-runtime's reconcile results: a pass that returned nothing, one that asked to be run again
# after a delay (RequeueAfter), one that raised.
SUCCESS, REQUEUE_AFTER, ERROR = "success", "requeue_after", "error"
# controller-runtime's reconcile_time_seconds buckets (pkg/internal/controller/metrics).
RECONCILE_BUCKETS = (
    *(0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
    *(1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0),
    *(30.0, 40.0, 50.0, 60.0),
)

RECONCILES = Counter(
    "controller_runtime_reconcile",
    "Total number of reconciliations per controller (result: success, requeue_after, error).",
    ["controller", "result"],
    registry=REGISTRY,
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors",
    "Total number of reconciliation errors per controller.",
    ["controller"],
    registry=REGISTRY,
)
RECONCILE_SECONDS = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller.",
    ["controller"],
    buckets=RECONCILE_BUCKETS,
    registry=REGISTRY,
)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers",
    "Number of currently used workers per controller.",
    ["controller"],
    registry=REGISTRY,
)
MAX_CONCURRENT_RECONCILES = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller (the workers are shared by both kinds).",
    ["controller"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "workqueue_depth",
    "Current depth of workqueue: objects marked dirty, waiting for a pass.",
    ["name"],
    registry=REGISTRY,
)
# client-go's workqueue histograms: ExponentialBuckets(10e-9, 10, 10), 10 ns to 10 s.
WORKQUEUE_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
QUEUE_ADDS = Counter(
    "workqueue_adds",
    "Total number of adds handled by workqueue",
    ["name"],
    registry=REGISTRY,
)
QUEUE_RETRIES = Counter(
    "workqueue_retries",
    "Total number of retries handled by workqueue",
    ["name"],
    registry=REGISTRY,
)
QUEUE_LATENCY = Histogram(
    "workqueue_queue_duration_seconds",
    "How long in seconds an item stays in workqueue before being requested.",
    ["name"],
    buckets=WORKQUEUE_BUCKETS,
    registry=REGISTRY,
)
WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "How long in seconds processing an item from workqueue takes.",
    ["name"],
    buckets=WORKQUEUE_BUCKETS,
    registry=REGISTRY,
)
UNFINISHED_WORK = Gauge(
    "workqueue_unfinished_work_seconds",
    "How many seconds of work has been done that is in progress and hasn't been observed by "
    "work_duration. Large values indicate stuck threads.",
    ["name"],
    registry=REGISTRY,
)
LONGEST_RUNNING = Gauge(
    "workqueue_longest_running_processor_seconds",
    "How many seconds has the longest running processor for workqueue been running.",
    ["name"],
    registry=REGISTRY,
)
# client-go's rest_client families (k8s.io/component-base/metrics/prometheus/restclient): every HTTP
# request the operator's API client sends, by status code ("<error>" when no answer came), method and
# apiserver host:port; its latency by verb (the method) and host, with client-go's buckets.
REST_REQUESTS = Counter(
    "rest_client_requests",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ["code", "method", "host"],
    registry=REGISTRY,
)
REST_LATENCY = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb, and host.",
    ["verb", "host"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
    registry=REGISTRY,
)
REST_ERROR_CODE = "<error>"
QUEUED_RUNS = Gauge(
    "cuda_agent_operator_queued_trainingruns",
    "TrainingRuns in phase Queued (their GPU gang does not fit).",
    registry=REGISTRY,
)


def controller_name(kind: str) -> str:
    """controller-runtime's default controller name for a kind: the kind in lower case."""
    return kind.lower()


def reconcile_result(requeue: float | None) -> str:
    return SUCCESS if requeue is None else REQUEUE_AFTER


def rest_request_done(method: str, host: str, code: int | None, seconds: float) -> None:
    """One HTTP request to the apiserver: answered with `code`, or None when none came (refused, reset,
    timed out)."""
    REST_REQUESTS.labels(REST_ERROR_CODE if code is None else str(code), method, host).inc()
    REST_LATENCY.labels(method, host).observe(seconds)


class QueueReadings(Protocol):
    """What a scrape reads from the work queue, per kind (cuda_agent.operator.workqueue.WorkQueue)."""

    def depth_of(self, kind: str) -> int: ...

    def active_of(self, kind: str) -> int: ...

    def unfinished_work_of(self, kind: str) -> float: ...

    def longest_running_of(self, kind: str) -> float: ...


class WorkQueueMetrics:
    """The work queue's reports (its `metrics`) as client-go's workqueue families, under the key's
    controller."""

    def added(self, key: tuple[str, str, str]) -> None:
        QUEUE_ADDS.labels(controller_name(key[0])).inc()

    def retried(self, key: tuple[str, str, str]) -> None:
        QUEUE_RETRIES.labels(controller_name(key[0])).inc()

    def picked(self, key: tuple[str, str, str], waited: float) -> None:
        QUEUE_LATENCY.labels(controller_name(key[0])).observe(waited)

    def done(self, key: tuple[str, str, str], worked: float) -> None:
        WORK_DURATION.labels(controller_name(key[0])).observe(worked)


def watch_queue(kinds: Iterable[str], workers: int, queue: QueueReadings) -> None:
    """Read the work queue at scrape time, per controller: its depth, the workers in a pass over the
    kind, the seconds of work in progress and the oldest pass's age, and the most workers it may use (the
    operator's shared `--workers`). The counters and histograms start at zero for each controller, as
    client-go's do once a queue exists, so a rate over them is 0, not absent, before the first event."""
    for kind in kinds:
        name = controller_name(kind)
        QUEUE_DEPTH.labels(name).set_function(partial(queue.depth_of, kind))
        ACTIVE_WORKERS.labels(name).set_function(partial(queue.active_of, kind))
        UNFINISHED_WORK.labels(name).set_function(partial(queue.unfinished_work_of, kind))
        LONGEST_RUNNING.labels(name).set_function(partial(queue.longest_running_of, kind))
        MAX_CONCURRENT_RECONCILES.labels(name).set(workers)
        for family in (QUEUE_ADDS, QUEUE_RETRIES, QUEUE_LATENCY, WORK_DURATION):
            family.labels(name)
