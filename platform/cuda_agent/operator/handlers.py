"""Kopf wiring: what the operator watches, and how a watch event becomes a reconcile pass.

Handlers are tiny and async (no thread hop per event): indexes keep small views of the watched objects
in memory, and every event only marks its owner dirty in the work queue. The reconcilers run from the
queue's workers, so the objects carry no Kopf finalizers (no daemons, timers or deletion handlers):
deleting a pool or run while the operator is down still completes; owner references remove children.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

import kopf

from cuda_agent.operator import labels as lb
from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.context import OperatorContext, RunExecutor
from cuda_agent.operator.events import Event, post
from cuda_agent.operator.executor import ClusterExecutor
from cuda_agent.operator.kube import Kube, Manifest
from cuda_agent.operator.local_executor import LocalExecutor
from cuda_agent.operator.metrics import (
    ERROR,
    QUEUED_RUNS,
    RECONCILE_ERRORS,
    RECONCILE_SECONDS,
    RECONCILES,
    REGISTRY,
    WorkQueueMetrics,
    controller_name,
    reconcile_result,
    watch_queue,
)
from cuda_agent.operator.pool_reconciler import reconcile_pool
from cuda_agent.operator.run_reconciler import reconcile_run
from cuda_agent.operator.views import ChildView, PodView
from cuda_agent.operator.workqueue import Key, WorkQueue
from cuda_agent.telemetry.metrics import serve_metrics
from cuda_agent.telemetry.tracing import Stage, span

log = logging.getLogger(__name__)

OWNERS: dict[str, tuple[str, str, str]] = {
    lb.POOL_KIND: (lb.GROUP, lb.VERSION, lb.POOL_PLURAL),
    lb.RUN_KIND: (lb.GROUP, lb.VERSION, lb.RUN_PLURAL),
}
# Children besides pods: kind -> (group, version, plural). RayCluster is watched once its CRD exists.
CHILDREN: dict[str, tuple[str, str, str]] = {
    "StatefulSet": ("apps", "v1", "statefulsets"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "RayCluster": ("ray.io", "v1", "rayclusters"),
}
# Children are filtered by this label on the server (settings.watching.label_selectors), not by
# handler filters: Kopf would evaluate those on every event of every pod.
MANAGED_SELECTOR = f"{lb.MANAGED_BY}={lb.MANAGED_BY_VALUE}"


def _owner_key(labels: kopf.Labels, namespace: str | None) -> Key | None:
    owner = lb.owner_of(labels)
    return (owner[0], namespace, owner[1]) if owner and namespace else None


def _owner_indexer(kind: str) -> Callable[..., Awaitable[dict[Key, Manifest]]]:
    async def index_owner(body: kopf.Body, namespace: str, name: str, **_: Any) -> dict[Key, Manifest]:
        return {(kind, namespace, name): {**copy.deepcopy(dict(body)), "kind": kind}}

    return index_owner


def _child_indexer(kind: str) -> Callable[..., Awaitable[dict[Key, ChildView]]]:
    async def index_child(
        body: kopf.Body, labels: kopf.Labels, namespace: str | None, **_: Any
    ) -> dict[Key, ChildView]:
        key = _owner_key(labels, namespace)
        return {key: ChildView.of({**body, "kind": kind})} if key else {}

    return index_child


async def index_pod(
    body: kopf.Body, labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any
) -> dict[Key, PodView]:
    """Index the pod and mark its owner dirty: a pod changing is exactly when its owner needs a look.
    Doing it here, not in a second on.event handler, halves Kopf's per-event work for pods; Kopf does
    not call indexers on DELETED events, so a `when=_deleted` event handler covers those."""
    key = _owner_key(labels, namespace)
    if key is None:
        return {}
    memo.queue.add(key)
    return {key: PodView.of(body)}


def _deleted(type: str, **_: Any) -> bool:
    return type == "DELETED"


def _owner_changed(kind: str) -> Callable[..., Awaitable[None]]:
    async def owner_changed(namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
        memo.queue.open()  # event handlers run only once every index is filled
        memo.queue.add((kind, namespace, name))

    return owner_changed


async def child_changed(labels: kopf.Labels, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    memo.queue.open()  # event handlers run only once every index is filled
    key = _owner_key(labels, namespace)
    if key is not None:
        memo.queue.add(key)


def login(memo: kopf.Memo, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> Any:
    """Kopf's watches log in like the operator's client: the --kubeconfig file when given, else the
    kubernetes client's own search (in-cluster service account, then $KUBECONFIG, ~/.kube/config)."""
    if memo.config.kubeconfig is None:
        return kopf.login_via_client(settings=settings, logger=logger)
    os.environ["KUBECONFIG"] = str(memo.config.kubeconfig)  # read by login_with_kubeconfig at call time
    return kopf.login_with_kubeconfig(settings=settings)


class NoDiffBase(kopf.DiffBaseStorage):
    """Kopf keeps a "last handled" copy of each object to diff for on.create/on.update handlers, and
    builds it (two deep copies of the body) on every watch event. This operator has no such handlers,
    so it stores nothing: that was most of its CPU during a 128-pod scale-up."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Standalone (no peering objects), no Kopf log lines posted as Events, children filtered server-side."""
    settings.peering.standalone = True
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.persistence.finalizer = "cuda-agent.io/kopf"  # never added: no handler needs one
    settings.persistence.diffbase_storage = NoDiffBase()
    for plural in [*(plural for _, _, plural in CHILDREN.values()), "pods"]:
        settings.watching.label_selectors[plural] = MANAGED_SELECTOR


async def start_workers(memo: kopf.Memo, **kwargs: Any) -> None:
    """Connect the API client and start the queue's workers; the indexes arrive as kwargs by id."""
    config = memo.config
    kube = await Kube.connect(config.kubeconfig)
    memo.queue = WorkQueue(settle=config.settle_seconds, metrics=WorkQueueMetrics())
    memo.context = OperatorContext(
        config=config,
        kube=kube,
        queue=memo.queue,
        owners=kwargs["owners"],
        pods=kwargs["pods"],
        children=kwargs["children"],
        executor=_executor(config),
    )
    memo.workers = [
        asyncio.create_task(memo.queue.work(_dispatcher(memo.context)), name=f"reconcile-worker-{i}")
        for i in range(config.workers)
    ]
    watch_queue(OWNERS, config.workers, memo.queue)
    QUEUED_RUNS.set_function(lambda: len(memo.context.queued_runs))
    if config.metrics_port:
        memo.metrics_server = serve_metrics(config.metrics_port, registry=REGISTRY)


async def stop_workers(memo: kopf.Memo, **_: Any) -> None:
    for task in memo.get("workers", []):
        task.cancel()
    await asyncio.gather(*memo.get("workers", []), return_exceptions=True)
    if "queue" in memo:
        memo.queue.cancel_timers()
    if "metrics_server" in memo:
        memo.metrics_server.shutdown()
    if "context" in memo:
        log.info("API writes by this operator", extra={"api_writes": dict(memo.context.kube.writes)})
        await memo.context.executor.close()
        await memo.context.kube.close()


def _executor(config: OperatorConfig) -> RunExecutor:
    if config.executor == "local":
        return LocalExecutor(config)
    return ClusterExecutor()


def _dispatcher(context: OperatorContext) -> Callable[[Key], Any]:
    """One pass of `key` in a reconcile span, counted and timed; an error also becomes a Warning Event
    on the object (the work queue logs it and retries with per-key exponential backoff)."""

    async def reconcile(key: Key) -> float | None:
        kind, namespace, name = key
        controller = controller_name(kind)
        started = time.perf_counter()
        try:
            with span(Stage.RECONCILE, resource=kind, namespace=namespace, name=name):
                if kind == lb.POOL_KIND:
                    requeue = await reconcile_pool(context, namespace, name)
                else:
                    requeue = await reconcile_run(context, namespace, name)
        except Exception as error:
            RECONCILES.labels(controller, ERROR).inc()
            RECONCILE_ERRORS.labels(controller).inc()
            body = context.owner(key)
            if body is not None:
                retry = context.queue.retry_delay(key)  # what the queue will wait after this raise
                message = f"{type(error).__name__}: {error}; retrying in {retry:.3g} s"
                await post(context, body, [Event(True, "ReconcileError", message)])
            raise
        finally:
            RECONCILE_SECONDS.labels(controller).observe(time.perf_counter() - started)
        RECONCILES.labels(controller, reconcile_result(requeue)).inc()
        return requeue

    return reconcile


def build_registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry, id="login")(login)
    kopf.on.startup(registry=registry, id="configure")(configure)
    kopf.on.startup(registry=registry, id="start-workers")(start_workers)
    kopf.on.cleanup(registry=registry, id="stop-workers")(stop_workers)
    for kind, (group, version, plural) in OWNERS.items():
        kopf.index(group, version, plural, id="owners", registry=registry)(_owner_indexer(kind))
        kopf.on.event(group, version, plural, id=f"{plural}-changed", registry=registry)(_owner_changed(kind))
    kopf.index("v1", "pods", id="pods", registry=registry)(index_pod)
    kopf.on.event("v1", "pods", id="pod-deleted", when=_deleted, registry=registry)(child_changed)
    for kind, (group, version, plural) in CHILDREN.items():
        kopf.index(group=group, version=version, plural=plural, id="children", registry=registry)(
            _child_indexer(kind)
        )
        kopf.on.event(
            group=group,
            version=version,
            plural=plural,
            id=f"{plural}-changed",
            registry=registry,
        )(child_changed)
    return registry
