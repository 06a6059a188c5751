"""Gang admission from node allocatable and pod requests (pure parts), and the Events of transitions."""

from __future__ import annotations

from typing import Any

from cuda_agent.operator.admission import Capacity, capacity, fits, gang_condition
from cuda_agent.operator.events import changed_fields, condition_events


def node(name: str, gpus: int, ready: bool = True, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": spec,
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pod(
    gpus: int, node_name: str | None = None, run: str | None = None, name: str = "p", namespace: str = "team"
) -> dict[str, Any]:
    """A pod; `run` labels it as a run's and makes that run (uid `<run>-uid`) its controller."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if run:
        meta["labels"] = {"cuda-agent.io/training-run": run}
        meta["ownerReferences"] = [
            {"apiVersion": "cuda-agent.io/v1alpha1", "kind": "TrainingRun", "name": run, "uid": f"{run}-uid",
             "controller": True}
        ]  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": meta, "spec": spec}


def test_free_gpus_are_allocatable_minus_bound_requests_on_schedulable_nodes() -> None:
    nodes = [
        node("a", 8),
        node("b", 8),
        node("cordoned", 8, unschedulable=True),
        node("down", 8, ready=False),
        node("tainted", 8, taints=[{"key": "maintenance", "effect": "NoSchedule"}]),
        node("gpu-taint", 8, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
    ]
    pods = [
        pod(3, "a"), pod(8, "b"), pod(8, run="other", name="other-ray-worker-0"), pod(8), pod(0, "a"),
        pod(9, run="other", name="other-ray-worker-1"),  # asks for more than its place in the gang: 4
        pod(9, run="other", name="other-extra"),  # not a pod the operator creates for that run
        pod(9, run="queued", name="queued-ray-worker-0"),  # a run the operator has not admitted
        pod(9, run="other", name="other-ray-worker-0", namespace="elsewhere"),  # a run of another namespace
    ]  # fmt: skip
    gangs = {("team", "other-uid"): {"other-ray-worker-0": 8, "other-ray-worker-1": 4}}
    found = capacity(nodes, pods, gangs)
    assert dict(found.free) == {"a": 5, "b": 0, "gpu-taint": 8}
    # The unbound pods of runs the operator admitted are promised, as much as their place in the gang;
    # a stranger's unschedulable pod is not counted, whatever its labels or owner references say.
    assert sorted(found.promised) == [4, 8] and found.total == 24


def test_the_whole_gang_must_fit_at_once() -> None:
    free = Capacity({"a": 8, "b": 8, "c": 4}, (), 20)
    assert fits([8, 8], free)
    assert not fits([8, 8, 8], free)  # 20 GPUs are free, but not three whole nodes
    assert fits([8, 4, 4], Capacity({"a": 8, "b": 8}, (), 16))
    assert not fits([8], Capacity({"a": 8, "b": 8}, (8, 8), 16))  # promised to a gang in flight


def test_queued_and_too_large_runs_say_why_and_what_to_do() -> None:
    waiting = gang_condition([8] * 10, Capacity({f"n{i}": 8 for i in range(16)}, [8] * 10, 128))
    assert (waiting.status, waiting.reason) == (False, "InsufficientGPU")
    assert "80 GPUs" in waiting.message and "48 of 128" in waiting.message
    too_large = gang_condition([8] * 20, Capacity({f"n{i}": 8 for i in range(16)}, (), 128))
    assert too_large.reason == "GangTooLarge" and "spec.resources" in too_large.message
    assert gang_condition([8], Capacity({"a": 8}, (), 8)).status is True
    # 16 of 32 GPUs are free, but on no node 8 of them: the message says what does not fit, per node.
    split = gang_condition([8, 8], Capacity({"a": 4, "b": 4, "c": 4, "d": 4}, (), 32))
    assert split.reason == "InsufficientGPU"
    assert "0 of the 2 pods fit now" in split.message and "largest first: 4, 4, 4, 4" in split.message


def test_events_follow_transitions_only() -> None:
    before = {"conditions": [{"type": "Failed", "status": "False", "reason": "NotFailed", "message": "x"}]}
    after = {
        "phase": "Failed",
        "conditions": [
            {"type": "Failed", "status": "True", "reason": "OOMKilled", "message": "exit 137"},
            {"type": "Training", "status": "False", "reason": "NotTraining", "message": "idle"},
        ],
    }
    events = condition_events(before, after, lambda c: c["type"] == "Failed" and c["status"] == "True")
    assert [(e.warning, e.reason) for e in events] == [(True, "OOMKilled")]  # a new False is no news
    assert condition_events(after, after, lambda c: True) == []
    assert changed_fields(before, after) == {
        "phase": "Failed",
        "conditions": ["Failed=True/OOMKilled", "Training=False/NotTraining"],
    }


def test_ray_pods_join_the_gang_of_the_installed_scheduler() -> None:
    from dataclasses import replace

    from cuda_agent.api.trainingrun import TrainingRunSpec
    from cuda_agent.operator.run_children import (
        GangScheduling,
        RunContext,
        cluster_gang_labels,
        pod_group,
        ray_pods,
    )

    run = RunContext("run", "team", "uid", "img", "artifacts", "s3://b/p", None, None)
    spec = TrainingRunSpec.model_validate(
        {
            "model": {"base": "s3://models/m"},
            "dataset": {"uri": "s3://data/d"},
            "sandboxPoolRef": {"name": "pool"},
            "resources": {"trainerGpus": 8, "rolloutGpus": 8},
        }
    )
    assert pod_group(run, spec) is None and "schedulerName" not in ray_pods(run, spec)[1]["spec"]

    cosched = replace(run, gang=GangScheduling("coscheduling", scheduler_name="sp-scheduler"))
    group = pod_group(cosched, spec)
    assert group is not None and group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"]["minMember"] == 3 and group["spec"]["minResources"] == {"nvidia.com/gpu": "16"}
    for pod in ray_pods(cosched, spec):
        assert pod["spec"]["schedulerName"] == "sp-scheduler"
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "run-ray"

    volcano = replace(run, gang=GangScheduling("volcano"))
    group = pod_group(volcano, spec)
    assert group is not None and group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    worker = ray_pods(volcano, spec)[1]
    assert worker["spec"]["schedulerName"] == "volcano"
    assert worker["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "run-ray"

    kueue = replace(run, gang=GangScheduling("kueue", queue="team-queue"))
    assert pod_group(kueue, spec) is None
    head = ray_pods(kueue, spec)[0]
    assert head["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-queue"
    assert head["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "3"
    assert cluster_gang_labels(kueue) == {"kueue.x-k8s.io/queue-name": "team-queue"}
    assert cluster_gang_labels(volcano) == {"ray.io/gang-scheduling-enabled": "true"}
