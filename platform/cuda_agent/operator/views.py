"""Small immutable views of watched objects, kept in Kopf's in-memory indexes.

The reconcilers read children from these views instead of listing them from the apiserver, so a pass
over a 128-pod pool costs no reads; the views hold only what a decision needs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cuda_agent.operator.labels import COMPONENT, DRAIN_SINCE, SPEC_HASH

_ORDINAL = re.compile(r"-(\d+)$")


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """Stable hash of a desired manifest; stored on the child so unchanged children are not re-applied."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PodView:
    name: str
    phase: str
    ready: bool
    ip: str | None
    unschedulable: str | None  # the scheduler's message while the pod cannot be placed
    drain_since: str | None
    terminating: bool
    labels: tuple[tuple[str, str], ...]
    restarts: int = 0  # container restarts (the driver fails the run after too many)
    last_exit: str | None = None  # why a container last terminated, e.g. "Error (exit 1)"
    exit_reason: str | None = None  # the kubelet's reason of that termination, e.g. "OOMKilled"
    waiting: str | None = None  # why a container is not running, e.g. "ImagePullBackOff: Back-off ..."
    node: str | None = None  # where the scheduler placed it
    gpus: int = 0  # nvidia.com/gpu requested by its containers
    created: str | None = None  # metadata.creationTimestamp (set by the apiserver, never by a writer)

    @property
    def waiting_reason(self) -> str | None:
        return self.waiting.split(":", 1)[0] if self.waiting else None

    @property
    def ordinal(self) -> int | None:
        """StatefulSet ordinal from the name (`pool-7` -> 7)."""
        found = _ORDINAL.search(self.name)
        return int(found.group(1)) if found else None

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> PodView:
        meta, status = body.get("metadata", {}), body.get("status") or {}
        conditions = {c.get("type"): c for c in status.get("conditions") or ()}
        scheduled = conditions.get("PodScheduled", {})
        unschedulable = (
            str(scheduled.get("message") or "unschedulable")
            if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
            else None
        )
        return cls(
            name=meta.get("name", ""),
            phase=status.get("phase", "Pending"),
            ready=conditions.get("Ready", {}).get("status") == "True",
            ip=status.get("podIP") or None,
            unschedulable=unschedulable,
            drain_since=(meta.get("annotations") or {}).get(DRAIN_SINCE),
            terminating=meta.get("deletionTimestamp") is not None,
            labels=tuple(sorted((meta.get("labels") or {}).items())),
            restarts=sum(int(c.get("restartCount") or 0) for c in status.get("containerStatuses") or ()),
            last_exit=_last_exit(status),
            exit_reason=_exit_reason(status),
            waiting=_waiting(status),
            node=(body.get("spec") or {}).get("nodeName") or None,
            gpus=pod_gpus(body),
            created=meta.get("creationTimestamp"),
        )

    @property
    def component(self) -> str | None:
        return dict(self.labels).get(COMPONENT)


GPU_RESOURCE = "nvidia.com/gpu"


def pod_gpus(body: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """GPUs a pod holds on its node: the sum of its containers' requests (limits when no request)."""
    total = 0
    for container in (body.get("spec") or {}).get("containers") or ():
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get(resource) or (resources.get("limits") or {}).get(
            resource
        )
        try:
            total += int(value or 0)
        except (TypeError, ValueError):
            continue
    return total


def _terminated(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or (
            container.get("lastState") or {}
        ).get("terminated")
        if terminated:
            return dict(terminated)
    return None


def _exit_reason(status: Mapping[str, Any]) -> str | None:
    terminated = _terminated(status)
    return str(terminated.get("reason") or "Error") if terminated else None


def _waiting(status: Mapping[str, Any]) -> str | None:
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            message = str(waiting.get("message") or "").strip()
            return f"{waiting['reason']}: {message[:500]}" if message else str(waiting["reason"])
    return None


def _last_exit(status: Mapping[str, Any]) -> str | None:
    terminated = _terminated(status)
    if terminated:
        message = str(terminated.get("message") or "").strip()
        reason = f"{terminated.get('reason', 'Terminated')} (exit {terminated.get('exitCode')})"
        return f"{reason}: {message[:500]}" if message else reason
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message', '')}"
    return None


@dataclass(frozen=True)
class ChildView:
    """A child object: its identity, the hash of the manifest last applied to it, and its status."""

    kind: str
    name: str
    uid: str
    spec_hash: str | None
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    created: str | None = None  # metadata.creationTimestamp

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> ChildView:
        meta = body.get("metadata", {})
        spec = body.get("spec")
        return cls(
            kind=body.get("kind", ""),
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            spec_hash=(meta.get("annotations") or {}).get(SPEC_HASH),
            spec=dict(spec) if isinstance(spec, Mapping) else {},
            status=dict(body.get("status") or {}),
            created=meta.get("creationTimestamp"),
        )
