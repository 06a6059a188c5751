"""Which sandbox pods a scale-down may remove now (pure).

A StatefulSet always removes its highest ordinals, so the pods a scale-down will remove are known before
it happens. They are annotated first (the server stops taking new sessions) and the StatefulSet shrinks
only past pods that are drained: no open sessions by their own report, not running at all, or draining
for longer than the grace period. A pod that does not answer is not assumed idle; it waits for the grace
period. Highest ordinals go first, so a busy pod holds back only the pods above it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cuda_agent.operator.autoscaler import PodLoad
from cuda_agent.operator.conditions import trusted_time
from cuda_agent.operator.views import PodView


@dataclass(frozen=True)
class DrainPlan:
    statefulset_replicas: int
    start_draining: tuple[str, ...]  # annotate these pods now
    stop_draining: tuple[str, ...]  # a cancelled scale-down: remove their annotation
    waiting_on: tuple[str, ...]  # pods whose sessions hold the scale-down back
    # When the last of them is past its grace period, so the scale-down goes on whether or not their
    # sessions end (None: nothing is held back). For the pool's Scaling message: "... by <deadline>".
    deadline: datetime | None = None

    @property
    def draining(self) -> bool:
        return bool(self.waiting_on or self.start_draining)


def doomed_pods(pods: Sequence[PodView], desired: int) -> list[PodView]:
    """Pods the StatefulSet removes when it shrinks to `desired`, highest ordinal first."""
    doomed = [p for p in pods if p.ordinal is not None and p.ordinal >= desired and not p.terminating]
    return sorted(doomed, key=lambda p: -(p.ordinal or 0))


def is_drained(pod: PodView, load: PodLoad | None, now: datetime, grace: float) -> bool:
    if pod.phase != "Running" or grace <= 0:
        return True  # never started (or already finished): it holds no sessions
    if load is not None and load.active_sessions == 0:
        return True
    since = trusted_time(pod.drain_since, now)
    return since is not None and now - since >= timedelta(seconds=grace)


def plan_drain(
    desired: int,
    current: int,
    pods: Sequence[PodView],
    loads: Mapping[str, PodLoad],
    now: datetime,
    grace: float,
) -> DrainPlan:
    """The StatefulSet size to apply now, and the drain annotations to add or remove."""
    keep = [p.name for p in pods if p.drain_since and p.ordinal is not None and p.ordinal < desired]
    if desired >= current:
        return DrainPlan(desired, (), tuple(keep), ())
    busy = [p for p in doomed_pods(pods, desired) if not is_drained(p, loads.get(p.name), now, grace)]
    # The annotation both tells the server to refuse new sessions and starts the pod's grace clock. Anyone
    # who may edit pods may write it too: a value that is not a time with a zone, up to now, is not a
    # clock that started, and is written again.
    start = tuple(p.name for p in busy if trusted_time(p.drain_since, now) is None)
    replicas = max([desired, *((p.ordinal or 0) + 1 for p in busy)])
    # A pod whose clock starts now (annotated by this pass) is past its grace at now + grace.
    clocks = [trusted_time(p.drain_since, now) or now for p in busy]
    deadline = max(clocks) + timedelta(seconds=grace) if clocks else None
    waiting = tuple(p.name for p in busy)
    return DrainPlan(min(replicas, current), start, tuple(keep), waiting, deadline)
