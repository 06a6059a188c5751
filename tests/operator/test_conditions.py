"""Condition merging keeps transition times unless the status really changed, and only the operator's
own condition types; recorded times are trusted only with a zone and not from the future."""

from __future__ import annotations

from datetime import UTC, datetime

from cuda_agent.api.sandboxpool import SandboxPoolConditionType as PoolCondition
from cuda_agent.operator.conditions import Condition, merge_conditions, parse_rfc3339, trusted_time

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


def test_only_the_resources_own_condition_types_are_kept() -> None:
    """Types the operator does not own go (16 of them would make every status write refused); the
    resource's other types stay as they were; a forged transition time in the future is not kept."""
    foreign = [
        {"type": f"Custom{i}", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t"}
        for i in range(16)
    ]
    scaling = {
        "type": "Scaling",
        "status": "False",
        "reason": "Stable",
        "lastTransitionTime": "2026-11-30T09:00:00Z",
    }
    future = {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "2099-01-01T00:00:00Z"}
    merged = merge_conditions(
        [*foreign, scaling, future, "garbage"],  # type: ignore[list-item]
        [Condition(PoolCondition.READY, True, "R")],
        generation=1,
        now=T0,
    )
    assert [c["type"] for c in merged] == ["Ready", "Scaling"]
    assert merged[0]["lastTransitionTime"] == "2026-11-30T10:00:00Z"


def test_times_without_a_zone_or_in_the_future_are_not_trusted() -> None:
    assert parse_rfc3339("2026-11-30T10:00:00") is None  # naive: cannot be compared with an aware clock
    assert parse_rfc3339(42) is None and parse_rfc3339("yesterday") is None
    assert parse_rfc3339("2026-11-30T10:00:00Z") == T0
    assert trusted_time("2026-11-30T10:00:59Z", T0) == T0  # within the clock skew: now
    assert trusted_time("2026-11-30T10:05:00Z", T0) is None
    assert trusted_time("2026-11-30T09:00:00Z", T0, not_before=T0) is None
    assert trusted_time("2026-11-30T09:00:00+00:00", T1) == datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
