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
    phase, conditions = decide_conditions(state(suspend="checkpointing", step=12))
    suspended = next(c for c in conditions if c.type == "Suspended")
    assert (suspended.status, suspended.reason) == (False, "Checkpointing")
    assert phase == "Pending"


def driver(phase: str, restarts: int = 0, last_exit: str | None = None) -> PodView:
    return PodView("run-driver", phase, phase == "Running", None, None, None, False, (), restarts, last_exit)


def test_driver_state_follows_the_driver_pod() -> None:
    assert driver_state(None)[0] == "absent"
    assert driver_state(driver("Pending"))[0] == "pending"
    assert driver_state(driver("Running", restarts=2))[0] == "active"
    assert driver_state(driver("Succeeded"))[0] == "complete"
    state, message = driver_state(driver("Running", restarts=3, last_exit="Error (exit 1)"))
    assert state == "failed" and "3 times" in message and "Error (exit 1)" in message
    assert driver_state(driver("Failed", last_exit="Evicted: node lost"))[1].endswith("Evicted: node lost")
