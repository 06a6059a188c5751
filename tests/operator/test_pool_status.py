"""SandboxPool status from what a pass observed, and the rate limit on count-only status writes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cuda_agent.api.sandboxpool import SandboxPoolConditionType as PoolCondition
from cuda_agent.operator.autoscaler import PodLoad
from cuda_agent.operator.conditions import Condition
from cuda_agent.operator.drain import DrainPlan
from cuda_agent.operator.pool_children import PoolIdentity
from cuda_agent.operator.pool_reconciler import PoolObservation, pool_status, status_write_delay
from cuda_agent.operator.views import PodView

POOL = PoolIdentity("pool", "ns", "uid")
NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
STABLE = DrainPlan(0, (), (), ())


def pod(i: int, ready: bool = True, unschedulable: str | None = None) -> PodView:
    phase = "Pending" if unschedulable else "Running"
    return PodView(f"pool-{i}", phase, ready, None, unschedulable, None, False, ())


def status(pods: list[PodView], desired: int) -> dict[str, Any]:
    observed = PoolObservation(1, desired, desired, pods, None, STABLE, ())
    return pool_status(POOL, observed, {}, NOW)


def conditions(result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in result["conditions"]}


def test_all_ready() -> None:
    result = status([pod(0), pod(1)], 2)
    assert (result["replicas"], result["readyReplicas"]) == (2, 2)
    assert conditions(result) == {
        "Ready": ("True", "AllReplicasReady"),
        "Scaling": ("False", "Stable"),
        "Degraded": ("False", "AsExpected"),
        "LoadReported": ("Unknown", "NotRead"),
    }
    assert "activeSessions" not in result  # nobody was asked


def test_unschedulable_pods_make_the_pool_degraded_with_the_schedulers_words() -> None:
    message = "0/16 nodes are available: 16 Insufficient nvidia.com/gpu."
    result = status([pod(0), pod(1, ready=False, unschedulable=message)], 2)
    assert conditions(result)["Ready"] == ("False", "ReplicasNotReady")
    degraded = next(c for c in result["conditions"] if c["type"] == "Degraded")
    assert (degraded["reason"], message in degraded["message"]) == ("InsufficientGPU", True)


def test_an_apply_failure_outranks_unschedulable_pods() -> None:
    failure = Condition(PoolCondition.DEGRADED, True, "ApplyFailed", "StatefulSet pool: HTTP 422")
    observed = PoolObservation(
        1, 1, 1, [pod(0, False, "Insufficient nvidia.com/gpu")], None, STABLE, [failure]
    )
    assert conditions(pool_status(POOL, observed, {}, NOW))["Degraded"] == ("True", "ApplyFailed")


def test_demand_is_reported_when_read() -> None:
    loads = [PodLoad("pool-0", 3, 1), PodLoad("pool-1", None, None)]
    observed = PoolObservation(1, 2, 2, [pod(0), pod(1)], loads, STABLE, ())
    result = pool_status(POOL, observed, {}, NOW)
    assert (result["activeSessions"], result["queueDepth"]) == (3, 1)
    assert conditions(result)["LoadReported"] == ("False", "PodsNotAnswering")


def test_a_pool_whose_pods_do_not_answer_shows_unknown_load_not_zeros() -> None:
    loads = [PodLoad("pool-0", None, None), PodLoad("pool-1", None, None)]
    observed = PoolObservation(1, 2, 2, [pod(0), pod(1)], loads, STABLE, ())
    result = pool_status(POOL, observed, {}, NOW)
    assert "activeSessions" not in result and "queueDepth" not in result
    reported = next(c for c in result["conditions"] if c["type"] == "LoadReported")
    assert (reported["status"], reported["reason"]) == ("Unknown", "PodsNotAnswering")
    assert "pool-0" in reported["message"] and "8470" in reported["message"]


def test_draining_is_shown_on_the_scaling_condition() -> None:
    plan = DrainPlan(2, (), (), ("pool-1",))
    observed = PoolObservation(1, 1, 2, [pod(0), pod(1)], None, plan, ())
    scaling = next(c for c in pool_status(POOL, observed, {}, NOW)["conditions"] if c["type"] == "Scaling")
    assert scaling["reason"] == "Draining" and "pool-1" in scaling["message"]


def test_count_changes_are_rate_limited_but_transitions_are_not() -> None:
    before = status([pod(0), pod(1, ready=False)], 3)
    more_ready = status([pod(0), pod(1)], 3)
    assert status_write_delay(before, more_ready, since_last=0.2) is not None  # counts only: wait
    assert status_write_delay(before, more_ready, since_last=5.0) is None
    all_ready = status([pod(0), pod(1), pod(2)], 3)
    assert status_write_delay(more_ready, all_ready, since_last=0.0) is None  # Ready flipped: now
