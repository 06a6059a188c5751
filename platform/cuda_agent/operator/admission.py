"""All-or-nothing admission of a TrainingRun's GPUs: a run starts only when its whole gang fits.

Without it, two runs that each need most of the cluster each get some of their workers placed and wait
forever for the rest. Where the ecosystem's queueing is installed the operator leaves the decision to it:
a run labelled `kueue.x-k8s.io/queue-name` on a cluster that serves Kueue's Workload API has its Ray pods
labelled as one pod group of Kueue's plain-pod integration (Kueue, where that integration is on, gates
them until the group's quota is reserved; a KubeRay RayCluster carries the queue label instead; untested
against Kueue, and Kueue never suspends the TrainingRun itself: docs/operator.md); where scheduler-plugins'
coscheduling or Volcano serves PodGroups, the operator creates one for the Ray pods (minMember = head and
every worker). Otherwise the operator checks capacity itself: node allocatable GPUs minus the requests
of the pods bound to each node, and minus the pending pods of runs it admitted a moment ago (their pods
are not bound yet); the run's Ray workers must all fit, first-fit-decreasing. A run that does not fit
stays Queued and is checked again every sync period and whenever one of its own objects changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cuda_agent.api.trainingrun import TrainingRunConditionType as RunCondition
from cuda_agent.operator import labels as lb
from cuda_agent.operator.conditions import Condition
from cuda_agent.operator.kube import Kube, Manifest
from cuda_agent.operator.run_children import (
    COSCHEDULING,
    KUEUE,
    KUEUE_QUEUE_LABEL,
    POD_GROUP_APIS,
    VOLCANO,
    GangScheduling,
)
from cuda_agent.operator.views import GPU_RESOURCE, PodView, pod_gpus

KUEUE_API = ("kueue.x-k8s.io/v1beta1", "workloads")
POD_GROUPS = "podgroups"
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class Capacity:
    """GPUs free per schedulable node, and GPUs promised to admitted gangs whose pods are not bound."""

    free: Mapping[str, int]
    promised: Sequence[int]  # per pod
    total: int  # allocatable GPUs of the schedulable nodes


def _schedulable(node: Manifest) -> bool:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable"):
        return False
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    # Trainer pods tolerate only the GPU taint; any other NoSchedule/NoExecute taint keeps them off.
    blocked = any(
        t.get("effect") in ("NoSchedule", "NoExecute") and t.get("key") != GPU_RESOURCE
        for t in spec.get("taints") or ()
    )
    return ready and not blocked


# (namespace, run uid) -> {Ray pod name: its GPUs} of each run this operator has admitted.
Gangs = Mapping[tuple[str, str], Mapping[str, int]]


def capacity(nodes: Sequence[Manifest], pods: Sequence[Manifest], gangs: Gangs | None = None) -> Capacity:
    """Free GPUs per node from node allocatable and the requests of active pods, and the GPUs promised
    to the admitted `gangs` whose pods are not bound yet (pure)."""
    free: dict[str, int] = {}
    for node in nodes:
        if _schedulable(node):
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            try:
                free[node["metadata"]["name"]] = int(allocatable.get(GPU_RESOURCE) or 0)
            except ValueError:
                continue
    total = sum(free.values())
    promised: list[int] = []
    for pod in pods:
        gpus = pod_gpus(pod)
        if gpus == 0 or ((pod.get("metadata") or {}).get("deletionTimestamp") and not _bound(pod)):
            continue
        if _bound(pod):
            node = pod["spec"]["nodeName"]
            if node in free:
                free[node] -= gpus
        else:
            # A gang admitted a moment ago: its pods wait for the scheduler, their GPUs are spoken for.
            # Only the pods the operator creates for the runs it admitted count, and no more GPUs than
            # it gives each: any other unbound pod (a label proves nothing; one that can never be placed
            # would block every run) is not this operator's to count.
            held = min(gpus, _promised(pod, gangs or {}))
            if held:
                promised.append(held)
    return Capacity(free, promised, total)


def _promised(pod: Manifest, gangs: Gangs) -> int:
    """The GPUs an unbound pod may hold back: those of its place in the gang of the admitted run that
    controls it (owner reference in the same namespace), else none."""
    meta = pod.get("metadata") or {}
    for owner in meta.get("ownerReferences") or ():
        if (
            isinstance(owner, Mapping)
            and owner.get("controller") is True
            and owner.get("kind") == lb.RUN_KIND
        ):
            gang = gangs.get((str(meta.get("namespace")), str(owner.get("uid"))), {})
            return gang.get(str(meta.get("name")), 0)
    return 0


def _bound(pod: Manifest) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def fits(gang: Sequence[int], available: Capacity) -> bool:
    """Whether the promised pods and then every pod of `gang` find a node, first-fit-decreasing (pure).
    For pods of whole 8-GPU nodes, as trainer workers are, this is exact."""
    return _first_fit(gang, available)[0] == len(gang)


def _first_fit(gang: Sequence[int], available: Capacity) -> tuple[int, list[int]]:
    """(how many of `gang`'s pods find a node after the promised ones, the free GPUs per node left for
    the gang, largest first)."""
    free = sorted((max(0, gpus) for gpus in available.free.values()), reverse=True)

    def place(gpus: int) -> bool:
        slot = next((i for i, room in enumerate(free) if room >= gpus), None)
        if slot is None:
            return False
        free[slot] -= gpus
        free.sort(reverse=True)
        return True

    for gpus in sorted(available.promised, reverse=True):
        place(gpus)
    left = list(free)
    return sum(1 for gpus in sorted(gang, reverse=True) if place(gpus)), left


def gang_condition(gang: Sequence[int], available: Capacity) -> Condition:
    """The Admitted condition of a run waiting for `gang` (pure)."""
    need = sum(gang)
    placed, left = _first_fit(gang, available)
    shape = f"{len(gang)} Ray worker pod(s) of {', '.join(str(g) for g in sorted(set(gang)))} {GPU_RESOURCE}"
    if placed == len(gang):
        return Condition(
            RunCondition.ADMITTED, True, "GangAdmitted", f"the whole gang fits: {shape} ({need} GPUs)"
        )
    if need > available.total:
        return Condition(
            RunCondition.ADMITTED,
            False,
            "GangTooLarge",
            f"needs {shape} ({need} GPUs) but the schedulable nodes have {available.total} in all: "
            "lower spec.resources.trainerGpus/rolloutGpus or add GPU nodes",
        )
    return Condition(
        RunCondition.ADMITTED,
        False,
        "InsufficientGPU",
        f"waiting for {shape} ({need} GPUs) to fit at once: {placed} of the {len(gang)} pods fit now (each "
        f"needs its GPUs on one node; free per node, largest first: {_slots(left)}; {sum(left)} of "
        f"{available.total} GPUs free in all). The run starts by itself when other work frees enough "
        "GPUs (no pod is created meanwhile)",
    )


def _slots(free: Sequence[int], shown: int = 8) -> str:
    listed = [str(gpus) for gpus in free if gpus > 0][:shown]
    more = sum(1 for gpus in free if gpus > 0) - len(listed)
    return ", ".join(listed) + (f" and {more} more" if more > 0 else "") if listed else "none"


async def read_capacity(kube: Kube, gangs: Gangs) -> Capacity:
    """One list of nodes and of active pods, cluster-wide (only for runs waiting for admission)."""
    nodes = await kube.list("v1", "nodes")
    pods = await kube.list("v1", "pods", field_selector=ACTIVE_PODS)
    return capacity(nodes, pods, gangs)


async def gang_scheduler(kube: Kube, labels: Mapping[str, Any], scheduler_name: str) -> GangScheduling:
    """Which installed mechanism places the run's Ray pods as one gang: Kueue when the run names a
    LocalQueue and Kueue is served, else scheduler-plugins' coscheduling, else Volcano, else none (the
    operator's own capacity check)."""
    queue = labels.get(KUEUE_QUEUE_LABEL)
    if queue and await kube.serves(*KUEUE_API):
        return GangScheduling(KUEUE, queue=str(queue))
    if await kube.serves(POD_GROUP_APIS[COSCHEDULING], POD_GROUPS):
        return GangScheduling(COSCHEDULING, scheduler_name=scheduler_name)
    if await kube.serves(POD_GROUP_APIS[VOLCANO], POD_GROUPS):
        return GangScheduling(VOLCANO)
    return GangScheduling()


def gang_placed(gang: GangScheduling, pods: Sequence[PodView], members: int) -> Condition:
    """The Admitted condition of a run whose gang a scheduler admits: True once every Ray pod is bound
    to a node; until then the pods wait (Kueue's scheduling gate, or the PodGroup's quorum) (pure)."""
    ray = [
        p
        for p in pods
        if p.component in (lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER) and not p.terminating
    ]
    bound = sum(1 for p in ray if p.node)
    where = f"LocalQueue {gang.queue}" if gang.mechanism == KUEUE else f"its {gang.mechanism} PodGroup"
    if bound >= members:
        return Condition(
            RunCondition.ADMITTED, True, "GangScheduled", f"{gang.mechanism} placed all {members} Ray pods"
        )
    return Condition(
        RunCondition.ADMITTED,
        False,
        "WaitingForGangScheduler",
        f"{bound}/{members} Ray pods placed; {gang.mechanism} binds them together once the whole gang fits "
        f"({where}); the run starts by itself then",
    )
