"""Replica decisions for a SandboxPool from the demand its pods report (pure: no I/O, no clock).

Demand is active sessions plus queued judge jobs, summed over the pods that answered `/v1/status`.
Like the HPA, a pod that did not answer counts as idle when scaling up and as fully loaded when scaling
down, so missing data never removes capacity. Scale-up is immediate; scale-down takes the highest
recommendation of the last `scale_down_delay` seconds (a stabilisation window), so demand that dips and
comes back does not make the pool flap, and a freshly restarted operator (no history yet) never scales
down until it has watched a whole window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ScalingPolicy:
    min_replicas: int
    max_replicas: int
    target_sessions_per_replica: int
    scale_down_delay: float  # seconds


@dataclass(frozen=True)
class PodLoad:
    """What one sandbox server reported; `None` fields mean it did not answer."""

    pod: str
    active_sessions: int | None
    queued_judge_jobs: int | None

    @property
    def answered(self) -> bool:
        return self.active_sessions is not None and self.queued_judge_jobs is not None

    @property
    def demand(self) -> int:
        return (self.active_sessions or 0) + (self.queued_judge_jobs or 0)


@dataclass(frozen=True)
class Demand:
    """The pool's demand, summed over the pods that answered, and how many ready pods did not."""

    active_sessions: int
    queued_judge_jobs: int
    silent_pods: int

    @classmethod
    def of(cls, loads: Sequence[PodLoad]) -> Demand:
        answered = [load for load in loads if load.answered]
        return cls(
            active_sessions=sum(load.active_sessions or 0 for load in answered),
            queued_judge_jobs=sum(load.queued_judge_jobs or 0 for load in answered),
            silent_pods=len(loads) - len(answered),
        )

    @property
    def total(self) -> int:
        return self.active_sessions + self.queued_judge_jobs


@dataclass(frozen=True)
class Decision:
    replicas: int
    reason: str  # CamelCase, used as the Event reason
    message: str


@dataclass
class History:
    """Recent recommendations of one pool: (time, replicas), oldest first, plus when watching began."""

    started_at: float
    recommendations: list[tuple[float, int]] = field(default_factory=list)

    def record(self, now: float, replicas: int, window: float) -> None:
        self.recommendations.append((now, replicas))
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= now - window]

    def stabilised(self, now: float, window: float) -> int | None:
        """The highest recommendation over the window, or None while the window is not yet covered."""
        if now - self.started_at < window:
            return None
        return max(r for t, r in self.recommendations if t >= now - window)


def clamp(replicas: int, policy: ScalingPolicy) -> int:
    return max(policy.min_replicas, min(policy.max_replicas, replicas))


def recommend(demand: Demand, policy: ScalingPolicy) -> tuple[int, int]:
    """(replicas if scaling up, replicas if scaling down), from the pessimistic view of each direction."""
    target = policy.target_sessions_per_replica
    up = clamp(math.ceil(demand.total / target), policy)
    down = clamp(math.ceil((demand.total + demand.silent_pods * target) / target), policy)
    return up, down


def decide(
    current: int, demand: Demand, policy: ScalingPolicy, history: History, now: float
) -> Decision | None:
    """The new replica count, or None to stay. Records this pass's recommendation in `history`."""
    up, down = recommend(demand, policy)
    history.record(now, down, policy.scale_down_delay)
    summary = (
        f"demand {demand.total} (active sessions {demand.active_sessions} + queued judge jobs "
        f"{demand.queued_judge_jobs}) at target {policy.target_sessions_per_replica} per replica"
    )
    if up > current:
        reason = "ScaledUp" if up > policy.min_replicas else "ScaledToBounds"
        return Decision(up, reason, f"{current} -> {up} replicas: {summary}")
    if current > policy.max_replicas:
        return Decision(
            policy.max_replicas, "ScaledToBounds", f"{current} -> {policy.max_replicas}: above max"
        )
    stable = history.stabilised(now, policy.scale_down_delay)
    if stable is not None and stable < current:
        return Decision(
            stable,
            "ScaledDown",
            f"{current} -> {stable} replicas: {summary}, lowest for {policy.scale_down_delay:.0f}s",
        )
    return None
