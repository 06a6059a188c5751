"""SandboxPool against a real apiserver, scheduler and controller-manager with 16 kwok nodes of 8 GPUs.

kwok marks scheduled pods Running and Ready but runs no containers, so pods never serve /v1/status at
their (10.x) pod IPs; the operator is allowed to contact loopback only, and a drain of such a pod waits
for the (short, in these tests) drain grace period.
"""

from __future__ import annotations

from collections.abc import Callable

from operator_harness import Namespace, OperatorProcess, pool_manifest, wait_for

POOL = "pool"


def pool_status(ns: Namespace) -> dict[str, object]:
    return dict((ns.get_or_none("sandboxpool", POOL) or {}).get("status") or {})


def ready_pods(ns: Namespace, count: int) -> bool:
    status = pool_status(ns)
    ready = ns.condition(f"sandboxpool/{POOL}", "Ready")
    return (
        status.get("readyReplicas") == count
        and status.get("replicas") == count
        and bool(ready and ready["status"] == "True")
    )


def live_pods(ns: Namespace) -> list[dict[str, object]]:
    pods = ns.items("pods", "-l", f"cuda-agent.io/sandbox-pool={POOL}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def test_pool_of_128_becomes_ready_on_gpu_nodes_and_scales_to_64_and_back(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory("--drain-grace-period", "2")
    namespace.apply(pool_manifest(POOL, 128))
    wait_for(lambda: ready_pods(namespace, 128), "128 ready sandbox pods", timeout=300)

    # Pod Security "restricted" is enforced in this namespace: the apiserver admitted every pod.
    pods = live_pods(namespace)
    assert len(pods) == 128
    nodes = {n["metadata"]["name"]: n for n in namespace.cluster.cluster.get_json("nodes")["items"]}
    for pod in pods:
        node = nodes[pod["spec"]["nodeName"]]  # type: ignore[index]
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    per_node: dict[str, int] = {}
    for pod in pods:
        per_node[pod["spec"]["nodeName"]] = per_node.get(pod["spec"]["nodeName"], 0) + 1  # type: ignore[index]
    assert max(per_node.values()) <= 8
    status = pool_status(namespace)
    assert status["selector"] == "app.kubernetes.io/component=sandbox,cuda-agent.io/sandbox-pool=pool"
    assert status["observedGeneration"] == namespace.get("sandboxpool", POOL)["metadata"]["generation"]
    for kind in ("service", "networkpolicy", "statefulset"):
        namespace.get(kind, POOL)
    namespace.get("configmap", f"{POOL}-judge")

    # /scale: the same door an HPA uses.
    namespace.kubectl("scale", f"sandboxpool/{POOL}", "--replicas=64")
    wait_for(lambda: ready_pods(namespace, 64) and len(live_pods(namespace)) == 64, "64 sandbox pods")
    names = sorted(int(p["metadata"]["name"].rsplit("-", 1)[1]) for p in live_pods(namespace))  # type: ignore[index]
    assert names == list(range(64))  # the highest ordinals, the drained ones, went
    assert any("128 -> 64" in e["message"] for e in namespace.events("Scaled"))

    namespace.kubectl("scale", f"sandboxpool/{POOL}", "--replicas=128")
    wait_for(lambda: ready_pods(namespace, 128), "128 ready sandbox pods again", timeout=300)


def test_pool_larger_than_the_cluster_reports_insufficient_gpus(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory()
    # 17 pods of 8 GPUs on 16 nodes of 8 GPUs: one pod can never be placed.
    namespace.apply(pool_manifest(POOL, 17, gpu={"count": 8, "product": "NVIDIA-H200"}))

    def degraded() -> dict[str, object] | None:
        found = namespace.condition(f"sandboxpool/{POOL}", "Degraded")
        return found if found and found["status"] == "True" else None

    condition = wait_for(degraded, "Degraded condition")
    assert condition["reason"] == "InsufficientGPU"
    assert "nvidia.com/gpu" in str(condition["message"])
    ready = namespace.condition(f"sandboxpool/{POOL}", "Ready")
    assert ready is not None and ready["status"] == "False"
    wait_for(lambda: pool_status(namespace).get("readyReplicas") == 16, "16 of 17 pods ready")


def test_an_hpa_drives_the_pool_through_scale(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory()
    namespace.apply(pool_manifest(POOL, 2))
    wait_for(lambda: ready_pods(namespace, 2), "2 ready pods")
    # No metrics server here: the HPA controller still reads /scale and raises replicas to its minimum.
    namespace.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": POOL},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "cuda-agent.io/v1alpha1",
                    "kind": "SandboxPool",
                    "name": POOL,
                },
                "minReplicas": 3,
                "maxReplicas": 6,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    }
                ],
            },
        }
    )
    wait_for(lambda: ready_pods(namespace, 3), "the HPA's minimum of 3 ready pods")
    able = namespace.condition(f"horizontalpodautoscaler/{POOL}", "AbleToScale")
    assert able is not None and able["status"] == "True"


def test_restart_mid_scale_up_leaves_no_duplicates_and_deleted_children_come_back(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator = operator_factory()
    namespace.apply(pool_manifest(POOL, 128))
    # Kill it while the pool is scaling up: after the StatefulSet exists, before every pod is ready.
    wait_for(lambda: namespace.get_or_none("statefulset", POOL), "the StatefulSet", interval=0.1)
    operator.kill()
    assert int(str(pool_status(namespace).get("readyReplicas") or 0)) < 128
    operator.start()
    wait_for(lambda: ready_pods(namespace, 128), "128 ready sandbox pods after the restart", timeout=300)

    uid = namespace.get("sandboxpool", POOL)["metadata"]["uid"]
    for kind in ("statefulsets", "services", "networkpolicies", "configmaps"):
        owned = [
            item
            for item in namespace.items(kind, "-l", "app.kubernetes.io/managed-by=cuda-agent-operator")
            if any(ref["uid"] == uid for ref in item["metadata"].get("ownerReferences", []))
        ]
        assert len(owned) == 1, kind
    pods = live_pods(namespace)
    assert len({p["metadata"]["name"] for p in pods}) == len(pods) == 128  # type: ignore[index]

    # Level-based: children deleted behind the operator's back are recreated.
    namespace.kubectl("delete", "service", POOL)
    namespace.kubectl("delete", "networkpolicy", POOL)
    namespace.kubectl("delete", "configmap", f"{POOL}-judge")
    wait_for(lambda: namespace.get_or_none("service", POOL), "the Service to come back")
    wait_for(lambda: namespace.get_or_none("networkpolicy", POOL), "the NetworkPolicy to come back")
    wait_for(lambda: namespace.get_or_none("configmap", f"{POOL}-judge"), "the ConfigMap to come back")

    # No Kopf finalizer on the pool: deleting it needs no operator, owner references clean up.
    operator.kill()
    assert not namespace.get("sandboxpool", POOL)["metadata"].get("finalizers")
    namespace.kubectl("delete", "sandboxpool", POOL, "--wait=true", "--timeout=60s")
    wait_for(lambda: not namespace.get_or_none("statefulset", POOL), "garbage collection of the StatefulSet")
