"""TrainingRun against a real apiserver: validation conditions, the Ray cluster (own pods, or a KubeRay
RayCluster when that CRD is installed), the trainer's narrowly scoped status writes, suspend/resume and
deletion. Where a test sets the RayCluster's status it stands in for the KubeRay controller, which is not
installed here (the test installs only a minimal copy of its CRD)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fixtures.cluster import KubeCluster
from fixtures.minio_server import MinioServer
from operator_harness import Namespace, OperatorProcess, metric_value, pool_manifest, wait_for

from cuda_agent.localhost import free_port

RUN = "run"
TRAINER = f"system:serviceaccount:{{ns}}:{RUN}-trainer"


def run_manifest(
    name: str = RUN, suspend: bool = False, pool: str = "pool", prefix: str | None = None
) -> dict[str, Any]:
    """A run of one 8-GPU Ray worker; `prefix` is its spec.checkpoint.prefix (the operator derives one
    under the namespace's storage when absent; a prefix the spec names must lie there too)."""
    return {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"base": "s3://models/qwen2-1.5b"},
            "dataset": {"uri": "s3://datasets/ops-6k"},
            "sandboxPoolRef": {"name": pool},
            "resources": {"trainerGpus": 4, "rolloutGpus": 4},
            "checkpoint": {"everySteps": 2, **({"prefix": prefix} if prefix else {})},
            "suspend": suspend,
        },
    }


def artifacts_secret(
    endpoint: str = "127.0.0.1:9000", access: str = "a", secret: str = "b"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "cuda-agent-artifacts"},
        "stringData": {
            "AWS_ENDPOINT_URL": f"http://{endpoint}",
            "AWS_ACCESS_KEY_ID": access,
            "AWS_SECRET_ACCESS_KEY": secret,
        },
    }


def phase(ns: Namespace) -> str | None:
    return ((ns.get_or_none("trainingrun", RUN) or {}).get("status") or {}).get("phase")


def condition_true(ns: Namespace, kind: str) -> bool:
    found = ns.condition(f"trainingrun/{RUN}", kind)
    return bool(found and found["status"] == "True")


def as_trainer(ns: Namespace, *args: str, check: bool = True) -> Any:
    return ns.kubectl("--as", TRAINER.format(ns=ns.name), *args, check=check)


def report(ns: Namespace, status: dict[str, Any], run: str = RUN, check: bool = True) -> Any:
    """What the trainer does: a merge patch of its progress on the status subresource, as its own SA."""
    return as_trainer(
        ns, "patch", "trainingrun", run, "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}), check=check,
    )  # fmt: skip


def ray_pods(ns: Namespace) -> list[dict[str, Any]]:
    pods = ns.items("pods", "-l", f"cuda-agent.io/training-run={RUN}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def driver_env(ns: Namespace) -> dict[str, str]:
    container = ns.get("pod", f"{RUN}-driver")["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_run_validates_references_trains_reports_suspends_resumes_and_is_deleted(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    port = free_port()
    operator = operator_factory("--suspend-checkpoint-timeout", "600", "--metrics-port", str(port))
    prefix = f"s3://cuda-agent/{namespace.name}/run"  # inside the namespace's storage
    namespace.apply(run_manifest(prefix=prefix))
    blocked = wait_for(
        lambda: namespace.condition(f"trainingrun/{RUN}", "Provisioning"), "Provisioning condition"
    )
    assert (blocked["status"], blocked["reason"]) == ("False", "SandboxPoolNotFound")
    assert phase(namespace) == "Pending"

    namespace.apply(pool_manifest("pool", 0))
    wait_for(
        lambda: (
            (c := namespace.condition(f"trainingrun/{RUN}", "Provisioning"))
            and c["reason"] == "ArtifactsSecretNotFound"
        ),
        "the missing Secret to be reported",
    )
    assert not ray_pods(namespace)

    namespace.apply(artifacts_secret())
    # No RayCluster CRD: the run owns a Ray head and one 8-GPU worker, then starts the driver pod.
    wait_for(lambda: phase(namespace) == "WarmingUp", "WarmingUp", timeout=120)
    names = sorted(p["metadata"]["name"] for p in ray_pods(namespace))
    assert names == [f"{RUN}-driver", f"{RUN}-ray-head", f"{RUN}-ray-worker-0"]
    namespace.get("service", f"{RUN}-ray-head")
    env = driver_env(namespace)
    assert env["CUDA_AGENT_SANDBOX_URL"] == f"http://pool.{namespace.name}.svc:8470"
    assert "CUDA_AGENT_RESUME_FROM" not in env

    # The trainer reports progress with its own ServiceAccount, and can do nothing else.
    report(
        namespace,
        {
            "step": 2,
            "metrics": {"meanReward": 1.25, "passRate": 0.5},
            "lastCheckpoint": f"{prefix}/step-2",
        },
    )
    wait_for(lambda: phase(namespace) == "Running" and condition_true(namespace, "Training"), "Training")
    assert namespace.get("trainingrun", RUN)["status"]["metrics"]["meanReward"] == 1.25
    namespace.apply(run_manifest(name="other", prefix=prefix))
    denied = report(namespace, {"step": 99}, run="other", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    denied = as_trainer(
        namespace, "patch", "trainingrun", RUN, "--type=merge", "-p", '{"spec":{"suspend":true}}', check=False
    )
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()
    namespace.kubectl("delete", "trainingrun", "other")

    # Suspend: the operator waits for a newer checkpoint, then scales the run to zero.
    namespace.kubectl("patch", "trainingrun", RUN, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    checkpointing = wait_for(
        lambda: (
            (c := namespace.condition(f"trainingrun/{RUN}", "Suspended"))
            and c["reason"] == "Checkpointing"
            and c
        ),
        "Checkpointing",
    )
    assert checkpointing["status"] == "False" and ray_pods(namespace)
    assert phase(namespace) == "Running"  # the trainer still trains while it writes the checkpoint
    # The operator dies while it waits for that checkpoint: its successor keeps waiting (the wait's start
    # is in its record on the run, not in memory) and keeps the compute.
    operator.kill()
    operator.start()
    wait_for(lambda: metric_value(port, "TrainingRun") >= 2, "the new operator's passes over the run")
    waiting = namespace.condition(f"trainingrun/{RUN}", "Suspended")
    assert waiting is not None and waiting["reason"] == "Checkpointing" and ray_pods(namespace)
    report(namespace, {"step": 3, "lastCheckpoint": f"{prefix}/step-3"})
    wait_for(lambda: phase(namespace) == "Suspended" and not ray_pods(namespace), "suspension to zero pods")
    assert condition_true(namespace, "Suspended")
    # And while suspended: the new operator finds it Suspended and creates nothing.
    operator.kill()
    operator.start()
    wait_for(lambda: metric_value(port, "TrainingRun") >= 2, "the new operator's passes over the run")
    assert phase(namespace) == "Suspended" and not ray_pods(namespace)

    # Resume: the compute comes back and the driver resumes from the last checkpoint.
    namespace.kubectl("patch", "trainingrun", RUN, "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: namespace.get_or_none("pod", f"{RUN}-driver"), "the driver pod again", timeout=120)
    env = driver_env(namespace)
    assert env["CUDA_AGENT_RESUME_FROM"] == f"{prefix}/step-3"
    wait_for(lambda: phase(namespace) == "Running", "Running after resume")

    # Delete: owner references remove everything the run created.
    uid = namespace.get("trainingrun", RUN)["metadata"]["uid"]
    assert not namespace.get("trainingrun", RUN)["metadata"].get("finalizers")
    namespace.kubectl("delete", "trainingrun", RUN, "--wait=true", "--timeout=60s")

    def leftovers() -> list[str]:
        found = []
        for kind in ("pods", "services", "configmaps", "serviceaccounts", "roles", "rolebindings"):
            for item in namespace.items(kind):
                if any(ref["uid"] == uid for ref in item["metadata"].get("ownerReferences", [])):
                    found.append(f"{kind}/{item['metadata']['name']}")
        return found

    wait_for(lambda: not leftovers(), "garbage collection of the run's children")


def test_run_created_suspended_never_creates_pods(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    operator_factory()
    namespace.apply(pool_manifest("pool", 0))
    namespace.apply(artifacts_secret())
    namespace.apply(run_manifest(suspend=True))  # created suspended, as queueing controllers create jobs
    wait_for(lambda: phase(namespace) == "Suspended", "Suspended")
    namespace.get("role", f"{RUN}-trainer")
    assert not ray_pods(namespace)


RAYCLUSTER_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "rayclusters.ray.io"},
    "spec": {
        "group": "ray.io",
        "names": {
            "kind": "RayCluster",
            "listKind": "RayClusterList",
            "plural": "rayclusters",
            "singular": "raycluster",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def raycluster_crd(kube_cluster: KubeCluster) -> Iterator[None]:
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(RAYCLUSTER_CRD))
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/rayclusters.ray.io")
    yield
    kube_cluster.kubectl("delete", "crd", "rayclusters.ray.io", "--wait=true", "--timeout=60s", check=False)


def test_run_uses_a_kuberay_raycluster_when_the_crd_is_installed(
    raycluster_crd: None,
    namespace: Namespace,
    operator_factory: Callable[..., OperatorProcess],
    minio_server: MinioServer,
) -> None:
    operator_factory()
    namespace.apply(pool_manifest("pool", 0))
    namespace.apply(artifacts_secret(minio_server.endpoint, minio_server.access_key, minio_server.secret_key))
    prefix = f"s3://cuda-agent/{namespace.name}/run"
    namespace.apply(run_manifest(prefix=prefix))
    cluster = wait_for(lambda: namespace.get_or_none("raycluster", RUN), "the RayCluster")
    groups = {g["groupName"]: g["replicas"] for g in cluster["spec"]["workerGroupSpecs"]}
    assert groups == {"gpu8": 1}
    assert not ray_pods(namespace)  # KubeRay, not the operator, would create the pods; the driver waits

    # Stand in for the KubeRay controller: the cluster is ready.
    namespace.kubectl(
        "patch",
        "raycluster",
        RUN,
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"state":"ready"}}',
    )
    wait_for(lambda: namespace.get_or_none("pod", f"{RUN}-driver"), "the driver pod")
    env = driver_env(namespace)
    assert env["RAY_ADDRESS"] == f"ray://{RUN}-head-svc.{namespace.name}.svc:10001"
    wait_for(lambda: phase(namespace) == "WarmingUp", "WarmingUp")

    # A checkpoint the trainer wrote to MinIO outlives the run: the operator never deletes artifacts.
    from minio import Minio

    client = Minio(minio_server.endpoint, minio_server.access_key, minio_server.secret_key, secure=False)
    if not client.bucket_exists("cuda-agent"):
        client.make_bucket("cuda-agent")
    key = f"{namespace.name}/run/step-2/actor.pt"
    client.put_object("cuda-agent", key, io.BytesIO(b"weights"), 7)
    report(namespace, {"step": 2, "lastCheckpoint": f"{prefix}/step-2"})

    namespace.kubectl("patch", "trainingrun", RUN, "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(
        lambda: (
            (c := namespace.condition(f"trainingrun/{RUN}", "Suspended")) and c["reason"] == "Checkpointing"
        ),
        "Checkpointing",
    )
    report(namespace, {"step": 3, "lastCheckpoint": f"{prefix}/step-3"})
    wait_for(lambda: phase(namespace) == "Suspended", "Suspended")
    wait_for(lambda: not namespace.get_or_none("raycluster", RUN), "the RayCluster to be deleted")

    namespace.kubectl("delete", "trainingrun", RUN, "--wait=true", "--timeout=60s")
    wait_for(lambda: not namespace.get_or_none("role", f"{RUN}-trainer"), "garbage collection")
    assert client.get_object("cuda-agent", key).read() == b"weights"
