"""The cluster executor: a TrainingRun's training in pods (the RunExecutor seam below the run reconciler;
the protocol lives in context.py, with the context that holds an executor).

The reconcile pass (run_reconciler's RUN_STEPS) is the same in every mode: validate, write the trainer's
identity and run file, ask its executor what runs now (`observe`), decide suspension and the run's end,
then ask it to stop the compute (`remove`) or create what is missing (`ensure`), and write one status.
The cluster executor runs the trainer in pods on a Ray cluster (KubeRay's or the run's own pods); the
local executor (local_executor.py) runs the trainer and a sandbox server as processes on this machine,
for the embedded default where kwok's nodes cannot run pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.operator import labels as lb
from cuda_agent.operator.apply import apply_changed
from cuda_agent.operator.compute import Compute, DriverState
from cuda_agent.operator.conditions import parse_rfc3339
from cuda_agent.operator.context import OperatorContext
from cuda_agent.operator.kube import KubeError, Ref
from cuda_agent.operator.run_children import (
    RunContext,
    driver_pod,
    pod_group,
    ray_cluster,
    ray_head_service,
    ray_pods,
)
from cuda_agent.operator.views import ChildView, PodView

LOG_TAIL_LINES = 20  # of a failed trainer, copied into the Failed condition
# Container states that will not fix themselves quickly; the start timeout names them as its reason.
STUCK_WAITING = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError")  # fmt: skip


def driver_state(driver: PodView | None, backoff_limit: int) -> tuple[DriverState, str, str]:
    """(state, message, failure reason) of the trainer driver pod. The pod restarts a crashed trainer
    in place (restartPolicy OnFailure); more than `backoff_limit` restarts fail the run."""
    if driver is None:
        return "absent", "driver pod not created yet", ""
    oom = driver.exit_reason == "OOMKilled"
    if driver.phase == "Succeeded":
        return "complete", "trainer finished", ""
    if driver.phase == "Failed":
        # No container termination means the pod itself was ended (evicted, node lost, deadline).
        reason = "OOMKilled" if oom else "DriverFailed" if driver.exit_reason else "DriverPodFailed"
        return "failed", f"driver pod failed: {driver.last_exit or 'no reason given'}", reason
    if driver.restarts > backoff_limit:
        message = (
            f"trainer crashed {driver.restarts} times, more than "
            f"spec.runPolicy.backoffLimit={backoff_limit}; last: {driver.last_exit}"
        )
        return "failed", message, "OOMKilled" if oom else "BackoffLimitExceeded"
    if driver.phase == "Running" and not driver.terminating:
        restarted = f" (restarted {driver.restarts}x; last: {driver.last_exit})" if driver.restarts else ""
        return "active", f"trainer running{restarted}", ""
    return "pending", driver.unschedulable or driver.waiting or "driver pod starting", ""


def stuck_pod(pods: Sequence[PodView]) -> tuple[str, str] | None:
    """(reason, message) of the first of a run's pods that cannot start by itself."""
    for pod in pods:
        if pod.terminating:
            continue
        if pod.unschedulable:
            return "Unschedulable", f"pod {pod.name}: {pod.unschedulable}"
        if pod.waiting_reason in STUCK_WAITING:
            return str(pod.waiting_reason), f"pod {pod.name}: {pod.waiting}"
    return None


def ray_state(
    kuberay: bool, cluster: ChildView | None, pods: Sequence[PodView], expected: Sequence[str]
) -> tuple[bool, str]:
    """Whether the Ray cluster is up: KubeRay's verdict, or all of the run's own head/worker pods Ready.
    Only the pods the spec asks for (`expected`, by name) count: a worker left from an earlier spec
    (pods are never updated) is not a ready one of these."""
    if kuberay:
        if cluster is None:
            return False, "RayCluster not created yet"
        state = str(cluster.status.get("state") or "")
        provisioned = any(
            c.get("type") == "RayClusterProvisioned" and c.get("status") == "True"
            for c in cluster.status.get("conditions") or ()
        )
        return (state == "ready" or provisioned), f"RayCluster state {state or 'unknown'}"
    ray = [
        p
        for p in pods
        if dict(p.labels).get(lb.COMPONENT) in (lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER)
    ]
    wanted = set(expected)
    ready = sum(1 for p in ray if p.ready and not p.terminating and p.name in wanted)
    stuck = stuck_pod(ray)
    message = f"{ready}/{len(wanted)} Ray pods ready" + (f"; {stuck[1]}" if stuck else "")
    return ready >= len(wanted) and bool(wanted), message


def ray_pod_names(run: RunContext, spec: TrainingRunSpec) -> list[str]:
    """The names of the head and worker pods the spec asks for (a Ray cluster the run owns)."""
    return [str(pod["metadata"]["name"]) for pod in ray_pods(run, spec)]


def compute_since(children: Mapping[tuple[str, str], ChildView], pods: Sequence[PodView]) -> datetime | None:
    """When the oldest of the run's compute children was created (by the apiserver's clock, which no
    writer sets): where a restarted operator that lost its record of the admission counts from."""
    stamps = [
        child.created
        for (kind, name), child in children.items()
        if kind == "RayCluster" or (kind == "Service" and name.endswith("-ray-head"))
    ]
    stamps += [p.created for p in pods if p.component in COMPUTE_COMPONENTS and not p.terminating]
    found = [moment for stamp in stamps if (moment := parse_rfc3339(stamp)) is not None]
    return min(found) if found else None


COMPUTE_COMPONENTS = (lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER, lb.COMPONENT_DRIVER)


def compute_children(
    children: Mapping[tuple[str, str], ChildView], pods: Sequence[PodView], keep_driver: bool
) -> list[Ref]:
    """The run's GPU-holding children (Ray cluster, driver): what suspension and the end remove.
    A finished driver pod stays (its logs); KubeRay's own pods go with their RayCluster."""
    found = [Ref(kind, "", name) for kind, name in children if kind == "RayCluster"]
    found += [
        Ref(kind, "", name) for kind, name in children if kind == "Service" and name.endswith("-ray-head")
    ]
    own = (lb.COMPONENT_RAY_HEAD, lb.COMPONENT_RAY_WORKER) + (() if keep_driver else (lb.COMPONENT_DRIVER,))
    found += [
        Ref("Pod", "", p.name)
        for p in pods
        if p.component in own and not dict(p.labels).get("ray.io/cluster") and not p.terminating
    ]
    return found


class ClusterExecutor:
    """The trainer in pods: a Ray cluster (KubeRay's RayCluster, or head/worker pods the run owns) and a
    driver pod running `cuda-agent train`. Everything is read from the operator's watch indexes."""

    gang_admission = True

    async def observe(self, context: OperatorContext, run: RunContext, spec: TrainingRunSpec) -> Compute:
        key = (lb.RUN_KIND, run.namespace, run.name)
        children, pods = context.children_of(key), context.pods_of(key)
        kuberay = await _kuberay_installed(context, children)
        view = next((p for p in pods if p.name == lb.driver_name(run.name) and not p.terminating), None)
        driver, driver_message, failure = driver_state(view, spec.run_policy.backoff_limit)
        ready, ready_message = ray_state(
            kuberay, children.get(("RayCluster", run.name)), pods, ray_pod_names(run, spec)
        )
        exists = bool(compute_children(children, pods, keep_driver=False))
        stuck = stuck_pod(pods)
        return Compute(
            exists, ready, ready_message, driver, driver_message, failure_reason=failure, stuck=stuck,
            since=compute_since(children, pods),
        )  # fmt: skip

    async def log_tail(self, context: OperatorContext, run: RunContext, lines: int) -> str:
        """From the kubelet, through the apiserver: the crashed container's log (`previous`) while the
        pod restarts it, else the current one (a pod that ended)."""
        pods = context.pods_of((lb.RUN_KIND, run.namespace, run.name))
        view = next((p for p in pods if p.name == lb.driver_name(run.name)), None)
        if view is None:
            return "(no driver pod to read logs from)"
        previous = view.phase not in ("Succeeded", "Failed")
        try:
            return await context.kube.pod_log(run.namespace, view.name, tail_lines=lines, previous=previous)
        except (KubeError, TimeoutError, OSError) as error:
            return f"(logs of pod {view.name} could not be read: {error})"

    async def ensure(
        self, context: OperatorContext, run: RunContext, spec: TrainingRunSpec
    ) -> tuple[list[str], list[str]]:
        """The Ray cluster, then (once it is up) the driver. Pods are created, never updated (their specs
        are immutable); a running trainer picks up spec changes on resume."""
        key = (lb.RUN_KIND, run.namespace, run.name)
        children, pods = context.children_of(key), context.pods_of(key)
        kuberay = await _kuberay_installed(context, children)
        if kuberay:
            created, errors = await apply_changed(context, [ray_cluster(run, spec)], children)
        else:
            existing = {p.name for p in pods if not p.terminating}
            missing = [pod for pod in ray_pods(run, spec) if pod["metadata"]["name"] not in existing]
            group = pod_group(run, spec)  # before its pods: coscheduling/Volcano look it up by name
            wanted = [*([group] if group is not None else []), ray_head_service(run), *missing]
            created, errors = await apply_changed(context, wanted, children)
        ready, _ = ray_state(kuberay, children.get(("RayCluster", run.name)), pods, ray_pod_names(run, spec))
        if ready and not any(p.name == lb.driver_name(run.name) and not p.terminating for p in pods):
            driver, driver_errors = await apply_changed(context, [driver_pod(run, spec, kuberay)], children)
            created, errors = created + driver, errors + driver_errors
        return created, errors

    async def remove(self, context: OperatorContext, run: RunContext, keep_finished: bool) -> list[str]:
        key = (lb.RUN_KIND, run.namespace, run.name)
        pods = context.pods_of(key)
        view = next((p for p in pods if p.name == lb.driver_name(run.name) and not p.terminating), None)
        keep = keep_finished and _finished(view)
        removed = []
        for ref in compute_children(context.children_of(key), pods, keep_driver=keep):
            if await context.kube.delete(Ref(ref.kind, run.namespace, ref.name)):
                removed.append(f"{ref.kind}/{ref.name}")
        return removed

    def forget(self, namespace: str, name: str) -> None:
        return None  # owner references let the garbage collector delete the pods

    async def close(self) -> None:
        return None  # pods outlive the operator


def _finished(driver: PodView | None) -> bool:
    # A driver that exited stays for its logs; one still crash-looping goes with the rest.
    return driver is not None and driver.phase in ("Succeeded", "Failed")


async def _kuberay_installed(context: OperatorContext, children: Mapping[tuple[str, str], ChildView]) -> bool:
    """A run keeps the mode it started in; a new Ray cluster is a RayCluster when the CRD is served."""
    if any(kind == "RayCluster" for kind, _ in children):
        return True
    if any(kind == "Service" and name.endswith("-ray-head") for kind, name in children):
        return False
    return await context.kube.serves("ray.io/v1", "rayclusters")
