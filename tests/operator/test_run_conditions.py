"""TrainingRun phase and conditions from what the operator observed."""

from __future__ import annotations

from typing import Any

import pytest

from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.operator.conditions import Condition
from cuda_agent.operator.executor import driver_state
from cuda_agent.operator.run_reconciler import RunState, decide_conditions
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
