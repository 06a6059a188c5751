"""One reconcile pass of a TrainingRun: a flat, ordered list of steps and one status write.

Suspension is Kueue-compatible: `spec.suspend: true` (from a person or from Kueue) first asks the
trainer for a checkpoint (condition Suspended=False, reason Checkpointing: the trainer watches its own
run, writes one and reports it in `status.lastCheckpoint`), then deletes the Ray cluster and the
driver; `false` recreates them with `CUDA_AGENT_RESUME_FROM` set to the last checkpoint. A run created
suspended never creates a pod. The trainer owns `step`, `metrics` and
`lastCheckpoint`; the operator owns `phase`, `conditions` and `observedGeneration`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pydantic import ValidationError

from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.api.trainingrun import TrainingRunPhase as RunPhase
from cuda_agent.api.trainingrun import TrainingRunSpec, TrainingRunStatus
from cuda_agent.operator import labels as lb
from cuda_agent.operator.apply import apply_changed
from cuda_agent.operator.conditions import Condition, is_true, merge_conditions, parse_rfc3339, rfc3339
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.kube import KubeError, Manifest, Ref
from cuda_agent.operator.run_children import (
    RunContext,
    driver_pod,
    ray_cluster,
    ray_head_service,
    ray_pods,
    role,
    role_binding,
    run_config,
    service_account,
)
from cuda_agent.operator.views import ChildView, PodView

log = logging.getLogger(__name__)
CHECKPOINT_BEFORE = "cuda-agent.io/suspend-checkpoint-before"
DRIVER_MAX_RESTARTS = 3
CHECKPOINT_POLL_SECONDS = 2.0
TERMINAL = (RunCondition.SUCCEEDED, RunCondition.FAILED)


@dataclass(frozen=True)
class RunState:
    """What the conditions are decided from."""

    blocked: Condition | None  # why the run cannot start (missing pool, bad Secret, invalid spec)
    suspend: str | None  # None, "checkpointing" or "suspended"
    suspend_message: str
    ray_ready: bool
    ray_message: str
    driver: str  # "absent", "pending", "active", "complete" or "failed"
    driver_message: str
    step: int | None
    steps: int


def decide_conditions(state: RunState) -> tuple[RunPhase, list[Condition]]:
    """(phase, conditions) of a run (pure). Exactly one of the lifecycle conditions is True."""
    succeeded = state.driver == "complete"
    failed = state.driver == "failed"
    suspended = state.suspend == "suspended"
    running = state.driver == "active" and state.ray_ready and not state.suspend
    training = running and (state.step or 0) > 0
    warming = running and not training
    if state.blocked is not None:
        provisioning = Condition(
            RunCondition.PROVISIONING, False, state.blocked.reason, state.blocked.message
        )
    elif succeeded or failed or suspended or running:
        provisioning = Condition(RunCondition.PROVISIONING, False, "Provisioned", "")
    elif not state.ray_ready:
        provisioning = Condition(RunCondition.PROVISIONING, True, "StartingRayCluster", state.ray_message)
    else:
        provisioning = Condition(RunCondition.PROVISIONING, True, "StartingDriver", state.driver_message)
    conditions = [
        provisioning,
        Condition(RunCondition.WARMING_UP, warming, "WarmUpStages" if warming else "NotWarmingUp", ""),
        Condition(
            RunCondition.TRAINING,
            training,
            "PpoSteps" if training else "NotTraining",
            f"step {state.step}/{state.steps}" if training else "",
        ),
        Condition(
            RunCondition.SUSPENDED,
            suspended,
            {"suspended": "Suspended", "checkpointing": "Checkpointing"}.get(
                state.suspend or "", "NotSuspended"
            ),
            state.suspend_message,
        ),
        Condition(RunCondition.SUCCEEDED, succeeded, "DriverCompleted" if succeeded else "NotSucceeded", ""),
        Condition(
            RunCondition.FAILED,
            failed,
            "DriverFailed" if failed else "NotFailed",
            state.driver_message if failed else "",
        ),
    ]
    if failed:
        phase = RunPhase.FAILED
    elif succeeded:
        phase = RunPhase.SUCCEEDED
    elif suspended:
        phase = RunPhase.SUSPENDED
    elif training:
        phase = RunPhase.RUNNING
    elif warming:
        phase = RunPhase.WARMING_UP
    else:
        phase = RunPhase.PENDING
    return phase, conditions


def driver_state(driver: PodView | None) -> tuple[str, str]:
    """(state, message) of the trainer driver pod."""
    if driver is None:
        return "absent", "driver pod not created yet"
    if driver.phase == "Succeeded":
        return "complete", "trainer finished"
    if driver.phase == "Failed":
        return "failed", f"driver pod failed: {driver.last_exit or 'no reason given'}"
    if driver.restarts >= DRIVER_MAX_RESTARTS:
        return "failed", f"trainer exited with an error {driver.restarts} times; last: {driver.last_exit}"
    if driver.phase == "Running" and not driver.terminating:
        return "active", "trainer running"
    return "pending", driver.unschedulable or "driver pod starting"


def ray_state(
    kuberay: bool, cluster: ChildView | None, pods: Sequence[PodView], expected: int
) -> tuple[bool, str]:
    """Whether the Ray cluster is up: KubeRay's verdict, or all of the run's own head/worker pods Ready."""
    if kuberay:
        if cluster is None:
            return False, "RayCluster not created yet"
        state = str(cluster.status.get("state") or "")
        provisioned = any(
            c.get("type") == "RayClusterProvisioned" and c.get("status") == "True"
            for c in cluster.status.get("conditions") or ()
        )
        return (state == "ready" or provisioned), f"RayCluster state {state or 'unknown'}"
    ray = [
        p
        for p in pods
        if dict(p.labels).get(lb.COMPONENT) in (lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER)
    ]
    ready = sum(1 for p in ray if p.ready and not p.terminating)
    stuck = next((p.unschedulable for p in ray if p.unschedulable), None)
    message = f"{ready}/{expected} Ray pods ready" + (f"; {stuck}" if stuck else "")
    return ready >= expected and expected > 0, message


async def check_references(
    context: OperatorContext, namespace: str, spec: TrainingRunSpec
) -> Condition | None:
    """What admission cannot check: the pool and the artifacts Secret exist (and the Secret parses)."""
    from cuda_agent.storage.config import StorageConfig
    from cuda_agent.storage.errors import StorageConfigError

    pool = spec.sandbox_pool_ref.name
    if context.owner((lb.POOL_KIND, namespace, pool)) is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "SandboxPoolNotFound",
            f"SandboxPool {namespace}/{pool} does not exist",
        )
    secret_name = context.config.artifacts_secret
    secret = await context.kube.get(Ref("Secret", namespace, secret_name))
    if secret is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "ArtifactsSecretNotFound",
            f"Secret {namespace}/{secret_name} (MinIO/S3 endpoint and credentials) does not exist",
        )
    try:
        config = StorageConfig.from_secret(secret)
    except StorageConfigError as error:
        return Condition(RunCondition.PROVISIONING, False, "ArtifactsSecretInvalid", str(error))
    if config.endpoint is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "ArtifactsSecretInvalid",
            f"Secret {namespace}/{secret_name} names no S3 endpoint",
        )
    return None


def compute_children(
    children: Mapping[tuple[str, str], ChildView], pods: Sequence[PodView], keep_driver: bool
) -> list[Ref]:
    """The run's GPU-holding children (Ray cluster, driver): what suspension and the end remove.
    A finished driver pod stays (its logs); KubeRay's own pods go with their RayCluster."""
    found = [Ref(kind, "", name) for kind, name in children if kind == "RayCluster"]
    found += [
        Ref(kind, "", name) for kind, name in children if kind == "Service" and name.endswith("-ray-head")
    ]
    own = (lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER) + (() if keep_driver else (lb.COMPONENT_DRIVER,))
    found += [
        Ref("Pod", "", p.name)
        for p in pods
        if p.component in own and not dict(p.labels).get("ray.io/cluster") and not p.terminating
    ]
    return found


async def _delete_compute(context: OperatorContext, namespace: str, refs: Sequence[Ref]) -> None:
    for ref in refs:
        await context.kube.delete(Ref(ref.kind, namespace, ref.name))


async def _kuberay_installed(context: OperatorContext, children: Mapping[tuple[str, str], ChildView]) -> bool:
    """A run keeps the mode it started in; a new Ray cluster is a RayCluster when the CRD is served."""
    if any(kind == "RayCluster" for kind, _ in children):
        return True
    if any(kind == "Service" and name.endswith("-ray-head") for kind, name in children):
        return False
    return await context.kube.serves("ray.io/v1", "rayclusters")


async def _suspend_step(
    context: OperatorContext, body: Manifest, compute: Sequence[Ref], driver: str, now: datetime
) -> tuple[str, str, bool]:
    """(suspend state, message, delete compute now) for a run with spec.suspend true."""
    annotations = body["metadata"].get("annotations") or {}
    last = (body.get("status") or {}).get("lastCheckpoint") or ""
    if not compute:
        return "suspended", f"scaled to zero; resumes from {last or 'the start'}", False
    requested = parse_rfc3339(annotations.get(lb.SUSPEND_REQUESTED_AT))
    before = annotations.get(CHECKPOINT_BEFORE, "")
    if requested is None:
        # Remember when suspension was asked for and which checkpoint existed then.
        patch = {
            "metadata": {"annotations": {lb.SUSPEND_REQUESTED_AT: rfc3339(now), CHECKPOINT_BEFORE: last}}
        }
        await context.kube.merge_patch(Ref.of(body), patch)
        requested, before = now, last
    if driver != "active":
        return "suspended", "no trainer was running: scaled to zero", True
    if last and last != before:
        return "suspended", f"checkpoint {last} written: scaled to zero", True
    if now - requested >= timedelta(seconds=context.config.suspend_checkpoint_timeout):
        return "suspended", f"no new checkpoint within the timeout: scaled to zero; resumes from {last}", True
    return "checkpointing", "waiting for the trainer's checkpoint before scaling to zero", False


async def reconcile_run(context: OperatorContext, namespace: str, name: str) -> float | None:
    """Converge one TrainingRun; returns seconds until the next pass is needed (None: on events only)."""
    key = (lb.RUN_KIND, namespace, name)
    body = context.owner(key)
    if body is None:
        context.forget(key)
        return None
    ref = Ref(lb.RUN_KIND, namespace, name)
    previous = body.get("status") or {}
    generation = int(body["metadata"].get("generation", 0))
    now = datetime.now(UTC)
    children = context.children_of(key)
    pods = context.pods_of(key)
    terminal = any(is_true(previous.get("conditions"), kind) for kind in TERMINAL)

    # 1. Validate what admission cannot: the spec against this operator's models, the pool, the Secret.
    spec: TrainingRunSpec | None = None
    blocked: Condition | None
    try:
        spec = TrainingRunSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        blocked = Condition(
            RunCondition.PROVISIONING, False, "InvalidSpec", str(error).replace("\n", "; ")[:2000]
        )
    else:
        blocked = await check_references(context, namespace, spec)
    if spec is None or blocked is not None:
        state = RunState(blocked, None, "", False, "", "absent", "", previous.get("step"), 0)
        await _write_status(context, body, ref, state, generation, now)
        return context.config.sync_period  # the pool or Secret may appear later

    # 2. The trainer's identity and run file (kept while suspended; they hold no resources).
    run = _run_context(context, body, spec)
    _, errors = await apply_changed(
        context,
        [service_account(run), role(run), role_binding(run), run_config(run, body["spec"])],
        children,
    )

    # 3. Decide whether compute should exist: not after the end, not while suspended.
    kuberay = await _kuberay_installed(context, children)
    driver_view = next((p for p in pods if p.name == lb.driver_name(name) and not p.terminating), None)
    driver, driver_message = driver_state(driver_view)
    # A driver that exited stays for its logs; one still crash-looping goes with the rest.
    finished = driver_view is not None and driver_view.phase in ("Succeeded", "Failed")
    compute = compute_children(children, pods, keep_driver=finished)
    if terminal and driver == "absent":
        driver = "complete" if is_true(previous.get("conditions"), RunCondition.SUCCEEDED) else "failed"
    suspend, suspend_message, delete_now = None, "", False
    if spec.suspend:
        suspend, suspend_message, delete_now = await _suspend_step(context, body, compute, driver, now)
    elif (body["metadata"].get("annotations") or {}).get(lb.SUSPEND_REQUESTED_AT):
        cleared = {"metadata": {"annotations": {lb.SUSPEND_REQUESTED_AT: None, CHECKPOINT_BEFORE: None}}}
        await context.kube.merge_patch(ref, cleared)

    # 4. Delete compute that must go (suspension, completion), or create what is missing.
    if delete_now or driver in ("complete", "failed"):
        await _delete_compute(context, namespace, compute)
    elif not spec.suspend:
        errors += await _ensure_compute(context, run, spec, kuberay, children, pods)

    # 5. One status write.
    expected = len(ray_pods(run, spec))
    ready, ray_message = ray_state(kuberay, children.get(("RayCluster", name)), pods, expected)
    blocked = (
        Condition(RunCondition.PROVISIONING, False, "ApplyFailed", "; ".join(errors)[:2000])
        if errors
        else None
    )
    state = RunState(
        blocked, suspend, suspend_message, ready, ray_message, driver, driver_message, previous.get("step"),
        spec.algorithm.steps,
    )  # fmt: skip
    await _write_status(context, body, ref, state, generation, now)
    if errors:
        return context.queue.error_backoff
    if suspend == "checkpointing":
        return CHECKPOINT_POLL_SECONDS
    return None if driver in ("complete", "failed") else context.config.sync_period


async def _ensure_compute(
    context: OperatorContext,
    run: RunContext,
    spec: TrainingRunSpec,
    kuberay: bool,
    children: Mapping[tuple[str, str], ChildView],
    pods: Sequence[PodView],
) -> list[str]:
    """The Ray cluster, then (once it is up) the driver. Pods are created, never updated (their specs
    are immutable); a running trainer picks up spec changes on resume."""
    if kuberay:
        _, errors = await apply_changed(context, [ray_cluster(run, spec)], children)
    else:
        existing = {p.name for p in pods if not p.terminating}
        missing = [pod for pod in ray_pods(run, spec) if pod["metadata"]["name"] not in existing]
        _, errors = await apply_changed(context, [ray_head_service(run), *missing], children)
    ready, _ = ray_state(kuberay, children.get(("RayCluster", run.name)), pods, len(ray_pods(run, spec)))
    if ready and not any(p.name == lb.driver_name(run.name) and not p.terminating for p in pods):
        errors += (await apply_changed(context, [driver_pod(run, spec, kuberay)], children))[1]
    return errors


def _run_context(context: OperatorContext, body: Manifest, spec: TrainingRunSpec) -> RunContext:
    meta = body["metadata"]
    prefix = spec.checkpoint.prefix or (
        f"s3://{context.config.artifacts_bucket}/{meta['namespace']}/{meta['name']}/checkpoints"
    )
    return RunContext(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        image=(meta.get("annotations") or {}).get(
            "cuda-agent.io/trainer-image", context.config.trainer_image
        ),
        artifacts_secret=context.config.artifacts_secret,
        checkpoint_prefix=prefix,
        otel_endpoint=context.config.otel_endpoint,
        resume_from=(body.get("status") or {}).get("lastCheckpoint"),
        pod_annotations=context.config.trainer_pod_annotations,
    )


async def _write_status(
    context: OperatorContext, body: Manifest, ref: Ref, state: RunState, generation: int, now: datetime
) -> None:
    """The pass's one status write (operator-owned fields only), skipped when nothing changed."""
    previous = body.get("status") or {}
    phase, decided = decide_conditions(state)
    status = TrainingRunStatus(observed_generation=generation, phase=phase).model_dump(
        by_alias=True, exclude_none=True, mode="json", include={"observed_generation", "phase"}
    )
    status["conditions"] = merge_conditions(
        previous.get("conditions"), decided, generation=generation, now=now
    )
    if all(previous.get(field) == value for field, value in status.items()):
        return
    try:
        await context.kube.merge_patch(ref, {"status": status}, subresource="status")
    except KubeError as error:
        log.warning("status of TrainingRun %s/%s not written: %s", ref.namespace, ref.name, error)
