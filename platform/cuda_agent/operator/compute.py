"""What runs a TrainingRun's training now, as an executor reports it to a reconcile pass (pure data).

Both executors (executor.ClusterExecutor, local_executor.LocalExecutor) answer `observe` with a Compute;
the run reconciler decides the run's conditions from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

DriverState = Literal["absent", "pending", "active", "complete", "failed"]


@dataclass(frozen=True)
class Compute:
    """What runs a run's training now, as a reconcile pass sees it."""

    exists: bool  # something is left to remove (suspension removes even a finished trainer's pod)
    ready: bool  # the trainer's platform is up (Ray cluster; locally the sandbox server)
    ready_message: str
    driver: DriverState  # the trainer process
    driver_message: str
    starting_reason: str = "StartingRayCluster"  # Provisioning's reason while `ready` is False
    failure_reason: str = "DriverFailed"  # CamelCase cause when `driver` is "failed", e.g. OOMKilled
    stuck: tuple[str, str] | None = None  # (reason, message) of a pod that cannot start, e.g. Unschedulable
    since: datetime | None = None  # creation of the oldest part of it the apiserver shows (None: unknown)
