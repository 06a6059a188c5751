"""Scale-down drain plans: which pods are annotated and how far the StatefulSet may shrink now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cuda_agent.operator.autoscaler import PodLoad
from cuda_agent.operator.conditions import rfc3339
from cuda_agent.operator.drain import plan_drain
from cuda_agent.operator.views import PodView

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def pod(ordinal: int, phase: str = "Running", drain_since: datetime | None = None) -> PodView:
    return PodView(
        name=f"pool-{ordinal}",
        phase=phase,
        ready=phase == "Running",
        ip=None,
        unschedulable=None,
        drain_since=rfc3339(drain_since) if drain_since else None,
        terminating=False,
        labels=(),
    )


def load(ordinal: int, sessions: int | None) -> tuple[str, PodLoad]:
    return f"pool-{ordinal}", PodLoad(f"pool-{ordinal}", sessions, 0 if sessions is not None else None)


def test_scale_up_applies_at_once_and_cancels_pending_drains() -> None:
    pods = [pod(0), pod(1, drain_since=NOW)]
    plan = plan_drain(4, 2, pods, {}, NOW, grace=600)
    assert plan.statefulset_replicas == 4
    assert plan.stop_draining == ("pool-1",)
    assert not plan.draining


def test_idle_pods_are_removed_without_waiting() -> None:
    pods = [pod(i) for i in range(4)]
    plan = plan_drain(2, 4, pods, dict([load(2, 0), load(3, 0)]), NOW, grace=600)
    assert plan.statefulset_replicas == 2
    assert plan.start_draining == ()


def test_a_busy_pod_holds_back_only_itself_and_lower_ordinals() -> None:
    pods = [pod(i) for i in range(6)]
    loads = dict([load(2, 0), load(3, 1), load(4, 0), load(5, 0)])
    plan = plan_drain(2, 6, pods, loads, NOW, grace=600)
    assert plan.statefulset_replicas == 4  # pods 4 and 5 go now; pod 3 still has a session
    assert plan.start_draining == ("pool-3",)
    assert plan.waiting_on == ("pool-3",)


def test_silent_pods_wait_for_the_grace_period() -> None:
    pods = [pod(0), pod(1)]
    assert plan_drain(1, 2, pods, dict([load(1, None)]), NOW, grace=60).statefulset_replicas == 2
    draining = [pod(0), pod(1, drain_since=NOW - timedelta(seconds=61))]
    assert plan_drain(1, 2, draining, dict([load(1, None)]), NOW, grace=60).statefulset_replicas == 1


def test_busy_pods_are_removed_after_the_grace_period() -> None:
    pods = [pod(0), pod(1, drain_since=NOW - timedelta(seconds=30))]
    assert plan_drain(1, 2, pods, dict([load(1, 3)]), NOW, grace=60).statefulset_replicas == 2
    assert plan_drain(1, 2, pods, dict([load(1, 3)]), NOW, grace=20).statefulset_replicas == 1


def test_pods_that_never_started_are_removed_at_once() -> None:
    pods = [pod(0), pod(1, phase="Pending")]
    assert plan_drain(1, 2, pods, {}, NOW, grace=600).statefulset_replicas == 1


def test_the_deadline_is_when_the_last_held_pod_is_past_its_grace() -> None:
    pods = [pod(0), pod(1, drain_since=NOW - timedelta(seconds=30)), pod(2), pod(3)]
    loads = dict([load(1, 2), load(2, 1), load(3, 0)])
    plan = plan_drain(1, 4, pods, loads, NOW, grace=60)
    assert plan.waiting_on == ("pool-2", "pool-1")
    # pool-1's clock started 30 s ago (due in 30 s); pool-2's starts with this pass (due in 60 s).
    assert plan.deadline == NOW + timedelta(seconds=60)
    only_one = dict([load(1, 2), load(2, 0), load(3, 0)])
    assert plan_drain(1, 4, pods, only_one, NOW, grace=60).deadline == NOW + timedelta(seconds=30)
    # A pod that does not answer is held for its grace period too.
    assert plan_drain(1, 4, pods, dict([load(1, 0), load(2, 0)]), NOW, grace=60).deadline == NOW + timedelta(
        seconds=60
    )
    assert plan_drain(1, 4, pods, dict([load(1, 0), load(2, 0), load(3, 0)]), NOW, grace=60).deadline is None
    assert plan_drain(4, 4, pods, {}, NOW, grace=60).deadline is None
