"""Autoscaler decisions from demand: immediate scale-up, delayed and stable scale-down, pessimism about
pods that did not answer."""

from __future__ import annotations

from cuda_agent.operator.autoscaler import Demand, History, PodLoad, ScalingPolicy, decide

POLICY = ScalingPolicy(min_replicas=1, max_replicas=16, target_sessions_per_replica=4, scale_down_delay=60)


def loads(*per_pod: tuple[int, int] | None) -> list[PodLoad]:
    return [
        PodLoad(f"pool-{i}", *(load if load is not None else (None, None))) for i, load in enumerate(per_pod)
    ]


def test_demand_sums_sessions_and_queued_jobs_and_counts_silent_pods() -> None:
    demand = Demand.of(loads((3, 1), (2, 0), None))
    assert (demand.active_sessions, demand.queued_judge_jobs, demand.silent_pods) == (5, 1, 1)
    assert demand.total == 6


def test_scale_up_is_immediate_and_rounds_up() -> None:
    history = History(started_at=0.0)
    decision = decide(2, Demand.of(loads((4, 3), (4, 2))), POLICY, history, now=1.0)
    assert decision is not None
    assert decision.replicas == 4  # 13 sessions / 4 per replica
    assert decision.reason == "ScaledUp"


def test_scale_up_is_capped_at_max() -> None:
    decision = decide(
        4, Demand(active_sessions=500, queued_judge_jobs=0, silent_pods=0), POLICY, History(0.0), 1.0
    )
    assert decision is not None and decision.replicas == 16


def test_no_scale_down_before_the_operator_has_watched_a_whole_window() -> None:
    history = History(started_at=100.0)
    idle = Demand(0, 0, 0)
    assert decide(8, idle, POLICY, history, now=130.0) is None
    decision = decide(8, idle, POLICY, history, now=161.0)
    assert decision is not None and decision.replicas == 1 and decision.reason == "ScaledDown"


def test_a_dip_inside_the_window_does_not_scale_down() -> None:
    history = History(started_at=0.0)
    busy, idle = Demand(32, 0, 0), Demand(0, 0, 0)
    assert decide(8, busy, POLICY, history, now=100.0) is None
    # Demand vanishes for 50 s, then returns: the busy recommendation is still inside the 60 s window.
    for t in range(110, 151, 10):
        assert decide(8, idle, POLICY, history, now=float(t)) is None
    assert decide(8, busy, POLICY, history, now=155.0) is None


def test_scale_down_goes_to_the_highest_recommendation_of_the_window() -> None:
    history = History(started_at=0.0)
    decide(8, Demand(20, 0, 0), POLICY, history, now=100.0)  # wants 5
    decide(8, Demand(8, 0, 0), POLICY, history, now=130.0)  # wants 2
    decision = decide(8, Demand(0, 0, 0), POLICY, history, now=150.0)
    assert decision is not None and decision.replicas == 5


def test_silent_pods_count_as_fully_loaded_when_scaling_down() -> None:
    history = History(started_at=0.0)
    # Two of four pods did not answer: they may hold 4 sessions each, so 2 + 8 -> 3 replicas, not 1.
    decision = decide(4, Demand(2, 0, silent_pods=2), POLICY, history, now=100.0)
    assert decision is not None and decision.replicas == 3


def test_silent_pods_do_not_trigger_scale_up() -> None:
    assert decide(4, Demand(0, 0, silent_pods=4), POLICY, History(0.0), now=1.0) is None


def test_replicas_outside_bounds_are_brought_back() -> None:
    policy = ScalingPolicy(min_replicas=2, max_replicas=4, target_sessions_per_replica=4, scale_down_delay=0)
    below = decide(0, Demand(0, 0, 0), policy, History(0.0), now=1.0)
    assert below is not None and below.replicas == 2
    above = decide(9, Demand(0, 0, 0), policy, History(0.0), now=1.0)
    assert above is not None and above.replicas == 4
    busy_below = decide(1, Demand(40, 0, 0), policy, History(0.0), now=1.0)
    assert busy_below is not None and busy_below.replicas == 4
