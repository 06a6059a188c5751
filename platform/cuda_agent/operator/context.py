"""What every reconcile pass reads and writes through: settings, the API client, the watch indexes."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cuda_agent.operator.autoscaler import History
from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.demand import ProbeSettings
from cuda_agent.operator.kube import Kube, Manifest
from cuda_agent.operator.views import ChildView, PodView
from cuda_agent.operator.workqueue import Key, WorkQueue

if TYPE_CHECKING:  # the executors import this module
    from cuda_agent.operator.executor import RunExecutor

V = TypeVar("V", covariant=True)


class IndexLike(Protocol[V]):
    """The read side of a `kopf.Index`: key -> store of values (one per indexed object)."""

    def get(self, key: Any, default: Any = None) -> Any: ...


def _values(index: IndexLike[Any], key: Any) -> list[Any]:
    store = index.get(key)
    return list(store) if store is not None else []


@dataclass
class OperatorContext:
    config: OperatorConfig
    kube: Kube
    queue: WorkQueue
    # Kopf indexes: the watched objects as the operator last saw them (live, updated by the watchers).
    owners: IndexLike[Manifest]  # (kind, namespace, name) -> the SandboxPool / TrainingRun body
    pods: IndexLike[PodView]  # (owner kind, namespace, owner name) -> its pods
    children: IndexLike[ChildView]  # (owner kind, namespace, owner name) -> its other children
    executor: RunExecutor  # where a TrainingRun's trainer runs: pods, or local processes
    histories: dict[Key, History] = field(default_factory=dict)
    # (kind, namespace, name) -> spec hash this process applied last (the watch may lag behind a write)
    applied: dict[tuple[str, str, str], str] = field(default_factory=dict)
    # (kind, namespace, name) -> (monotonic time, status) of this process's last status write
    status_written: dict[Key, tuple[float, dict[str, Any]]] = field(default_factory=dict)
    written_uids: dict[Key, str] = field(default_factory=dict)  # whose status `status_written` holds
    # Held from a run's capacity check until its pods exist, so two runs cannot both take the same GPUs.
    admission_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queued_runs: set[Key] = field(default_factory=set)  # TrainingRuns in phase Queued (a metric)

    def forget(self, key: Key) -> None:
        """Drop what the operator remembers about an object that was deleted."""
        self.histories.pop(key, None)
        self.status_written.pop(key, None)
        self.written_uids.pop(key, None)
        self.queued_runs.discard(key)

    def owner(self, key: Key) -> Manifest | None:
        found = _values(self.owners, key)
        return found[0] if found else None

    def pods_of(self, key: Key) -> list[PodView]:
        return _values(self.pods, key)

    def children_of(self, key: Key) -> dict[tuple[str, str], ChildView]:
        """(kind, name) -> child view."""
        return {(child.kind, child.name): child for child in _values(self.children, key)}

    def history(self, key: Key) -> History:
        return self.histories.setdefault(key, History(started_at=time.monotonic()))

    @property
    def probe(self) -> ProbeSettings:
        return ProbeSettings(
            allowed_networks=self.config.probe_network_objects(), endpoint_map=self.config.status_endpoint_map
        )
