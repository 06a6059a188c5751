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
import time
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.api.trainingrun import TrainingRunPhase as RunPhase
from cuda_agent.api.trainingrun import TrainingRunSpec, TrainingRunStatus
from cuda_agent.operator import labels as lb
from cuda_agent.operator.admission import gang_condition, gang_placed, gang_scheduler, read_capacity
from cuda_agent.operator.apply import apply_changed
from cuda_agent.operator.conditions import Condition, find, merge_conditions, parse_rfc3339, rfc3339
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.events import Event, changed_fields, condition_events, log_pass, post
from cuda_agent.operator.executor import LOG_TAIL_LINES, Compute
from cuda_agent.operator.kube import KubeError, Manifest, Ref
from cuda_agent.operator.run_children import (
    RunContext,
    role,
    role_binding,
    run_config,
    service_account,
    worker_gpus,
)
from cuda_agent.operator.workqueue import Key

log = logging.getLogger(__name__)
CHECKPOINT_BEFORE = "cuda-agent.io/suspend-checkpoint-before"
CHECKPOINT_POLL_SECONDS = 2.0
RELEASE_SECONDS = 2.0  # after a run lets go of its pods, when queued runs check the capacity again
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
    admission: Condition | None = None  # Admitted; None keeps the previous one (blocked or finished runs)
    failure: Condition | None = None  # Failed's reason and message, once the run failed


def decide_conditions(state: RunState) -> tuple[RunPhase, list[Condition]]:
    """(phase, conditions) of a run (pure). At most one lifecycle condition is True, and every
    condition's message says what is going on (and, for a problem, what to do)."""
    failed = state.failure is not None or state.driver == "failed"
    succeeded = state.driver == "complete" and not failed
    finished = failed or succeeded
    suspended = state.suspend == "suspended" and not finished
    # A trainer writing its suspension checkpoint is still warming up or training.
    running = state.driver == "active" and state.ray_ready and state.suspend != "suspended" and not finished
    training = running and (state.step or 0) > 0
    warming = running and not training
    queued = (
        state.admission is not None and state.admission.status is False and state.blocked is None
        and not finished and state.suspend is None
    )  # fmt: skip
    if state.blocked is not None:
        provisioning = Condition(
            RunCondition.PROVISIONING, False, state.blocked.reason, state.blocked.message
        )
    elif finished:
        provisioning = Condition(
            RunCondition.PROVISIONING, False, "RunFinished", "the run ended: nothing is provisioned after it"
        )
    elif suspended:
        provisioning = Condition(
            RunCondition.PROVISIONING, False, "Suspended", "nothing runs while spec.suspend is true"
        )
    elif queued:
        assert state.admission is not None
        provisioning = Condition(RunCondition.PROVISIONING, False, "Queued", state.admission.message)
    elif running:
        provisioning = Condition(
            RunCondition.PROVISIONING, False, "Provisioned", "the Ray cluster is ready and the trainer runs"
        )
    elif not state.ray_ready:
        message = state.ray_message or "starting the Ray cluster"
        provisioning = Condition(RunCondition.PROVISIONING, True, state.starting_reason, message)
    else:
        message = state.driver_message or "starting the trainer"
        provisioning = Condition(RunCondition.PROVISIONING, True, "StartingDriver", message)
    idle = "the run has ended" if finished else "the trainer is not running yet"
    conditions = [
        *([state.admission] if state.admission is not None else []),
        provisioning,
        Condition(
            RunCondition.WARMING_UP,
            warming,
            "WarmUpStages" if warming else "NotWarmingUp",
            "the trainer runs its warm-up stages (no PPO step reported yet)"
            if warming else "PPO steps have started" if training else idle,
        ),
        Condition(
            RunCondition.TRAINING,
            training,
            "PpoSteps" if training else "NotTraining",
            f"step {state.step}/{state.steps}" if training else f"{idle}; steps done: {state.step or 0}",
        ),
        Condition(
            RunCondition.SUSPENDED,
            suspended,
            {"suspended": "Suspended", "checkpointing": "Checkpointing"}.get(
                state.suspend or "", "NotSuspended"
            ),
            state.suspend_message or "spec.suspend is false",
        ),
        Condition(
            RunCondition.SUCCEEDED,
            succeeded,
            "DriverCompleted" if succeeded else "NotSucceeded",
            f"the trainer finished after {state.step or 0}/{state.steps} steps"
            if succeeded else "the trainer has not finished",
        ),
        Condition(
            RunCondition.FAILED,
            failed,
            state.failure.reason if state.failure else "DriverFailed" if failed else "NotFailed",
            state.failure.message if state.failure else state.driver_message if failed else "no failure",
        ),
    ]  # fmt: skip
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
    elif queued:
        phase = RunPhase.QUEUED
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
            f"SandboxPool {namespace}/{pool} does not exist: create it or fix spec.sandboxPoolRef.name "
            f"(checked again every {context.config.sync_period:g} s)",
        )
    secret_name = context.config.artifacts_secret
    secret = await context.kube.get(Ref("Secret", namespace, secret_name))
    if secret is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "ArtifactsSecretNotFound",
            f"Secret {namespace}/{secret_name} (MinIO/S3 endpoint and credentials) does not exist: create "
            "it with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or start the operator "
            "with --artifacts-secret naming yours",
        )
    try:
        config = StorageConfig.from_secret(secret)
    except StorageConfigError as error:
        return Condition(
            RunCondition.PROVISIONING, False, "ArtifactsSecretInvalid", f"{error}: fix Secret {secret_name}"
        )
    if config.endpoint is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "ArtifactsSecretInvalid",
            f"Secret {namespace}/{secret_name} names no S3 endpoint: add AWS_ENDPOINT_URL",
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
        return "suspended", f"checkpoint {last} written: scaled to zero; resumes from {last}", True
    if now - requested >= timedelta(seconds=context.config.suspend_checkpoint_timeout):
        return "suspended", f"no new checkpoint within the timeout: scaled to zero; resumes from {last}", True
    if driver == "complete":
        # The trainer exits 0 right after reporting its checkpoint: wait for that report to show.
        return "checkpointing", "the trainer exited after its checkpoint; waiting for its report", False
    if driver != "active":
        return "suspended", "no trainer was running: scaled to zero", True
    return "checkpointing", "waiting for the trainer's checkpoint before scaling to zero", False


async def reconcile_run(context: OperatorContext, namespace: str, name: str) -> float | None:
    """Converge one TrainingRun; returns seconds until the next pass is needed (None: on events only)."""
    key = (lb.RUN_KIND, namespace, name)
    body = context.owner(key)
    if body is None:
        context.forget(key)
        context.executor.forget(namespace, name)  # pods go by owner reference; local processes stop
        for queued in context.queued_runs:  # its GPUs free up once the garbage collector is done
            context.queue.add_after(queued, RELEASE_SECONDS)
        return None
    ref = Ref(lb.RUN_KIND, namespace, name)
    previous = _previous_status(context, key, body)
    generation = int(body["metadata"].get("generation", 0))
    now = datetime.now(UTC)
    children = context.children_of(key)
    ended = _ended(previous)  # the Succeeded/Failed condition of a run that already ended

    # 1. Validate what admission cannot: the spec against this operator's models, the pool, the Secret.
    spec: TrainingRunSpec | None = None
    blocked: Condition | None
    try:
        spec = TrainingRunSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        message = str(error).replace("\n", "; ")[:2000]
        blocked = Condition(RunCondition.PROVISIONING, False, "InvalidSpec", f"fix the spec: {message}")
    else:
        blocked = None if ended else await check_references(context, namespace, spec)
    if spec is None or blocked is not None:
        failed = ended if ended is not None and ended.type == RunCondition.FAILED else None
        driver = "complete" if ended is not None and failed is None else "absent"
        state = RunState(blocked, None, "", False, "", driver, "", previous.get("step"), 0, failure=failed)
        await _write_status(context, body, ref, state, generation, now, previous.get("startTime"))
        return context.config.sync_period  # the pool or Secret may appear later

    # 2. The trainer's identity and run file (kept while suspended; they hold no resources). A run that
    #    ended creates nothing: these exist already, or the run never started.
    run = _run_context(context, body, spec)
    errors: list[str] = []
    created: list[str] = []
    if ended is None:
        created, errors = await apply_changed(
            context,
            [service_account(run), role(run), role_binding(run), run_config(run, body["spec"])],
            children,
        )

    # 3. Observe the compute; decide suspension.
    executor = context.executor
    compute = await executor.observe(context, run, spec)
    driver = compute.driver
    if ended is not None:
        driver = "complete" if ended.type == RunCondition.SUCCEEDED else "failed"
    suspend, suspend_message, delete_now = None, "", False
    if spec.suspend and ended is None:
        suspend, suspend_message, delete_now = await _suspend_step(context, body, compute.exists, driver, now)
        if driver == "complete":
            driver = "absent"  # a trainer exits 0 after its suspension checkpoint: the run is not finished
    elif (body["metadata"].get("annotations") or {}).get(lb.SUSPEND_REQUESTED_AT):
        cleared = {"metadata": {"annotations": {lb.SUSPEND_REQUESTED_AT: None, CHECKPOINT_BEFORE: None}}}
        await context.kube.merge_patch(ref, cleared)

    # 4. Why the run ends now, if it does: the trainer's own end, a deadline, a start that never came.
    start_time = parse_rfc3339(previous.get("startTime"))
    failure = ended if ended is not None and ended.type == RunCondition.FAILED else None
    if ended is None and not spec.suspend:
        failure = await decide_failure(context, run, spec, compute, previous, start_time, now)
    newly_ended = ended is None and (failure is not None or driver == "complete")

    # 5. Admission and compute, under the admission lock while the run still has to be admitted, so
    #    the gang it was checked for exists (as pending pods) before another run is checked.
    admission: Condition | None = None
    removed: list[str] = []
    must_admit = ended is None and not newly_ended and not spec.suspend and not compute.exists
    async with context.admission_lock if must_admit else nullcontext():
        if ended is not None or delete_now:
            # 5a. Let go of the compute (the end's record, a finished driver pod, stays for its logs).
            removed = await executor.remove(context, run, keep_finished=not spec.suspend)
            if removed:  # GPUs free up: queued runs look again once the pods are gone
                for queued in context.queued_runs - {key}:
                    context.queue.add_after(queued, RELEASE_SECONDS)
            if ended is not None:
                admission = Condition(
                    RunCondition.ADMITTED, False, "RunFinished", "the run ended and released its GPUs"
                )
        elif newly_ended:
            # 5b. The end goes into the status first; the next pass removes the compute. An operator
            #     killed in between finds the run ended instead of restarting it.
            pass
        elif not spec.suspend:
            admission, run = await _admit(context, body, run, spec, compute.exists)
            if admission.status:
                start_time = start_time or now
            if admission.status or run.gang.mechanism:  # a gang scheduler holds the pods itself
                started, ensure_errors = await executor.ensure(context, run, spec)
                created, errors = created + started, errors + ensure_errors
        if spec.suspend and ended is None:
            admission = Condition(
                RunCondition.ADMITTED, False, "Suspended",
                "spec.suspend is true: the run holds no GPUs; set it to false (or let Kueue admit it)",
            )  # fmt: skip
    if (spec.suspend and not compute.exists) or (admission is not None and not admission.status):
        start_time = None  # deadlines count from the (re)start; a queued or suspended run holds nothing

    # 6. One status write, from what runs now; Events for its transitions.
    compute = await executor.observe(context, run, spec)
    if errors:
        blocked = Condition(
            RunCondition.PROVISIONING, False, "ApplyFailed",
            f"{'; '.join(errors)[:2000]} (retried with backoff; check the operator's RBAC and quotas)",
        )  # fmt: skip
    state = RunState(
        blocked, suspend, suspend_message, compute.ready, compute.ready_message, driver,
        compute.driver_message, previous.get("step"), spec.algorithm.steps, compute.starting_reason,
        admission, failure,
    )  # fmt: skip
    await _write_status(
        context, body, ref, state, generation, now, rfc3339(start_time) if start_time else None,
        created, removed,
    )  # fmt: skip
    if errors:
        return context.queue.error_backoff
    if newly_ended:
        return 0.0  # now remove the compute
    if suspend == "checkpointing":
        return CHECKPOINT_POLL_SECONDS
    return None if ended is not None else context.config.sync_period


async def _admit(
    context: OperatorContext, body: Manifest, run: RunContext, spec: TrainingRunSpec, started: bool
) -> tuple[Condition, RunContext]:
    """(Admitted condition, the run with its gang scheduling). An installed gang scheduler (Kueue,
    coscheduling, Volcano) decides for itself: the pods are created at once and wait in it. Otherwise
    a run that holds its compute is admitted, and one that does not must fit whole now."""
    gang = worker_gpus(spec)
    if not context.executor.gang_admission:
        return Condition(
            RunCondition.ADMITTED, True, "LocalExecutor", "the trainer runs as a process on this machine"
        ), run
    labels = body["metadata"].get("labels") or {}
    scheduling = await gang_scheduler(context.kube, labels, context.config.gang_scheduler_name)
    run = replace(run, gang=scheduling)
    if scheduling.mechanism:
        pods = context.pods_of((lb.RUN_KIND, run.namespace, run.name))
        return gang_placed(scheduling, pods, 1 + len(gang)), run
    if started:
        return Condition(
            RunCondition.ADMITTED, True, "GangAdmitted", f"{sum(gang)} GPUs in {len(gang)} Ray worker pod(s)"
        ), run
    try:
        available = await read_capacity(context.kube)
    except KubeError as error:
        return Condition(
            RunCondition.ADMITTED, False, "CapacityUnknown",
            f"nodes and pods could not be listed ({error}); the operator needs list on nodes and pods",
        ), run  # fmt: skip
    return gang_condition(gang, available), run


async def decide_failure(
    context: OperatorContext,
    run: RunContext,
    spec: TrainingRunSpec,
    compute: Compute,
    previous: Manifest,
    start_time: datetime | None,
    now: datetime,
) -> Condition | None:
    """The Failed condition of a run that must end now (pure but for reading a failed trainer's log)."""
    policy = spec.run_policy
    last = previous.get("lastCheckpoint") or "none"
    if compute.driver == "complete":
        return None  # a trainer that finished succeeded, however long it took
    if compute.driver == "failed":
        tail = await context.executor.log_tail(context, run, LOG_TAIL_LINES)
        logs = f"\nlast {LOG_TAIL_LINES} log lines of the trainer:\n{tail[-3000:]}" if tail.strip() else ""
        message = f"{compute.driver_message}; last checkpoint: {last}{logs}"
        return Condition(RunCondition.FAILED, True, compute.failure_reason, message)
    if start_time is None:
        return None
    elapsed = int((now - start_time).total_seconds())
    deadline = policy.active_deadline_seconds
    if deadline is not None and elapsed >= deadline:
        return Condition(
            RunCondition.FAILED,
            True,
            "DeadlineExceeded",
            f"the run held its compute for {elapsed} s, past spec.runPolicy.activeDeadlineSeconds="
            f"{deadline}; last checkpoint: {last} (a new run with a larger deadline can start from it)",
        )
    started = previous.get("phase") in (RunPhase.WARMING_UP, RunPhase.RUNNING) or (
        compute.ready and compute.driver == "active"
    )
    if not started and elapsed >= policy.start_timeout_seconds:
        reason, detail = compute.stuck or (
            "StartTimeout",
            compute.ready_message if not compute.ready else compute.driver_message,
        )
        return Condition(
            RunCondition.FAILED,
            True,
            reason,
            f"not started within spec.runPolicy.startTimeoutSeconds={policy.start_timeout_seconds}: {detail}",
        )
    return None


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
        pool=_observed_pool(context, meta["namespace"], spec),
    )


def _observed_pool(context: OperatorContext, namespace: str, spec: TrainingRunSpec) -> SandboxPoolSpec | None:
    """The run's SandboxPool spec as the watch shows it (None while absent or invalid: its own
    reconciler reports that); the episodes' device comes from it."""
    body = context.owner((lb.POOL_KIND, namespace, spec.sandbox_pool_ref.name))
    if body is None:
        return None
    try:
        return SandboxPoolSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return None


def _ended(status: Manifest) -> Condition | None:
    """The Succeeded or Failed condition of a run that has ended, as the status records it."""
    for kind in TERMINAL:
        found = find(status.get("conditions"), kind)
        if found is not None and found.get("status") == "True":
            return Condition(kind, True, str(found.get("reason")), str(found.get("message") or ""))
    return None


def _previous_status(context: OperatorContext, key: Key, body: Manifest) -> Manifest:
    """The run's status with the operator's own fields as this process last wrote them: the watch may
    not show that write yet, and a pass must never act on an older picture (restart an ended run)."""
    status = dict(body.get("status") or {})
    _, written = context.status_written.get(key, (0.0, {}))
    if context.written_uids.get(key) != body["metadata"].get("uid"):
        return status  # a run deleted and created again under the same name starts from its own status
    return {**status, **written}


async def _write_status(
    context: OperatorContext,
    body: Manifest,
    ref: Ref,
    state: RunState,
    generation: int,
    now: datetime,
    start_time: str | None,
    created: Sequence[str] = (),
    removed: Sequence[str] = (),
) -> None:
    """The pass's one status write (operator-owned fields only), skipped when nothing changed; then
    an Event per transition and one log line."""
    key = (ref.kind, ref.namespace, ref.name)
    previous = _previous_status(context, key, body)
    phase, decided = decide_conditions(state)
    status = TrainingRunStatus(observed_generation=generation, phase=phase).model_dump(
        by_alias=True, exclude_none=True, mode="json", include={"observed_generation", "phase"}
    )
    status["conditions"] = merge_conditions(
        previous.get("conditions"), decided, generation=generation, now=now
    )
    status["startTime"] = start_time
    if phase == RunPhase.QUEUED:
        context.queued_runs.add(key)
    else:
        context.queued_runs.discard(key)
    changes = changed_fields(previous, status)
    if changes:
        try:
            await context.kube.merge_patch(ref, {"status": status}, subresource="status")
        except KubeError as error:
            log.warning("status of TrainingRun %s/%s not written: %s", ref.namespace, ref.name, error)
            return
        context.status_written[key] = (time.monotonic(), status)
        context.written_uids[key] = body["metadata"].get("uid", "")
        events = condition_events(previous, status, _is_problem)
        if "phase" in changes:  # the phase's Event tells what its condition's Event would repeat
            events = [e for e in events if e.reason != str(phase)]
            driving = find(status["conditions"], PHASE_CONDITION.get(phase, ""))
            detail = f"{driving.get('reason')}: {driving.get('message')}" if driving else ""
            events.insert(0, Event(phase == RunPhase.FAILED, str(phase), f"phase {phase}: {detail}"))
        await post(context, body, events)
    log_pass(ref.kind, ref.namespace, ref.name, created=list(created), removed=list(removed), **changes)


# The condition whose message explains a phase (the phase's Event carries it).
PHASE_CONDITION = {
    RunPhase.PENDING: RunCondition.PROVISIONING,
    RunPhase.QUEUED: RunCondition.ADMITTED,
    RunPhase.WARMING_UP: RunCondition.WARMING_UP,
    RunPhase.RUNNING: RunCondition.TRAINING,
    RunPhase.SUSPENDED: RunCondition.SUSPENDED,
    RunPhase.SUCCEEDED: RunCondition.SUCCEEDED,
    RunPhase.FAILED: RunCondition.FAILED,
}
HEALTHY_PROVISIONING = ("Provisioned", "RunFinished", "Suspended", "Queued")


def _is_problem(condition: Mapping[str, Any]) -> bool:
    """A condition a person should look at: a failure, a blocked start, a run that cannot fit."""
    kind, status, reason = condition.get("type"), condition.get("status"), condition.get("reason")
    if kind == RunCondition.FAILED:
        return status == "True"
    if kind == RunCondition.PROVISIONING:
        return status == "False" and reason not in HEALTHY_PROVISIONING
    return kind == RunCondition.ADMITTED and reason in ("GangTooLarge", "CapacityUnknown")
