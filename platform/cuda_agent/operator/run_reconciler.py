"""One reconcile pass of a TrainingRun: a flat, ordered list of steps and one status write.

Suspension: `spec.suspend: true` (from a person or a controller; Kueue has no TrainingRun integration
and never sets it, docs/operator.md) first asks the
trainer for a checkpoint (condition Suspended=False, reason Checkpointing: the trainer watches its own
run, writes one and reports it in `status.lastCheckpoint`), then stops the compute (the Ray cluster and
driver pods, or the local processes: see executor.py); `false` starts it again with
`CUDA_AGENT_RESUME_FROM` set to the last checkpoint (one under the run's own prefix). A run created
suspended never starts anything. The trainer owns `step`, `metrics` and `lastCheckpoint`; the operator
owns `phase`, `conditions`, `observedGeneration` and `startTime`, and writes them over whatever else put
there: it decides from its own record (run_record.py), never from the status.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import ValidationError

from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.api.trainingrun import TrainingRunPhase as RunPhase
from cuda_agent.api.trainingrun import TrainingRunSpec, TrainingRunStatus
from cuda_agent.operator import labels as lb
from cuda_agent.operator.admission import (
    Gangs,
    gang_condition,
    gang_placed,
    gang_scheduler,
    read_capacity,
)
from cuda_agent.operator.apply import apply_changed
from cuda_agent.operator.compute import Compute
from cuda_agent.operator.conditions import (
    Condition,
    find,
    merge_conditions,
    parse_rfc3339,
    rfc3339,
    trusted_time,
)
from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.events import Event, changed_fields, condition_events, log_pass, post
from cuda_agent.operator.executor import LOG_TAIL_LINES
from cuda_agent.operator.kube import KubeError, Manifest, Ref
from cuda_agent.operator.run_children import (
    RunContext,
    role,
    role_binding,
    run_config,
    service_account,
    worker_gpus,
)
from cuda_agent.operator.run_record import (
    MAX_MESSAGE,
    REASON,
    STARTED_AT,
    RunRecord,
    read_record,
    record_patch,
)
from cuda_agent.operator.tenancy import (
    ARTIFACTS_ENV_NAMES,
    TRAINER_IMAGE_ANNOTATION,
    default_checkpoint_prefix,
    namespace_root,
    resume_point,
    within,
)
from cuda_agent.operator.views import ChildView
from cuda_agent.operator.workqueue import Key

log = logging.getLogger(__name__)
CHECKPOINT_POLL_SECONDS = 2.0
RELEASE_SECONDS = 2.0  # after a run lets go of its pods, when queued runs check the capacity again
TERMINAL = (RunCondition.SUCCEEDED, RunCondition.FAILED)
NEWEST = "the newest checkpoint under its prefix, if any"  # what the trainer resumes from by itself


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
        # The executor's own words for both (a local run has no Ray cluster: its sandbox server and trainer
        # process, with the trainer's /metrics address).
        message = f"{state.ray_message}; {state.driver_message}"
        provisioning = Condition(RunCondition.PROVISIONING, False, "Provisioned", message)
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


async def validate_run(
    context: OperatorContext, body: Manifest, spec: TrainingRunSpec
) -> tuple[Condition | None, tuple[str, ...]]:
    """What admission cannot check, and what is the operator's to allow: the trainer image, the
    checkpoint prefix (inside the namespace's storage), the pool and the artifacts Secret (it exists and
    parses). Returns (why the run cannot start, the Secret's storage keys the trainer gets)."""
    from cuda_agent.storage.config import StorageConfig
    from cuda_agent.storage.errors import StorageConfigError

    config = context.config
    namespace = body["metadata"]["namespace"]
    image = (body["metadata"].get("annotations") or {}).get(TRAINER_IMAGE_ANNOTATION)
    if image is not None and image not in config.allowed_trainer_images:
        allowed = ", ".join(config.allowed_trainer_images) or "none"
        return Condition(
            RunCondition.PROVISIONING, False, "TrainerImageNotAllowed",
            f"annotation {TRAINER_IMAGE_ANNOTATION}={image[:200]!r} names an image the cluster admin has not "
            f"allowed (the operator's --allowed-trainer-image: {allowed}): remove the annotation to run "
            f"{config.trainer_image}",
        ), ()  # fmt: skip
    root = namespace_root(config.artifacts_bucket, namespace)
    prefix = spec.checkpoint.prefix
    if prefix is not None and not within(prefix, root):
        return Condition(
            RunCondition.PROVISIONING, False, "CheckpointPrefixNotAllowed",
            f"spec.checkpoint.prefix {prefix[:300]!r} is outside this namespace's storage {root}: name a "
            f"prefix under it, or leave it out (the run then uses {root}<run>/<uid>/checkpoints)",
        ), ()  # fmt: skip
    pool = spec.sandbox_pool_ref.name
    if context.owner((lb.POOL_KIND, namespace, pool)) is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "SandboxPoolNotFound",
            f"SandboxPool {namespace}/{pool} does not exist: create it or fix spec.sandboxPoolRef.name "
            f"(checked again every {config.sync_period:g} s)",
        ), ()
    secret_name = config.artifacts_secret
    secret = await context.kube.get(Ref("Secret", namespace, secret_name))
    if secret is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "ArtifactsSecretNotFound",
            f"Secret {namespace}/{secret_name} (MinIO/S3 endpoint and credentials) does not exist: create "
            "it with AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or start the operator "
            "with --artifacts-secret naming yours",
        ), ()
    try:
        storage = StorageConfig.from_secret(secret)
    except StorageConfigError as error:
        return Condition(
            RunCondition.PROVISIONING, False, "ArtifactsSecretInvalid", f"{error}: fix Secret {secret_name}"
        ), ()
    if storage.endpoint is None:
        return Condition(
            RunCondition.PROVISIONING,
            False,
            "ArtifactsSecretInvalid",
            f"Secret {namespace}/{secret_name} names no S3 endpoint: add AWS_ENDPOINT_URL",
        ), ()
    keys = {*(secret.get("data") or {}), *(secret.get("stringData") or {})}
    return None, tuple(name for name in ARTIFACTS_ENV_NAMES if name in keys)


def _suspend_step(
    config: OperatorConfig,
    record: RunRecord,
    last: str,
    compute_exists: bool,
    driver: str,
    now: datetime,
) -> tuple[str, str, bool, RunRecord]:
    """(suspend state, message, delete compute now, the record) for a run with spec.suspend true;
    `last` is the run's last checkpoint under its own prefix ("" for none)."""
    if not compute_exists:
        return "suspended", f"scaled to zero; resumes from {last or NEWEST}", False, record
    if record.suspend_requested_at is None or record.checkpoint_before is None:
        # Remember when suspension was asked for and which checkpoint existed then.
        record = replace(record, suspend_requested_at=now, checkpoint_before=last)
    requested, before = record.suspend_requested_at or now, record.checkpoint_before
    if last and last != before:
        return "suspended", f"checkpoint {last} written: scaled to zero; resumes from {last}", True, record
    if now - requested >= timedelta(seconds=config.suspend_checkpoint_timeout):
        message = f"no new checkpoint within the timeout: scaled to zero; resumes from {last or NEWEST}"
        return "suspended", message, True, record
    if driver == "complete":
        # The trainer exits 0 right after reporting its checkpoint: wait for that report to show.
        message = "the trainer exited after its checkpoint; waiting for its report"
        return "checkpointing", message, False, record
    if driver != "active":
        return "suspended", "no trainer was running: scaled to zero", True, record
    return "checkpointing", "waiting for the trainer's checkpoint before scaling to zero", False, record


@dataclass
class RunPass:
    """One reconcile pass of a run: what it read at its start, then each step's part, in step order (a
    step reads only what the steps before it filled in). `record` is the operator's own record, which
    the steps update and the pass writes once, before its one status write."""

    context: OperatorContext
    body: Manifest
    spec: TrainingRunSpec
    run: RunContext
    now: datetime
    previous: Manifest  # the status as the basis shows it: read for the trainer's progress (and _adopted_end)
    annotations: Mapping[str, str]
    problems: Sequence[str]  # record annotations that were not valid (rewritten, with a Warning Event)
    record: RunRecord
    children: Mapping[tuple[str, str], ChildView]
    progress: int | None  # the trainer's reported step
    last: str  # the last checkpoint under the run's own prefix ("" for none)
    blocked: Condition | None  # why the run cannot start (validate_run)
    ended: Condition | None  # the recorded end (or one an earlier operator version left in the status)
    # _apply_identity, then _admit_and_start: what was created, and apply errors as text
    created: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # _observe_compute (the trainer's state, as the run's end and suspension read it)
    compute: Compute = field(init=False, repr=False)
    driver: str = "absent"
    # _decide_suspension
    suspend: str | None = None  # None, "checkpointing" or "suspended"
    suspend_message: str = ""
    delete_now: bool = False  # the suspension checkpoint is there (or will not come): remove the compute
    # _decide_end
    failure: Condition | None = None
    newly_ended: bool = False
    # _decide_suspension, _release_compute or _admit_and_start (at most one of them sets it)
    admission: Condition | None = None
    removed: list[str] = field(default_factory=list)
    # _observe_again
    existed: bool = False  # whether compute existed before this pass's changes

    @property
    def key(self) -> Key:
        return (lb.RUN_KIND, self.run.namespace, self.run.name)

    @property
    def ref(self) -> Ref:
        return Ref(lb.RUN_KIND, self.run.namespace, self.run.name)

    @property
    def may_start(self) -> bool:
        """Whether this pass may admit the run and create its compute."""
        return self.ended is None and not self.newly_ended and not self.spec.suspend and self.blocked is None


RunStep = Callable[[RunPass], Awaitable[None]]


async def reconcile_run(context: OperatorContext, namespace: str, name: str) -> float | None:
    """Converge one TrainingRun; returns seconds until the next pass is needed (None: on events only).

    Everything it decides comes from what the operator observes (the spec, its children, the pool and
    Secret) and from its own record in the run's annotations (run_record.py); of the status it reads
    only the trainer's progress (`step`, and `lastCheckpoint` when it lies under the run's prefix).
    The steps of RUN_STEPS run in order; then one record write and one status write."""
    key = (lb.RUN_KIND, namespace, name)
    body = context.owner(key)
    if body is None:
        _forget_run(context, key)
        return None
    begun = await _begin(context, key, body)
    if not isinstance(begun, RunPass):
        return begun  # a spec this operator's models refuse: compute stopped, InvalidSpec written
    for step in RUN_STEPS:
        await step(begun)
    return await _conclude(begun)


def _forget_run(context: OperatorContext, key: Key) -> None:
    """A deleted run: pods go by owner reference, local processes stop, queued runs look again."""
    context.forget(key)
    context.executor.forget(key[1], key[2])
    for queued in context.queued_runs:  # its GPUs free up once the garbage collector is done
        context.queue.add_after(queued, RELEASE_SECONDS)


async def _begin(context: OperatorContext, key: Key, body: Manifest) -> RunPass | float:
    """What the pass starts from: the record, the trainer's progress, the children, and what admission
    cannot validate (the spec against this operator's models, then what is the operator's to allow:
    image, checkpoint prefix; and the references: pool, Secret). A spec the models refuse ends the
    pass here (its seconds until the next one)."""
    now = datetime.now(UTC)
    previous, annotations = context.basis(key, body)
    record, problems = read_record(annotations, now, parse_rfc3339(body["metadata"].get("creationTimestamp")))
    children = context.children_of(key)
    progress = previous.get("step") if isinstance(previous.get("step"), int) else None
    try:
        spec = TrainingRunSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        ref = Ref(*key)
        return await _unreadable(context, body, ref, error, record, annotations, problems, progress, now)
    ended = record.ended
    blocked, artifacts_keys = (None, ()) if ended else await validate_run(context, body, spec)
    prefix_root = spec.checkpoint.prefix or default_checkpoint_prefix(
        context.config.artifacts_bucket, key[1], key[2], body["metadata"]["uid"]
    )
    last = resume_point(previous.get("lastCheckpoint"), prefix_root) or ""
    return RunPass(
        context=context,
        body=body,
        spec=spec,
        run=_run_context(context, body, spec, prefix_root, last or None, artifacts_keys),
        now=now,
        previous=previous,
        annotations=annotations,
        problems=problems,
        record=record,
        children=children,
        progress=progress,
        last=last,
        blocked=blocked,
        ended=ended,
    )


async def _apply_identity(p: RunPass) -> None:
    """The trainer's identity and run file (kept while suspended; they hold no resources), for a run
    that may start: a run that ended or is blocked creates nothing."""
    if p.ended is not None or p.blocked is not None:
        return
    run = p.run
    children = [service_account(run), role(run), role_binding(run), run_config(run, p.body["spec"])]
    p.created, p.errors = await apply_changed(p.context, children, p.children)


async def _observe_compute(p: RunPass) -> None:
    """What the executor runs now (whether or not the references resolve), and an end an earlier
    operator version kept only in the status."""
    p.compute = await p.context.executor.observe(p.context, p.run, p.spec)
    if p.ended is None:
        p.ended = _adopted_end(p.record, p.previous, p.compute)
    p.driver = p.compute.driver
    if p.ended is not None:
        p.driver = "complete" if p.ended.type == RunCondition.SUCCEEDED else "failed"


async def _decide_suspension(p: RunPass) -> None:
    """spec.suspend: the trainer's checkpoint first, then scale to zero (_suspend_step); otherwise the
    record forgets any earlier suspension."""
    if not p.spec.suspend or p.ended is not None:
        p.record = replace(p.record, suspend_requested_at=None, checkpoint_before=None)
        return
    p.suspend, p.suspend_message, p.delete_now, p.record = _suspend_step(
        p.context.config, p.record, p.last, p.compute.exists, p.driver, p.now
    )
    if p.driver == "complete":
        p.driver = "absent"  # a trainer exits 0 after its suspension checkpoint: the run is not finished
    p.admission = Condition(
        RunCondition.ADMITTED, False, "Suspended",
        "spec.suspend is true: the run holds no GPUs; set it to false to resume",
    )  # fmt: skip


async def _decide_end(p: RunPass) -> None:
    """Why the run ends now, if it does: the trainer's own end, a deadline, a start that never came."""
    p.failure = p.ended if p.ended is not None and p.ended.type == RunCondition.FAILED else None
    if p.ended is None and not p.spec.suspend:
        p.failure = await decide_failure(p.context, p.run, p.spec, p.compute, p.record, p.last, p.now)
    p.newly_ended = p.ended is None and (p.failure is not None or p.driver == "complete")


async def _release_compute(p: RunPass) -> None:
    """Let go of the compute of a run that ended (the end's record, a finished driver pod, stays for
    its logs) or whose suspension checkpoint is done. A run that ends in this pass keeps it until the
    next: the end goes into the record and the status first, so an operator killed in between finds
    the run ended instead of restarting it."""
    if p.ended is None and not p.delete_now:
        return
    context = p.context
    p.removed = await context.executor.remove(context, p.run, keep_finished=not p.spec.suspend)
    if p.removed:  # GPUs free up: queued runs look again once the pods are gone
        for queued in context.queued_runs - {p.key}:
            context.queue.add_after(queued, RELEASE_SECONDS)
    if p.ended is not None:
        p.admission = Condition(
            RunCondition.ADMITTED, False, "RunFinished", "the run ended and released its GPUs"
        )


async def _admit_and_start(p: RunPass) -> None:
    """Admission, then the compute, under the admission lock while the run still has to be admitted,
    so the gang it was checked for exists (as pending pods) before another run is checked. A blocked
    run creates nothing, but what it already runs is still suspended, timed and ended."""
    if not p.may_start:
        return
    context = p.context
    async with context.admission_lock if not p.compute.exists else nullcontext():
        p.admission, p.run = await _admit(context, p.body, p.run, p.spec, p.compute.exists)
        if p.admission.status:
            context.admitted[p.key] = p.body["metadata"]["uid"]
        if p.admission.status or p.run.gang.mechanism:  # a gang scheduler holds the pods itself
            started, errors = await context.executor.ensure(context, p.run, p.spec)
            p.created += started
            p.errors += errors


async def _observe_again(p: RunPass) -> None:
    """What runs after this pass's changes: the status reports it."""
    p.existed = p.compute.exists
    p.compute = await p.context.executor.observe(p.context, p.run, p.spec)


async def _update_record(p: RunPass) -> None:
    """The record's end (a run that ends now) and its clocks (timed)."""
    if p.newly_ended:
        p.record = replace(p.record, ended=p.failure or _succeeded(p.progress, p.spec))
    admitted = p.admission is not None and p.admission.status
    holds = p.ended is None and not p.newly_ended and not p.spec.suspend
    p.record = timed(
        p.record,
        holds=holds and (admitted or (p.admission is None and p.existed)),
        fresh=not p.existed or bool(p.run.gang.mechanism),
        since=p.compute.since,
        running=p.compute.ready and p.compute.driver == "active",
        now=p.now,
    )
    if p.record.started_at is None:
        p.context.admitted.pop(p.key, None)


# A pass's steps, in order; each fills in its part of the RunPass. A refused apply does not stop the
# list (it is reported, ApplyFailed): what the run already runs is still suspended, timed and ended. An
# exception (an API call other than apply failing) stops the pass, and the work queue retries it.
RUN_STEPS: tuple[RunStep, ...] = (
    _apply_identity,
    _observe_compute,
    _decide_suspension,
    _decide_end,
    _release_compute,
    _admit_and_start,
    _observe_again,
    _update_record,
)


def run_state(p: RunPass) -> RunState:
    """What the conditions are decided from, after the steps (pure)."""
    blocked = p.blocked
    if blocked is not None and p.compute.exists and p.ended is None:
        blocked = replace(
            blocked,
            message=f"{blocked.message}. The compute already running keeps its GPUs and is still "
            "suspended, timed and ended as usual; nothing new is created until this is fixed",
        )
    if p.errors:
        blocked = Condition(
            RunCondition.PROVISIONING, False, "ApplyFailed",
            f"{'; '.join(p.errors)[:2000]} (retried with backoff; check the operator's RBAC and quotas)",
        )  # fmt: skip
    compute = p.compute
    return RunState(
        blocked, p.suspend, p.suspend_message, compute.ready, compute.ready_message, p.driver,
        compute.driver_message, p.progress, p.spec.algorithm.steps, compute.starting_reason,
        p.admission, p.failure,
    )  # fmt: skip


def retry_after_error(context: OperatorContext, key: Key) -> float:
    """When to look again after an error this pass handled itself (a refused apply or write): the work
    queue's per-key exponential backoff, as after a pass that raised, but at most --sync-period (a quota
    or RBAC fixed later shows in no watch event)."""
    return context.queue.failed(key, at_most=context.config.sync_period)


def next_pass(p: RunPass) -> float | None:
    """Seconds until the run needs another pass, after a pass whose writes went through and whose
    applies were not refused (pure)."""
    if p.newly_ended:
        return 0.0  # now remove the compute
    if p.suspend == "checkpointing":
        return CHECKPOINT_POLL_SECONDS
    return None if p.ended is not None else p.context.config.sync_period


async def _conclude(p: RunPass) -> float | None:
    """The record (one annotation write when it changed), then one status write from what runs now."""
    context = p.context
    if not await _write_record(context, p.body, p.ref, p.annotations, p.record, p.problems):
        return retry_after_error(context, p.key)
    start = rfc3339(p.record.started_at) if p.record.started_at else None
    generation = int(p.body["metadata"].get("generation", 0))
    state = run_state(p)
    if not await _write_status(context, p.body, p.ref, state, generation, p.now, start, p.created, p.removed):
        return retry_after_error(context, p.key)
    return retry_after_error(context, p.key) if p.errors else next_pass(p)


def timed(
    record: RunRecord, *, holds: bool, fresh: bool, since: datetime | None, running: bool, now: datetime
) -> RunRecord:
    """When the run's deadline and start timeout count from after this pass (pure). Cleared while it
    holds no admitted compute (queued, suspended, ended): they count from each (re)start. Set to the
    admission's moment when `fresh`ly admitted; for compute found without a record (a blocked run's, or
    one an operator that lost the record finds running), to the oldest part of it the apiserver shows
    (`since`). Waiting since the moment the admitted compute is first seen not `running`."""
    if not holds:
        return replace(record, started_at=None, waiting_since=None)
    if record.started_at is None:
        record = replace(record, started_at=now if fresh else since or now)
    if running:
        return replace(record, waiting_since=None)
    return record if record.waiting_since is not None else replace(record, waiting_since=now)


async def _unreadable(
    context: OperatorContext,
    body: Manifest,
    ref: Ref,
    error: ValidationError,
    record: RunRecord,
    annotations: Mapping[str, str],
    problems: Sequence[str],
    step: int | None,
    now: datetime,
) -> float:
    """A spec this operator's models refuse cannot be held to its limits (suspend, deadlines): the
    compute is stopped and the run waits, InvalidSpec, until the spec is fixed."""
    message = str(error).replace("\n", "; ")[:2000]
    blocked = Condition(RunCondition.PROVISIONING, False, "InvalidSpec", f"fix the spec: {message}")
    removed = await context.executor.remove(context, _bare_run(body), keep_finished=True)
    ended = record.ended
    failed = ended if ended is not None and ended.type == RunCondition.FAILED else None
    driver = "complete" if ended is not None and failed is None else "absent"
    state = RunState(blocked, None, "", False, "", driver, "", step, 0, failure=failed)
    record = replace(record, started_at=None, waiting_since=None)
    generation = int(body["metadata"].get("generation", 0))
    key = (ref.kind, ref.namespace, ref.name)
    if not await _write_record(context, body, ref, annotations, record, problems):
        return retry_after_error(context, key)
    if not await _write_status(context, body, ref, state, generation, now, None, removed=removed):
        return retry_after_error(context, key)
    return context.config.sync_period


def _succeeded(step: int | None, spec: TrainingRunSpec) -> Condition:
    return Condition(
        RunCondition.SUCCEEDED, True, "DriverCompleted",
        f"the trainer finished after {step or 0}/{spec.algorithm.steps} steps",
    )  # fmt: skip


def _adopted_end(record: RunRecord, status: Manifest, compute: Compute) -> Condition | None:
    """The end of a run an earlier operator version ended, which kept the end only in the status: taken
    over only when the run has no record of this operator's at all and holds no compute (a forged end
    of a running run is not an end)."""
    if record != RunRecord() or (compute.exists and compute.driver not in ("complete", "failed")):
        return None
    for kind in TERMINAL:
        found = find(status.get("conditions"), kind)
        if found is not None and found.get("status") == "True":
            reason = str(found.get("reason") or "")
            reason = reason if REASON.fullmatch(reason) else "Ended"
            return Condition(kind, True, reason, str(found.get("message") or "")[:MAX_MESSAGE])
    return None


async def _write_record(
    context: OperatorContext,
    body: Manifest,
    ref: Ref,
    annotations: Mapping[str, str],
    record: RunRecord,
    problems: Sequence[str],
) -> bool:
    """The pass's one annotation write, when the record changed or an annotation was not valid (then
    also a Warning Event naming it); False when the write was refused."""
    patch = record_patch(annotations, record)
    if not patch:
        return True
    try:
        answer = await context.kube.merge_patch(ref, {"metadata": {"annotations": patch}})
    except KubeError as error:
        log.warning("record of TrainingRun %s/%s not written: %s", ref.namespace, ref.name, error)
        return False
    context.wrote((ref.kind, ref.namespace, ref.name), body, answer, annotations=patch)
    if problems:
        message = "; ".join(problems) + ": ignored and rewritten (these annotations are the operator's)"
        await post(context, body, [Event(True, "InvalidAnnotation", message[:1000])])
    return True


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
        available = await read_capacity(context.kube, _admitted_gangs(context))
    except KubeError as error:
        return Condition(
            RunCondition.ADMITTED, False, "CapacityUnknown",
            f"nodes and pods could not be listed ({error}); the operator needs list on nodes and pods",
        ), run  # fmt: skip
    return gang_condition(gang, available), run


def _admitted_gangs(context: OperatorContext) -> Gangs:
    """The Ray worker pods (and their GPUs) of every run this operator admitted, by its record (or by
    this process's memory, until the record shows in the watch)."""
    gangs: dict[tuple[str, str], dict[str, int]] = {}
    now = datetime.now(UTC)
    for key in list(context.owners):
        body = context.owner(key) if key[0] == lb.RUN_KIND else None
        if body is None:
            continue
        uid = str(body["metadata"].get("uid"))
        _, annotations = context.basis(key, body)
        if trusted_time(annotations.get(STARTED_AT), now) is None and context.admitted.get(key) != uid:
            continue
        try:
            spec = TrainingRunSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            continue
        workers = enumerate(worker_gpus(spec))
        gangs[(key[1], uid)] = {lb.ray_worker_name(key[2], i): gpus for i, gpus in workers}
    return gangs


async def decide_failure(
    context: OperatorContext,
    run: RunContext,
    spec: TrainingRunSpec,
    compute: Compute,
    record: RunRecord,
    last_checkpoint: str,
    now: datetime,
) -> Condition | None:
    """The Failed condition of a run that must end now (pure but for reading a failed trainer's log).
    Deadlines count from the admission in the operator's record; the start timeout from the moment the
    admitted compute was last seen not running (its first start, or a pod recreated later that cannot
    be placed)."""
    policy = spec.run_policy
    last = last_checkpoint or "none"
    if compute.driver == "complete":
        return None  # a trainer that finished succeeded, however long it took
    if compute.driver == "failed":
        tail = await context.executor.log_tail(context, run, LOG_TAIL_LINES)
        logs = f"\nlast {LOG_TAIL_LINES} log lines of the trainer:\n{tail[-3000:]}" if tail.strip() else ""
        message = f"{compute.driver_message}; last checkpoint: {last}{logs}"
        return Condition(RunCondition.FAILED, True, compute.failure_reason, message)
    if record.started_at is None:
        return None
    elapsed = int((now - record.started_at).total_seconds())
    deadline = policy.active_deadline_seconds
    if deadline is not None and elapsed >= deadline:
        return Condition(
            RunCondition.FAILED,
            True,
            "DeadlineExceeded",
            f"the run held its compute for {elapsed} s, past spec.runPolicy.activeDeadlineSeconds="
            f"{deadline}; last checkpoint: {last} (a new run with a larger deadline can start from it)",
        )
    running = compute.ready and compute.driver == "active"
    waiting = record.waiting_since
    if running or waiting is None or (now - waiting).total_seconds() < policy.start_timeout_seconds:
        return None
    reason, detail = compute.stuck or (
        "StartTimeout",
        compute.ready_message if not compute.ready else compute.driver_message,
    )
    when = (
        "not started" if waiting <= record.started_at else f"not running again since {rfc3339(waiting)}, and"
    )
    return Condition(
        RunCondition.FAILED,
        True,
        reason,
        f"{when} within spec.runPolicy.startTimeoutSeconds={policy.start_timeout_seconds}: {detail}",
    )


def _run_context(
    context: OperatorContext,
    body: Manifest,
    spec: TrainingRunSpec,
    prefix: str,
    resume_from: str | None,
    artifacts_keys: tuple[str, ...],
) -> RunContext:
    meta = body["metadata"]
    image = (meta.get("annotations") or {}).get(TRAINER_IMAGE_ANNOTATION)
    return RunContext(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta["uid"],
        image=image if image in context.config.allowed_trainer_images else context.config.trainer_image,
        artifacts_secret=context.config.artifacts_secret,
        checkpoint_prefix=prefix,
        otel_endpoint=context.config.otel_endpoint,
        resume_from=resume_from,
        pod_annotations=context.config.trainer_pod_annotations,
        pool=_observed_pool(context, meta["namespace"], spec),
        artifacts_keys=artifacts_keys,
    )


def _bare_run(body: Manifest) -> RunContext:
    """Enough of a run to stop its compute (a spec this operator cannot read)."""
    meta = body["metadata"]
    return RunContext(meta["name"], meta["namespace"], meta["uid"], "", "", "", None, None)


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
) -> bool:
    """The pass's one status write (operator-owned fields only), skipped when the apiserver already
    holds it (a value forged since the operator's last write is written over); then an Event per
    transition and one log line. False when the write was refused."""
    key = (ref.kind, ref.namespace, ref.name)
    previous, _ = context.basis(key, body)
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
    if changes or _foreign(previous.get("conditions"), status["conditions"]):
        try:
            answer = await context.kube.merge_patch(ref, {"status": status}, subresource="status")
        except KubeError as error:
            log.warning("status of TrainingRun %s/%s not written: %s", ref.namespace, ref.name, error)
            return False
        context.wrote(key, body, answer, status=status)
        await post(context, body, run_events(previous, status))
    log_pass(ref.kind, ref.namespace, ref.name, created=list(created), removed=list(removed), **changes)
    return True


def run_events(previous: Mapping[str, Any], status: Mapping[str, Any]) -> list[Event]:
    """One Event per condition transition (pure); a new phase is told on the Event of the condition
    behind it (its message starts "phase P;"), which is posted even when that condition did not change,
    rather than as an Event of its own that would repeat it."""
    phase = status.get("phase")
    new = phase != previous.get("phase")
    behind = next((str(kind) for each, kind in PHASE_CONDITION.items() if new and each == phase), None)
    events = condition_events(previous, status, _is_problem, also=behind)
    return [replace(e, message=f"phase {phase}; {e.message}") if e.condition == behind else e for e in events]


def _foreign(before: object, after: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the stored conditions hold more than the operator writes (types it does not own, or a
    changed message), which `changed_fields` does not show."""
    if not isinstance(before, list):
        return before is not None
    return [dict(c) for c in before if isinstance(c, Mapping)] != [dict(c) for c in after]


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
