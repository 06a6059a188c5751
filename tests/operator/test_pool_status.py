"""SandboxPool status from what a pass observed, and the rate limit on count-only status writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cuda_agent.api.sandboxpool import SandboxPoolConditionType as PoolCondition
from cuda_agent.operator.autoscaler import PodLoad
from cuda_agent.operator.conditions import Condition
from cuda_agent.operator.drain import DrainPlan
from cuda_agent.operator.events import condition_events
from cuda_agent.operator.pool_children import PoolIdentity
from cuda_agent.operator.pool_reconciler import PoolObservation, _is_problem, pool_status, status_write_delay
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


def test_a_scale_down_counts_the_desired_pods_and_names_the_rest() -> None:
    """32 pods, spec.replicas 1: one of the desired set is ready, 31 are on their way out (3 of them held
    back by their sessions); the message never says "32/1 ready"."""
    plan = DrainPlan(32, (), (), ("pool-31", "pool-30", "pool-29"), NOW + timedelta(seconds=600))
    observed = PoolObservation(1, 1, 32, [pod(i) for i in range(32)], None, plan, ())
    result = pool_status(POOL, observed, {}, NOW)
    ready = next(c for c in result["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        "1/1 sandbox pods ready; 31 more being removed by the scale-down (3 of them draining their sessions)"
    )
    assert (ready["status"], ready["reason"]) == ("False", "ReplicasNotReady")  # the pool has not shrunk yet
    assert (result["replicas"], result["readyReplicas"]) == (32, 32)  # the pods that exist, as the fields say
    # The one desired pod not ready yet is counted as such, the pods above spec.replicas never are.
    observed = PoolObservation(
        1, 1, 32, [pod(0, ready=False)] + [pod(i) for i in range(1, 32)], None, plan, ()
    )
    ready = next(c for c in pool_status(POOL, observed, {}, NOW)["conditions"] if c["type"] == "Ready")
    assert ready["message"].startswith("0/1 sandbox pods ready; 31 more being removed")
    # Done shrinking: the plain count again.
    done = status([pod(0)], 1)
    assert next(c for c in done["conditions"] if c["type"] == "Ready")["message"] == "1/1 sandbox pods ready"


def test_draining_names_when_the_scale_down_goes_on_regardless() -> None:
    plan = DrainPlan(2, (), (), ("pool-1",), datetime(2026, 11, 30, 12, 10, 0, 700_000, tzinfo=UTC))
    observed = PoolObservation(1, 1, 2, [pod(0), pod(1)], None, plan, ())
    scaling = next(c for c in pool_status(POOL, observed, {}, NOW)["conditions"] if c["type"] == "Scaling")
    assert scaling["message"] == (
        "scaling down to 1: waiting for sessions on pool-1; the scale-down goes on by 2026-11-30T12:10:00Z "
        "whether or not they end"
    )


def test_one_event_per_condition_transition_none_for_a_pass_that_changed_no_condition() -> None:
    """Pool statuses pass by pass: each condition that changed status or reason is one Event (reason =
    its new reason; Warning for Degraded), a recovery included; counts alone are no Event."""
    failure = Condition(PoolCondition.DEGRADED, True, "ApplyFailed", "StatefulSet pool: HTTP 422")
    stable = status([pod(0), pod(1)], 2)
    refused = pool_status(
        POOL, PoolObservation(1, 2, 2, [pod(0), pod(1)], None, STABLE, [failure]), stable, NOW
    )
    plan = DrainPlan(2, (), (), ("pool-1",), NOW)
    draining = pool_status(POOL, PoolObservation(1, 1, 2, [pod(0), pod(1)], None, plan, ()), refused, NOW)

    def told(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, str, bool]]:
        return [(e.condition, e.reason, e.warning) for e in condition_events(before, after, _is_problem)]

    assert told({}, stable) == [("Ready", "AllReplicasReady", False)]  # False/Unknown first writes: no news
    assert told(stable, refused) == [("Degraded", "ApplyFailed", True)]
    assert told(refused, draining) == [
        ("Ready", "ReplicasNotReady", False),
        ("Scaling", "Draining", False),
        ("Degraded", "AsExpected", False),  # the recovery is told too
    ]
    assert told(draining, draining) == []
    fewer_ready = status([pod(0), pod(1, ready=False)], 2)
    assert told(fewer_ready, status([pod(0, ready=False), pod(1, ready=False)], 2)) == []  # counts only
