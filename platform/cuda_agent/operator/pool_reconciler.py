"""One reconcile pass of a SandboxPool: a flat, ordered list of steps and one status write.

Every pass starts from what the watches show now (level-based), so a pass after an operator restart,
a deleted child or a missed event converges to the same objects; writes happen only where the desired
manifest differs from what the child carries (its spec-hash annotation).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from cuda_agent.api.judge_files import package_judge_dir, shipped_digest, shipped_judge_files
from cuda_agent.api.sandbox import SANDBOX_PORT
from cuda_agent.api.sandboxpool import SandboxPoolConditionType as PoolCondition
from cuda_agent.api.sandboxpool import SandboxPoolSpec, SandboxPoolStatus
from cuda_agent.operator import labels as lb
from cuda_agent.operator.apply import apply_changed
from cuda_agent.operator.autoscaler import Decision, Demand, PodLoad, ScalingPolicy, decide
from cuda_agent.operator.conditions import Condition, merge_conditions, rfc3339
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.demand import probe_pods
from cuda_agent.operator.drain import DrainPlan, plan_drain
from cuda_agent.operator.events import changed_fields, condition_events, log_pass, post
from cuda_agent.operator.kube import KubeError, Manifest, Ref
from cuda_agent.operator.pool_children import (
    PoolIdentity,
    TraceExport,
    headless_service,
    judge_configmap,
    network_policy,
    statefulset,
    trace_export,
)
from cuda_agent.operator.views import ChildView, PodView
from cuda_agent.operator.workqueue import Key

log = logging.getLogger(__name__)
DRAIN_POLL_SECONDS = 2.0
STATUS_INTERVAL = 1.0
CONFIGMAP_LIMIT = 1_000_000  # bytes; the apiserver refuses larger ConfigMaps
# A FailedCreate event of the pool's StatefulSet older than this no longer explains missing pods.
REFUSAL_WINDOW = timedelta(minutes=10)
# Status fields only a demand read fills; a pass that read none clears them rather than leave stale counts.
DEMAND_FIELDS = tuple(
    SandboxPoolStatus.model_fields[name].alias or name for name in ("active_sessions", "queue_depth")
)


@functools.cache
def judge_files() -> dict[str, str]:
    """The judge package's shipped files, read once (the judge package itself is never imported: it
    needs torch, which the operator image does not have)."""
    return shipped_judge_files(package_judge_dir())


@functools.cache
def judge_files_hash() -> str:
    return shipped_digest(judge_files())


@functools.lru_cache(maxsize=256)
def desired_judge_configmap(pool: PoolIdentity, spec_json: str) -> Manifest:
    """The judge ConfigMap of a pool, built once per spec: hashing ~200 KB of judge files on every
    pass was most of a pass's CPU. Callers must not modify the returned manifest."""
    return judge_configmap(pool, SandboxPoolSpec.model_validate_json(spec_json), judge_files())


@dataclass(frozen=True)
class PoolObservation:
    """What a status is computed from."""

    generation: int
    desired: int
    statefulset_replicas: int
    pods: Sequence[PodView]
    loads: Sequence[PodLoad] | None
    plan: DrainPlan
    problems: Sequence[Condition]  # Degraded reasons found on the way, most severe first
    warnings: Sequence[Condition] = ()  # Degraded reasons that matter less than unschedulable pods


def _event_time(event: Mapping[str, Any]) -> datetime | None:
    """When an Event was last seen: core/v1 events fill lastTimestamp, events.k8s.io ones eventTime or
    their series."""
    for stamp in (
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        if stamp:
            return datetime.fromisoformat(str(stamp))
    return None


async def _refused_pods(
    context: OperatorContext, namespace: str, name: str, now: datetime
) -> Condition | None:
    """Pods the StatefulSet controller could not create (Pod Security admission, a quota, a webhook):
    its latest FailedCreate event names why, which otherwise shows only in `kubectl get events`."""
    selector = f"involvedObject.kind=StatefulSet,involvedObject.name={name},reason=FailedCreate"
    try:
        events = await context.kube.list("v1", "events", namespace=namespace, field_selector=selector)
    except KubeError as error:  # e.g. an install whose RBAC predates `list events`: no diagnosis, no failure
        log.debug("cannot list the events of StatefulSet %s/%s: %s", namespace, name, error)
        return None
    recent = [(seen, e) for e in events if (seen := _event_time(e)) and now - seen < REFUSAL_WINDOW]
    if not recent:
        return None
    _, newest = max(recent, key=lambda pair: pair[0])
    message = f"the StatefulSet cannot create sandbox pods: {newest.get('message', '')}"
    return Condition(PoolCondition.DEGRADED, True, "PodsRefused", message[:2000])


def pool_status(
    pool: PoolIdentity, observed: PoolObservation, previous: Mapping[str, Any], now: datetime
) -> dict[str, Any]:
    """The whole operator-owned status of a pool (pure)."""
    live = [p for p in observed.pods if not p.terminating]
    ready = sum(1 for p in live if p.ready)
    unschedulable = [p for p in live if p.unschedulable]
    desired = observed.desired
    ready_condition = _ready(live, desired, observed.plan)
    if observed.plan.waiting_on:
        held = observed.plan.waiting_on
        waiting = ", ".join(held[:8]) + (" ..." if len(held) > 8 else "")
        by = observed.plan.deadline
        scaling = Condition(
            PoolCondition.SCALING,
            True,
            "Draining",
            f"scaling down to {desired}: waiting for sessions on {waiting}"
            + (f"; the scale-down goes on by {rfc3339(by)} whether or not they end" if by else ""),
        )
    elif len(live) < desired or observed.statefulset_replicas < desired:
        scaling = Condition(
            PoolCondition.SCALING, True, "ScalingUp", f"{len(live)} -> {desired} sandbox pods"
        )
    elif len(live) > desired:
        scaling = Condition(
            PoolCondition.SCALING, True, "ScalingDown", f"{len(live)} -> {desired} sandbox pods"
        )
    else:
        scaling = Condition(PoolCondition.SCALING, False, "Stable", f"{desired} sandbox pods")
    degraded = _degraded(observed.problems, unschedulable, observed.warnings)
    demand = Demand.of(observed.loads) if observed.loads is not None else None
    reported = _load_reported(observed.loads)
    if demand is not None and observed.loads and demand.silent_pods == len(observed.loads):
        demand = None  # no pod answered: the counts are unknown, not zero
    status = SandboxPoolStatus(
        observed_generation=observed.generation,
        replicas=len(live),
        ready_replicas=ready,
        selector=lb.selector_string(lb.pool_selector(pool.name)),
        active_sessions=demand.active_sessions if demand is not None else None,
        queue_depth=demand.queued_judge_jobs if demand is not None else None,
    ).model_dump(by_alias=True, exclude_none=True, mode="json", exclude={"conditions"})
    status["conditions"] = merge_conditions(
        previous.get("conditions"),
        [ready_condition, scaling, degraded, reported],
        generation=observed.generation,
        now=now,
    )
    return status


def _ready(live: Sequence[PodView], desired: int, plan: DrainPlan) -> Condition:
    """Ready, counting the pods of the desired set (ordinals below spec.replicas) against spec.replicas:
    while a scale-down is under way the pods above it still run, and are told apart rather than counted
    as ready replicas ("32/1 ready")."""
    if desired == 0 and not live:
        return Condition(PoolCondition.READY, True, "ScaledToZero", "spec.replicas is 0")
    kept = [p for p in live if p.ordinal is not None and p.ordinal < desired]
    ready = sum(1 for p in kept if p.ready)
    message = f"{ready}/{desired} sandbox pods ready"
    if extra := len(live) - len(kept):
        draining = len(plan.waiting_on)
        message += f"; {extra} more being removed by the scale-down" + (
            f" ({draining} of them draining their sessions)" if draining else ""
        )
    if ready >= desired and len(live) == desired:
        return Condition(PoolCondition.READY, True, "AllReplicasReady", message)
    return Condition(PoolCondition.READY, False, "ReplicasNotReady", message)


def _load_reported(loads: Sequence[PodLoad] | None) -> Condition:
    """Whether the status's session and queue counts cover every running pod."""
    if loads is None:
        return Condition(
            PoolCondition.LOAD_REPORTED, None, "NotRead",
            "the pool is neither autoscaled nor shrinking, so its pods are not asked for their load",
        )  # fmt: skip
    if not loads:
        return Condition(PoolCondition.LOAD_REPORTED, None, "NoRunningPods", "no running sandbox pod to ask")
    silent = [load.pod for load in loads if not load.answered]
    if not silent:
        return Condition(
            PoolCondition.LOAD_REPORTED, True, "AllPodsAnswered", f"{len(loads)} pods reported their load"
        )
    advice = (
        "check those pods' logs and that the operator reaches port 8470 (the pool's NetworkPolicy, "
        "--probe-network); the autoscaler counts them as idle for scale-up and busy for scale-down"
    )
    names = ", ".join(silent[:8]) + (" ..." if len(silent) > 8 else "")
    if len(silent) == len(loads):
        message = f"none of the {len(loads)} running pods answered GET /v1/status ({names}): load unknown; "
        return Condition(PoolCondition.LOAD_REPORTED, None, "PodsNotAnswering", message + advice)
    message = (
        f"{len(silent)}/{len(loads)} running pods did not answer GET /v1/status ({names}); the counts "
        f"cover the others; "
    )
    return Condition(PoolCondition.LOAD_REPORTED, False, "PodsNotAnswering", message + advice)


def _degraded(
    problems: Sequence[Condition], unschedulable: Sequence[PodView], warnings: Sequence[Condition]
) -> Condition:
    if problems:
        return problems[0]
    if unschedulable:
        message = unschedulable[0].unschedulable or ""
        reason = (
            "InsufficientGPU" if "Insufficient" in message and "gpu" in message.lower() else "Unschedulable"
        )
        return Condition(
            PoolCondition.DEGRADED,
            True,
            reason,
            f"{len(unschedulable)} sandbox pods cannot be scheduled: {message}",
        )
    if warnings:
        return warnings[0]
    return Condition(PoolCondition.DEGRADED, False, "AsExpected", "no problem found")


def _transitions(status: Mapping[str, Any]) -> set[tuple[Any, ...]]:
    conditions = {(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or ()}
    return conditions | {("observedGeneration", status.get("observedGeneration"), status.get("selector"))}


def status_write_delay(
    previous: Mapping[str, Any], status: Mapping[str, Any], since_last: float
) -> float | None:
    """None to write now, else seconds to wait (pure). A changed condition or generation is written at
    once; counts that move while pods come and go are written at most every STATUS_INTERVAL seconds, so
    a 128-pod scale-up costs a handful of status writes, not one per pod."""
    if _transitions(previous) != _transitions(status) or since_last >= STATUS_INTERVAL:
        return None
    return STATUS_INTERVAL - since_last


async def _write_status(
    context: OperatorContext, body: Manifest, status: dict[str, Any], ref: Ref
) -> float | None:
    """The pass's one status write, skipped when the apiserver already holds it (as far as the watch
    shows, or this process's own write that the watch does not show yet); a value someone else wrote
    over the operator's (a forged selector or readyReplicas) is written over again. Returns when to look
    again if the write was held back by the rate limit."""
    key = (ref.kind, ref.namespace, ref.name)
    previous, _ = context.basis(key, body)
    if all(previous.get(f) == v for f, v in status.items()):
        return None
    own = context.own_writes.get(key)
    written_at = own.status_at if own is not None and own.uid == body["metadata"].get("uid") else 0.0
    delay = status_write_delay(previous, status, time.monotonic() - written_at)
    if delay is not None:
        return delay
    cleared = {field: None for field in DEMAND_FIELDS if field in previous and field not in status}
    answer = await context.kube.merge_patch(ref, {"status": {**status, **cleared}}, subresource="status")
    context.wrote(key, body, answer, status=status)
    await post(context, body, condition_events(previous, status, _is_problem))
    log_pass(ref.kind, ref.namespace, ref.name, **changed_fields(previous, status))
    return None


def _is_problem(condition: Mapping[str, Any]) -> bool:
    """Degraded, or pods that do not say how busy they are: worth a Warning Event."""
    if condition.get("type") == PoolCondition.DEGRADED:
        return condition.get("status") == "True"
    return (
        condition.get("type") == PoolCondition.LOAD_REPORTED and condition.get("reason") == "PodsNotAnswering"
    )


async def _autoscale(
    context: OperatorContext,
    body: Manifest,
    spec: SandboxPoolSpec,
    loads: Sequence[PodLoad],
    key: tuple[str, str, str],
) -> Decision | None:
    autoscaling = spec.autoscaling
    assert autoscaling is not None
    policy = ScalingPolicy(
        min_replicas=autoscaling.min_replicas,
        max_replicas=autoscaling.max_replicas,
        target_sessions_per_replica=autoscaling.target_sessions_per_replica,
        scale_down_delay=autoscaling.scale_down_delay_seconds,
    )
    decision = decide(spec.replicas, Demand.of(loads), policy, context.history(key), time.monotonic())
    if decision is None:
        return None
    # Through /scale, the same door `kubectl scale` and an HPA use; spec.replicas stays the one truth.
    await context.kube.merge_patch(
        Ref.of(body), {"spec": {"replicas": decision.replicas}}, subresource="scale"
    )
    await context.kube.post_event(body, warning=False, reason=decision.reason, message=decision.message)
    return decision


async def _mark_drain(context: OperatorContext, namespace: str, plan: DrainPlan, now: datetime) -> None:
    for pod in plan.start_draining:
        patch = {"metadata": {"annotations": {lb.DRAIN_SINCE: rfc3339(now)}}}
        await context.kube.merge_patch(Ref("Pod", namespace, pod), patch)
    for pod in plan.stop_draining:
        await context.kube.merge_patch(
            Ref("Pod", namespace, pod), {"metadata": {"annotations": {lb.DRAIN_SINCE: None}}}
        )


@dataclass
class PoolPass:
    """One reconcile pass of a pool: what it read at its start, then each step's part, in step order (a
    step reads only what the steps before it filled in)."""

    context: OperatorContext
    body: Manifest
    pool: PoolIdentity
    spec: SandboxPoolSpec
    now: datetime
    children: Mapping[tuple[str, str], ChildView]
    desired: int  # spec.replicas, or the autoscaler's new value (_autoscale_replicas)
    problems: list[Condition] = field(default_factory=list)  # Degraded reasons, most severe first
    warnings: list[Condition] = field(default_factory=list)  # ones that matter less than unschedulable pods
    errors: list[str] = field(default_factory=list)  # refused applies, as text
    # _apply_front
    export: TraceExport | None = None
    # _observe_pods
    pods: list[PodView] = field(default_factory=list)
    sts: ChildView | None = None  # the StatefulSet as the watch shows it
    current: int = 0  # the StatefulSet's replicas before this pass
    loads: list[PodLoad] | None = None  # read only when autoscaled or shrinking
    # _drain
    plan: DrainPlan = field(init=False, repr=False)
    # _find_refused_pods
    missing: bool = False  # the StatefulSet has fewer pods than it should

    @property
    def ref(self) -> Ref:
        return Ref(lb.POOL_KIND, self.pool.namespace, self.pool.name)

    @property
    def key(self) -> Key:
        return (lb.POOL_KIND, self.pool.namespace, self.pool.name)


PoolStep = Callable[[PoolPass], Awaitable[None]]


async def reconcile_pool(context: OperatorContext, namespace: str, name: str) -> float | None:
    """Converge one SandboxPool; returns seconds until the next pass is needed (None: on events only).
    The steps of POOL_STEPS run in order; then one status write."""
    key = (lb.POOL_KIND, namespace, name)
    body = context.owner(key)
    if body is None:
        context.forget(key)  # deleted: owner references remove the children
        return None
    try:
        spec = SandboxPoolSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        await _write_invalid_spec(context, body, Ref(lb.POOL_KIND, namespace, name), error)
        return None
    p = PoolPass(
        context=context,
        body=body,
        pool=PoolIdentity(name=name, namespace=namespace, uid=body["metadata"]["uid"]),
        spec=spec,
        now=datetime.now(UTC),
        children=context.children_of(key),
        desired=spec.replicas,
    )
    for step in POOL_STEPS:
        await step(p)
    return await _conclude(p)


async def _write_invalid_spec(
    context: OperatorContext, body: Manifest, ref: Ref, error: ValidationError
) -> None:
    """A spec this operator's models refuse: only Degraded (InvalidSpec) and the generation are written;
    the children stay as they are until the spec is fixed."""
    generation = int(body["metadata"].get("generation", 0))
    invalid = Condition(PoolCondition.DEGRADED, True, "InvalidSpec", str(error).replace("\n", "; ")[:2000])
    conditions = merge_conditions(
        body.get("status", {}).get("conditions"), [invalid], generation=generation, now=datetime.now(UTC)
    )
    status = SandboxPoolStatus(observed_generation=generation).model_dump(
        by_alias=True, exclude_none=True, mode="json", exclude={"conditions"}
    )
    await _write_status(context, body, {**status, "conditions": conditions}, ref)


async def _apply_front(p: PoolPass) -> None:
    """The judge files (ConfigMap), the headless Service and the NetworkPolicy, and what keeps them
    from being what the pool asks for."""
    config = p.context.config
    configmap = desired_judge_configmap(p.pool, p.spec.model_dump_json(by_alias=True))
    if not judge_files():
        p.warnings.append(
            Condition(
                PoolCondition.DEGRADED, True, "JudgeFilesMissing", "no judge files in this operator install"
            )
        )
    p.export = trace_export(p.spec, config.otel_endpoint, config.otel_collector_labels)
    if p.spec.telemetry.export_traces and p.export is None:
        p.warnings.append(
            Condition(
                PoolCondition.DEGRADED,
                True,
                "TracesNotExported",
                "spec.telemetry.exportTraces is set, but the operator runs without --otel-endpoint and "
                "--otel-collector-label (the chart sets both with telemetry.collector.enabled): the pods "
                "keep no egress and export nothing",
            )
        )
    if sum(len(v) for v in configmap["data"].values()) > CONFIGMAP_LIMIT:  # the apiserver's limit
        p.problems.append(
            Condition(
                PoolCondition.DEGRADED, True, "JudgeFilesTooLarge", "judge files exceed a ConfigMap's 1 MB"
            )
        )
    front = [
        configmap,
        headless_service(p.pool),
        network_policy(p.pool, p.export, config.metrics_scraper_labels),
    ]
    _, p.errors = await apply_changed(p.context, front, p.children)


async def _observe_pods(p: PoolPass) -> None:
    """The pods (from the watch index), the StatefulSet's size and, when it matters (autoscaling or a
    scale-down), the running pods' load."""
    p.pods = p.context.pods_of(p.key)
    p.sts = p.children.get(("StatefulSet", p.pool.name))
    p.current = int(p.sts.spec.get("replicas", 0)) if p.sts is not None else 0
    if p.spec.autoscaling is not None or p.current > p.spec.replicas:
        running = [pod for pod in p.pods if pod.phase == "Running" and not pod.terminating]
        p.loads = await probe_pods(p.pool.namespace, running, SANDBOX_PORT, p.context.probe)


async def _autoscale_replicas(p: PoolPass) -> None:
    """From demand, a new spec.replicas through /scale, and an Event."""
    if p.spec.autoscaling is not None and p.loads is not None:
        decision = await _autoscale(p.context, p.body, p.spec, p.loads, p.key)
        p.desired = decision.replicas if decision is not None else p.desired


async def _drain(p: PoolPass) -> None:
    """Mark the pods a scale-down removes (and unmark those of a cancelled one); the StatefulSet shrinks
    only past pods whose sessions are done."""
    by_name = {load.pod: load for load in p.loads or ()}
    grace = p.context.config.drain_grace_period
    p.plan = plan_drain(p.desired, p.current, p.pods, by_name, p.now, grace)
    await _mark_drain(p.context, p.pool.namespace, p.plan, p.now)


async def _size_statefulset(p: PoolPass) -> None:
    """The StatefulSet at the drain plan's size (an Event when it changed); refused applies become
    Degraded (ApplyFailed)."""
    replicas = p.plan.statefulset_replicas
    manifest = statefulset(p.pool, p.spec, replicas, sorted(judge_files()), judge_files_hash(), p.export)
    resized, errors = await apply_changed(p.context, [manifest], p.children)
    p.errors += errors
    if resized and p.sts is not None and replicas != p.current:
        message = f"StatefulSet {p.current} -> {replicas} sandbox pods (spec.replicas {p.desired})"
        await p.context.kube.post_event(p.body, warning=False, reason="Scaled", message=message)
    if p.errors:
        p.problems.append(Condition(PoolCondition.DEGRADED, True, "ApplyFailed", "; ".join(p.errors)[:2000]))


async def _find_refused_pods(p: PoolPass) -> None:
    """Why pods the StatefulSet should have are missing, when they are."""
    live = [pod for pod in p.pods if not pod.terminating]
    p.missing = p.sts is not None and len(live) < min(p.current, p.plan.statefulset_replicas)
    if p.missing:
        refused = await _refused_pods(p.context, p.pool.namespace, p.pool.name, p.now)
        p.problems += [refused] if refused is not None else []


# A pass's steps, in order; each fills in its part of the PoolPass. A refused apply does not stop the
# list (it is reported, ApplyFailed); an exception (another API call failing) stops the pass, and the
# work queue retries it.
POOL_STEPS: tuple[PoolStep, ...] = (
    _apply_front,
    _observe_pods,
    _autoscale_replicas,
    _drain,
    _size_statefulset,
    _find_refused_pods,
)


def next_pass(p: PoolPass, held: float | None, retry: float | None) -> float | None:
    """Seconds until the pool needs another pass (pure); `held`: a status write the rate limit held
    back; `retry`: the backoff after a refused apply (the work queue's, per pool)."""
    waits = [wait for wait in (held, retry) if wait is not None]
    if p.plan.draining:
        waits.append(DRAIN_POLL_SECONDS)
    if p.spec.autoscaling is not None or p.missing:
        # Pods that cannot be created change nothing the watches see: look again for the reason.
        waits.append(p.context.config.sync_period)
    return min(waits) if waits else None


async def _conclude(p: PoolPass) -> float | None:
    """One status write, from what the steps observed and did."""
    generation = int(p.body["metadata"].get("generation", 0))
    observed = PoolObservation(
        generation, p.desired, p.plan.statefulset_replicas, p.pods, p.loads, p.plan, p.problems, p.warnings
    )
    status = pool_status(p.pool, observed, p.body.get("status") or {}, p.now)
    held = await _write_status(p.context, p.body, status, p.ref)
    # A refused apply: the work queue's per-key backoff, as after a pass that raised, at most a sync
    # period (a quota or RBAC fixed later shows in no watch event).
    retry = p.context.queue.failed(p.key, at_most=p.context.config.sync_period) if p.errors else None
    return next_pass(p, held, retry)
