"""The local control plane behaves like a GPU cluster: kwok nodes with 8 GPUs each are Ready, the real
scheduler places GPU pods by capacity, kwok runs them, and kube-controller-manager garbage-collects.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fixtures.cluster import GPU_PRODUCT, REPO_ROOT, KubeCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists, so admission lets pods in."""
    name = f"t-{secrets.token_hex(4)}"
    kube_cluster.kubectl("create", "namespace", name)
    kube_cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=60s")
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false")


def gpu_pod(name: str, gpus: int) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/sandbox:never-pulled",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }
    return json.dumps(pod)


def test_fake_gpu_nodes_are_ready_with_eight_gpus(kube_cluster: KubeCluster) -> None:
    nodes = json.loads(kube_cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json").stdout)["items"]

    assert len(nodes) == 16
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == GPU_PRODUCT


def test_repo_crds_are_established(kube_cluster: KubeCluster) -> None:
    expected = sorted(
        doc["metadata"]["name"]
        for path in (REPO_ROOT / "crds").glob("*.yaml")
        for doc in yaml.safe_load_all(Path(path).read_text())
        if doc
    )
    served = json.loads(kube_cluster.kubectl("get", "crds", "-o", "json").stdout)["items"]
    established = sorted(
        crd["metadata"]["name"]
        for crd in served
        if any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    )

    assert sorted(kube_cluster.crds) == expected
    assert set(expected) <= set(established)


def test_pod_requesting_eight_gpus_runs_on_a_kwok_node(kube_cluster: KubeCluster, namespace: str) -> None:
    kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=gpu_pod("fits", 8))

    kube_cluster.kubectl(
        "wait", "-n", namespace, "pod/fits", "--for=jsonpath={.status.phase}=Running", "--timeout=90s"
    )
    pod = json.loads(kube_cluster.kubectl("get", "-n", namespace, "pod/fits", "-o", "json").stdout)
    assert pod["spec"]["nodeName"] in kube_cluster.nodes


def test_pod_requesting_nine_gpus_stays_pending_as_unschedulable(
    kube_cluster: KubeCluster, namespace: str
) -> None:
    kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=gpu_pod("too-big", 9))

    kube_cluster.kubectl(
        "wait",
        "-n",
        namespace,
        "pod/too-big",
        '--for=jsonpath={.status.conditions[?(@.type=="PodScheduled")].reason}=Unschedulable',
        "--timeout=90s",
    )
    pod = json.loads(kube_cluster.kubectl("get", "-n", namespace, "pod/too-big", "-o", "json").stdout)
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]


def test_deleting_an_owner_garbage_collects_its_dependent(kube_cluster: KubeCluster, namespace: str) -> None:
    kube_cluster.kubectl("create", "configmap", "owner", "-n", namespace, "--from-literal=role=owner")
    owner_uid = kube_cluster.kubectl(
        "get", "configmap/owner", "-n", namespace, "-o", "jsonpath={.metadata.uid}"
    )
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid.stdout.strip()}
            ],
        },
        "data": {"role": "dependent"},
    }
    kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(dependent))

    kube_cluster.kubectl("delete", "configmap/owner", "-n", namespace, "--cascade=background")

    kube_cluster.kubectl("wait", "--for=delete", "configmap/dependent", "-n", namespace, "--timeout=90s")
    gone = kube_cluster.kubectl("get", "configmap/dependent", "-n", namespace, check=False)
    assert gone.returncode != 0
    assert "NotFound" in gone.stderr
