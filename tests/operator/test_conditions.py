"""Condition merging keeps transition times unless the status really changed."""

from __future__ import annotations

from datetime import UTC, datetime

from cuda_agent.api.sandboxpool import SandboxPoolConditionType as PoolCondition
from cuda_agent.operator.conditions import Condition, merge_conditions

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
T1 = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)


def test_transition_time_moves_only_on_a_status_change() -> None:
    first = merge_conditions(
        None, [Condition(PoolCondition.READY, False, "ReplicasNotReady", "0/2")], generation=1, now=T0
    )
    same = merge_conditions(
        first, [Condition(PoolCondition.READY, False, "ReplicasNotReady", "1/2")], generation=1, now=T1
    )
    assert same[0]["lastTransitionTime"] == "2026-11-30T10:00:00Z"
    assert same[0]["message"] == "1/2"
    flipped = merge_conditions(
        same, [Condition(PoolCondition.READY, True, "AllReplicasReady", "2/2")], generation=2, now=T1
    )
    assert flipped[0] == {
        "type": "Ready",
        "status": "True",
        "reason": "AllReplicasReady",
        "message": "2/2",
        "observedGeneration": 2,
        "lastTransitionTime": "2026-11-30T11:00:00Z",
    }


def test_conditions_of_other_writers_are_kept() -> None:
    existing = [{"type": "Custom", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t"}]
    merged = merge_conditions(existing, [Condition(PoolCondition.READY, True, "R")], generation=1, now=T0)
    assert [c["type"] for c in merged] == ["Ready", "Custom"]
