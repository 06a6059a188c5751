"""What every reconcile pass reads and writes through: settings, the API client, the watch indexes, and
the executor a run's training runs on (the RunExecutor protocol: executor.py and local_executor.py
implement it and import this module, never the reverse)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator.autoscaler import History
from cuda_agent.operator.compute import Compute
from cuda_agent.operator.config import OperatorConfig
from cuda_agent.operator.demand import ProbeSettings
from cuda_agent.operator.kube import Kube, Manifest
from cuda_agent.operator.run_children import RunContext
from cuda_agent.operator.views import ChildView, PodView
from cuda_agent.operator.workqueue import Key, WorkQueue

V = TypeVar("V", covariant=True)


class IndexLike(Protocol[V]):
    """The read side of a `kopf.Index`: key -> store of values (one per indexed object)."""

    def get(self, key: Any, default: Any = None) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


def _values(index: IndexLike[Any], key: Any) -> list[Any]:
    store = index.get(key)
    return list(store) if store is not None else []


@dataclass
class OwnWrites:
    """What this process last wrote to one object (its status, annotations), and which of the object's
    resourceVersions predate those writes. The watch may still show such an older version for a moment;
    only then is the write laid over it. A newer version is the truth, whoever wrote it: a value forged
    after the operator's write shows through and is corrected by the next pass, and a restarted operator
    (which remembers nothing) reads what is there."""

    uid: str
    older: set[str] = field(default_factory=set)
    latest: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    status_at: float = 0.0  # monotonic time of the last status write (the pools' write rate limit)
    annotations: dict[str, str | None] = field(default_factory=dict)  # None: removed


class RunExecutor(Protocol):
    """The operations a reconcile pass asks of an executor; every call is idempotent (level-based)."""

    gang_admission: bool  # whether a run's GPUs come from the cluster's nodes (checked before start)

    async def observe(self, context: OperatorContext, run: RunContext, spec: TrainingRunSpec) -> Compute: ...

    async def ensure(
        self, context: OperatorContext, run: RunContext, spec: TrainingRunSpec
    ) -> tuple[list[str], list[str]]:
        """Create what is missing (platform first, then the trainer); returns (what it created or
        started, errors as text)."""
        ...

    async def remove(self, context: OperatorContext, run: RunContext, keep_finished: bool) -> list[str]:
        """Stop everything that holds resources; with `keep_finished` a finished trainer's record (pod,
        logs) stays, otherwise (suspension) it goes too, so resuming starts a new trainer. Returns what
        it deleted or stopped."""
        ...

    async def log_tail(self, context: OperatorContext, run: RunContext, lines: int) -> str:
        """The last lines the (failed) trainer wrote, or why they cannot be read."""
        ...

    def forget(self, namespace: str, name: str) -> None:
        """The run was deleted: stop whatever is left of it."""
        ...

    async def close(self) -> None:
        """The operator stops."""
        ...


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
    own_writes: dict[Key, OwnWrites] = field(default_factory=dict)  # this process's writes to owners
    # Held from a run's capacity check until its pods exist, so two runs cannot both take the same GPUs.
    admission_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queued_runs: set[Key] = field(default_factory=set)  # TrainingRuns in phase Queued (a metric)
    # key -> uid of the runs this process admitted: their pending pods hold GPUs back from the moment
    # of admission, before the record of it shows in the watch.
    admitted: dict[Key, str] = field(default_factory=dict)

    def forget(self, key: Key) -> None:
        """Drop what the operator remembers about an object that was deleted."""
        self.histories.pop(key, None)
        self.own_writes.pop(key, None)
        self.queued_runs.discard(key)
        self.admitted.pop(key, None)

    def owner(self, key: Key) -> Manifest | None:
        found = _values(self.owners, key)
        return found[0] if found else None

    def pods_of(self, key: Key) -> list[PodView]:
        return _values(self.pods, key)

    def children_of(self, key: Key) -> dict[tuple[str, str], ChildView]:
        """(kind, name) -> child view."""
        return {(child.kind, child.name): child for child in _values(self.children, key)}

    def basis(self, key: Key, body: Manifest) -> tuple[dict[str, Any], dict[str, str]]:
        """(status, annotations) of an owner as the apiserver holds them, as far as this process knows:
        the watch's view, with this process's latest writes laid over it only while that view predates
        them (see OwnWrites)."""
        meta = body.get("metadata") or {}
        status = dict(body.get("status") or {})
        annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
        own = self.own_writes.get(key)
        if own is None or own.uid != meta.get("uid"):
            return status, annotations
        version = str(meta.get("resourceVersion") or "")
        if version == own.latest:
            own.older.clear()  # the watch caught up
        if version not in own.older:
            return status, annotations
        merged = {**annotations, **own.annotations}
        return {**status, **own.status}, {k: v for k, v in merged.items() if v is not None}

    def wrote(
        self,
        key: Key,
        body: Manifest,
        answer: Manifest | None,
        *,
        status: dict[str, Any] | None = None,
        annotations: Mapping[str, str | None] | None = None,
    ) -> None:
        """Remember a write to an owner: `body` is the version it was decided on, `answer` the object
        the apiserver returned."""
        meta = body.get("metadata") or {}
        own = self.own_writes.get(key)
        if own is None or own.uid != meta.get("uid"):
            own = self.own_writes[key] = OwnWrites(uid=str(meta.get("uid") or ""))
        own.older.add(str(meta.get("resourceVersion") or ""))
        if own.latest:
            own.older.add(own.latest)
        own.latest = str(((answer or {}).get("metadata") or {}).get("resourceVersion") or "")
        if status is not None:
            own.status, own.status_at = dict(status), time.monotonic()
        own.annotations.update(annotations or {})

    def history(self, key: Key) -> History:
        return self.histories.setdefault(key, History(started_at=time.monotonic()))

    @property
    def probe(self) -> ProbeSettings:
        return ProbeSettings(
            allowed_networks=self.config.probe_network_objects(), endpoint_map=self.config.status_endpoint_map
        )
