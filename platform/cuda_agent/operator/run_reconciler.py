"""One reconcile pass of a TrainingRun: a flat, ordered list of steps and one status write.

Suspension is Kueue-compatible: `spec.suspend: true` (from a person or from Kueue) first asks the
trainer for a checkpoint (condition Suspended=False, reason Checkpointing: the trainer watches its own
run, writes one and reports it in `status.lastCheckpoint`), then stops the compute (the Ray cluster and
driver pods, or the local processes: see executor.py); `false` starts it again with
`CUDA_AGENT_RESUME_FROM` set to the last checkpoint. A run created suspended never starts anything.
The trainer owns `step`, `metrics` and `lastCheckpoint`; the operator owns `phase`, `conditions` and
`observedGeneration`.
"""

from __future__ import annotations

import logging
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
    role,
    role_binding,
    run_config,
    service_account,
)

log = logging.getLogger(__name__)
CHECKPOINT_BEFORE = "cuda-agent.io/suspend-checkpoint-before"
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
    starting_reason: str = "StartingRayCluster"  # the executor's word for "platform not up yet"


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
        provisioning = Condition(RunCondition.PROVISIONING, True, state.starting_reason, state.ray_message)
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


async def _suspend_step(
    context: OperatorContext, body: Manifest, compute_exists: bool, driver: str, now: datetime
) -> tuple[str, str, bool]:
    """(suspend state, message, delete compute now) for a run with spec.suspend true."""
    annotations = body["metadata"].get("annotations") or {}
    last = (body.get("status") or {}).get("lastCheckpoint") or ""
    if not compute_exists:
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
    if last and last != before:
        return "suspended", f"checkpoint {last} written: scaled to zero", True
    if driver != "active":
        return "suspended", "no trainer was running: scaled to zero", True
    if now - requested >= timedelta(seconds=context.config.suspend_checkpoint_timeout):
        return "suspended", f"no new checkpoint within the timeout: scaled to zero; resumes from {last}", True
    return "checkpointing", "waiting for the trainer's checkpoint before scaling to zero", False


async def reconcile_run(context: OperatorContext, namespace: str, name: str) -> float | None:
    """Converge one TrainingRun; returns seconds until the next pass is needed (None: on events only)."""
    key = (lb.RUN_KIND, namespace, name)
    body = context.owner(key)
    if body is None:
        context.forget(key)
        context.executor.forget(namespace, name)  # pods go by owner reference; local processes stop
        return None
    ref = Ref(lb.RUN_KIND, namespace, name)
    previous = body.get("status") or {}
    generation = int(body["metadata"].get("generation", 0))
    now = datetime.now(UTC)
    children = context.children_of(key)
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
    executor = context.executor
    compute = await executor.observe(context, run, spec)
    driver = compute.driver
    if terminal and driver == "absent":
        driver = "complete" if is_true(previous.get("conditions"), RunCondition.SUCCEEDED) else "failed"
    elif spec.suspend and driver == "complete":
        driver = "absent"  # a trainer exits 0 after its suspension checkpoint: the run is not finished
    suspend, suspend_message, delete_now = None, "", False
    if spec.suspend:
        suspend, suspend_message, delete_now = await _suspend_step(context, body, compute.exists, driver, now)
    elif (body["metadata"].get("annotations") or {}).get(lb.SUSPEND_REQUESTED_AT):
        cleared = {"metadata": {"annotations": {lb.SUSPEND_REQUESTED_AT: None, CHECKPOINT_BEFORE: None}}}
        await context.kube.merge_patch(ref, cleared)

    # 4. Remove compute that must go (suspension, completion), or create what is missing.
    if delete_now or driver in ("complete", "failed"):
        await executor.remove(context, run, keep_finished=not spec.suspend)
    elif not spec.suspend:
        errors += await executor.ensure(context, run, spec)

    # 5. One status write, from what runs now.
    compute = await executor.observe(context, run, spec)
    blocked = (
        Condition(RunCondition.PROVISIONING, False, "ApplyFailed", "; ".join(errors)[:2000])
        if errors
        else None
    )
    state = RunState(
        blocked, suspend, suspend_message, compute.ready, compute.ready_message, driver,
        compute.driver_message, previous.get("step"), spec.algorithm.steps, compute.starting_reason,
    )  # fmt: skip
    await _write_status(context, body, ref, state, generation, now)
    if errors:
        return context.queue.error_backoff
    if suspend == "checkpointing":
        return CHECKPOINT_POLL_SECONDS
    return None if driver in ("complete", "failed") else context.config.sync_period


def _run_context(context: OperatorContext, body: Manifest, spec: TrainingRunSpec) -> RunContext:
    meta = body["metadata"]
    # The uid keeps a run recreated under the same name from resuming its predecessor's checkpoints
    # (the trainer resumes from the newest checkpoint under its prefix after any restart).
    prefix = spec.checkpoint.prefix or (
        f"s3://{context.config.artifacts_bucket}/{meta['namespace']}/{meta['name']}/{meta['uid']}/checkpoints"
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
