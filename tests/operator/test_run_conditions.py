"""TrainingRun phase and conditions from what the operator observed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.operator import labels as lb
from cuda_agent.operator.conditions import Condition, merge_conditions
from cuda_agent.operator.executor import driver_state, ray_state
from cuda_agent.operator.run_reconciler import RunState, decide_conditions, run_events
from cuda_agent.operator.views import PodView


def state(**changes: Any) -> RunState:
    base: dict[str, Any] = {
        "blocked": None,
        "suspend": None,
        "suspend_message": "",
        "ray_ready": True,
        "ray_message": "",
        "driver": "active",
        "driver_message": "",
        "step": None,
        "steps": 150,
    }
    return RunState(**{**base, **changes})


@pytest.mark.parametrize(
    ("changes", "phase", "true_condition"),
    [
        ({"ray_ready": False, "driver": "absent"}, "Pending", "Provisioning"),
        ({"driver": "pending"}, "Pending", "Provisioning"),
        ({}, "WarmingUp", "WarmingUp"),
        ({"step": 3}, "Running", "Training"),
        ({"suspend": "suspended", "driver": "absent", "ray_ready": False}, "Suspended", "Suspended"),
        ({"driver": "complete", "step": 150}, "Succeeded", "Succeeded"),
        ({"driver": "failed", "driver_message": "BackoffLimitExceeded"}, "Failed", "Failed"),
    ],
)
def test_exactly_one_lifecycle_condition_is_true(
    changes: dict[str, Any], phase: str, true_condition: str
) -> None:
    decided_phase, conditions = decide_conditions(state(**changes))
    assert decided_phase == phase
    assert [c.type for c in conditions if c.status] == [true_condition]


def test_blocked_run_names_the_reason() -> None:
    missing = Condition(
        RunCondition.PROVISIONING, False, "SandboxPoolNotFound", "SandboxPool team/pool does not exist"
    )
    phase, conditions = decide_conditions(state(blocked=missing, driver="absent", ray_ready=False))
    provisioning = next(c for c in conditions if c.type == "Provisioning")
    assert phase == "Pending"
    assert (provisioning.reason, provisioning.message) == ("SandboxPoolNotFound", missing.message)


def test_checkpointing_is_not_yet_suspended() -> None:
    # The trainer still trains while it writes its suspension checkpoint: the phase stays Running.
    phase, conditions = decide_conditions(state(suspend="checkpointing", step=12))
    suspended = next(c for c in conditions if c.type == "Suspended")
    assert (suspended.status, suspended.reason) == (False, "Checkpointing")
    assert phase == "Running"


def test_every_condition_says_why() -> None:
    for changes in ({}, {"driver": "absent", "ray_ready": False}, {"driver": "complete"}):
        _, conditions = decide_conditions(state(**changes))
        assert all(c.message for c in conditions), conditions


def test_provisioned_says_what_the_executor_runs() -> None:
    """No fixed 'the Ray cluster is ready' where a run has none: the executor's own words, e.g. a local
    run's sandbox server and trainer process with the trainer's /metrics address."""
    local = state(
        ray_message="local sandbox server at http://127.0.0.1:4100",
        driver_message="trainer running, pid 7, /metrics on http://127.0.0.1:4101",
    )
    provisioning = next(c for c in decide_conditions(local)[1] if c.type == "Provisioning")
    assert (provisioning.status, provisioning.reason) == (False, "Provisioned")
    assert provisioning.message == (
        "local sandbox server at http://127.0.0.1:4100; trainer running, pid 7, /metrics on http://127.0.0.1:4101"
    )
    cluster = state(ray_message="2/2 Ray pods ready", driver_message="trainer running")
    provisioning = next(c for c in decide_conditions(cluster)[1] if c.type == "Provisioning")
    assert provisioning.message == "2/2 Ray pods ready; trainer running"


def test_a_run_that_does_not_fit_is_queued_with_the_reason() -> None:
    waiting = Condition(RunCondition.ADMITTED, False, "InsufficientGPU", "waiting for 80 GPUs")
    phase, conditions = decide_conditions(state(admission=waiting, driver="absent", ray_ready=False))
    assert phase == "Queued"
    provisioning = next(c for c in conditions if c.type == "Provisioning")
    assert (provisioning.reason, provisioning.message) == ("Queued", "waiting for 80 GPUs")


def test_a_failure_ends_the_run_with_its_own_reason() -> None:
    oom = Condition(RunCondition.FAILED, True, "OOMKilled", "OOMKilled (exit 137)")
    phase, conditions = decide_conditions(state(failure=oom, driver="failed"))
    failed = next(c for c in conditions if c.type == "Failed")
    assert (phase, failed.reason, failed.message) == ("Failed", "OOMKilled", "OOMKilled (exit 137)")


def driver(
    phase: str, restarts: int = 0, last_exit: str | None = None, exit_reason: str | None = None
) -> PodView:
    return PodView(
        "run-driver", phase, phase == "Running", None, None, None, False, (), restarts, last_exit, exit_reason
    )


def test_driver_state_follows_the_driver_pod() -> None:
    assert driver_state(None, 3)[0] == "absent"
    assert driver_state(driver("Pending"), 3)[0] == "pending"
    assert driver_state(driver("Running", restarts=3), 3)[0] == "active"
    assert driver_state(driver("Succeeded"), 3)[0] == "complete"
    state, message, reason = driver_state(driver("Running", 4, "Error (exit 1)", "Error"), 3)
    assert (state, reason) == ("failed", "BackoffLimitExceeded")
    assert "4 times" in message and "Error (exit 1)" in message
    assert driver_state(driver("Running", 1, "OOMKilled (exit 137)", "OOMKilled"), 0)[2] == "OOMKilled"
    evicted = driver_state(driver("Failed", last_exit="Evicted: node lost"), 3)
    assert evicted[1].endswith("Evicted: node lost") and evicted[2] == "DriverPodFailed"


NOW = datetime(2026, 12, 3, 6, 0, tzinfo=UTC)


def written(run: RunState, previous: dict[str, Any]) -> dict[str, Any]:
    """The status a pass writes for `run` over `previous` (phase and merged conditions)."""
    phase, decided = decide_conditions(run)
    conditions = merge_conditions(previous.get("conditions"), decided, generation=1, now=NOW)
    return {"phase": str(phase), "conditions": conditions}


def transitions(previous: dict[str, Any], status: dict[str, Any]) -> set[str]:
    before = {c["type"]: (c["status"], c["reason"]) for c in previous.get("conditions") or ()}
    return {
        c["type"]
        for c in status["conditions"]
        if before.get(c["type"], (None, None)) != (c["status"], c["reason"])
    }


def test_one_event_per_condition_transition_and_the_phase_on_the_condition_behind_it() -> None:
    """A run's life, pass by pass: every condition that changed is told once (reason = its new reason),
    the new phase rides on the Event of the condition behind it, and a pass that changed no condition
    (the same state again, or only the step count) posts nothing."""
    queued = Condition(RunCondition.ADMITTED, False, "InsufficientGPU", "80 GPUs needed, 48 free")
    admitted = Condition(RunCondition.ADMITTED, True, "GangAdmitted", "80 GPUs in 10 Ray worker pod(s)")
    oom = Condition(RunCondition.FAILED, True, "OOMKilled", "exit 137")
    life = [
        state(admission=queued, ray_ready=False, driver="absent"),
        state(admission=admitted, ray_ready=False, driver="absent", ray_message="0/11 Ray pods ready"),
        state(admission=admitted),
        state(admission=admitted, step=3),
        state(admission=admitted, step=4),
        state(admission=admitted, step=4, failure=oom, driver="failed"),
    ]
    previous: dict[str, Any] = {}
    told: list[list[tuple[str, str, bool]]] = []
    for run in life:
        status = written(run, previous)
        events = run_events(previous, status)
        assert run_events(status, status) == []  # the same status again: nothing
        changed = (
            transitions(previous, status)
            if previous
            else {
                c["type"]
                for c in status["conditions"]
                if c["status"] == "True" or c["reason"] == "InsufficientGPU"
            }
        )
        assert sorted(e.condition for e in events) == sorted(changed)  # one per transition, no repeats
        told.append([(e.condition, e.reason, e.warning) for e in events if e.message.startswith("phase ")])
        previous = status
    assert told == [
        [("Admitted", "InsufficientGPU", False)],  # Queued: the reason it waits, though first written False
        [("Provisioning", "StartingRayCluster", False)],  # Pending
        [("WarmingUp", "WarmUpStages", False)],
        [("Training", "PpoSteps", False)],  # Running
        [],  # step 4: no new phase, and no condition changed
        [("Failed", "OOMKilled", True)],
    ]
    assert run_events(written(life[3], {}), written(life[4], written(life[3], {}))) == []


def test_ray_pods_ready_counts_only_the_pods_the_spec_asks_for() -> None:
    """A worker left from an earlier, larger spec (pods are never updated) and a terminating one are not
    ready pods of this cluster: never "3/2 Ray pods ready"."""

    def ray_pod(name: str, component: str, ready: bool = True, terminating: bool = False) -> PodView:
        return PodView(name, "Running", ready, None, None, None, terminating, ((lb.COMPONENT, component),))

    head, worker = lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER
    expected = ["run-ray-head", "run-ray-worker-0"]
    left_over = [ray_pod("run-ray-head", head), ray_pod("run-ray-worker-0", worker, ready=False)]
    left_over += [ray_pod("run-ray-worker-1", worker), ray_pod("run-ray-worker-0", worker, terminating=True)]
    assert ray_state(False, None, left_over, expected) == (False, "1/2 Ray pods ready")
    up = [
        ray_pod("run-ray-head", head),
        ray_pod("run-ray-worker-0", worker),
        ray_pod("run-ray-worker-1", worker),
    ]
    assert ray_state(False, None, up, expected) == (True, "2/2 Ray pods ready")
    assert ray_state(False, None, [], []) == (False, "0/0 Ray pods ready")
