"""What kubectl shows and does with the generated CRDs: `explain` prints the models' field docs, `get`
prints the printer columns, and `scale` works through SandboxPool's /scale subresource."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.cluster

POOL: dict[str, Any] = {
    "apiVersion": "cuda-agent.io/v1alpha1",
    "kind": "SandboxPool",
    "metadata": {"name": "scaled"},
    "spec": {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}, "image": "sandbox:0.1.0"},
}
RUN: dict[str, Any] = {
    "apiVersion": "cuda-agent.io/v1alpha1",
    "kind": "TrainingRun",
    "metadata": {"name": "shown"},
    "spec": {
        "model": {"base": "/models/q"},
        "dataset": {"uri": "/data/ops-6k"},
        "sandboxPoolRef": {"name": "scaled"},
    },
}


@pytest.fixture(scope="module")
def namespace(kube_cluster: Any) -> Iterator[str]:
    name = f"explain-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def explain(kube_cluster: Any, field: str) -> str:
    # The apiserver publishes a new CRD's OpenAPI a moment after the CRD is established: retry a bounded
    # number of times instead of failing on that race.
    for _ in range(30):
        result = kube_cluster.kubectl("explain", field, check=False)
        if result.returncode == 0:
            return str(result.stdout)
        time.sleep(1)
    pytest.fail(f"kubectl explain {field} kept failing: {result.stderr}")


def patch_status(kube_cluster: Any, namespace: str, name: str, status: dict[str, Any]) -> None:
    """Write status the way the operator does: a merge patch through the status subresource."""
    patch = json.dumps({"status": status})
    kube_cluster.kubectl("patch", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)


def test_explain_shows_field_docs(kube_cluster: Any) -> None:
    text = explain(kube_cluster, "trainingrun.spec.algorithm")
    assert "Policy-optimisation hyperparameters." in text
    for field, doc in [
        ("clipLow", "Lower clip range"),
        ("clipHigh", "clip-higher"),
        ("actorLearningRate", "Actor (policy) learning rate."),
        ("gaeLambda", "GAE lambda."),
        ("steps", "PPO steps (policy updates) to run."),
    ]:
        assert field in text and doc in text, f"{field} / {doc!r} missing from:\n{text}"


def test_explain_by_short_name(kube_cluster: Any) -> None:
    text = explain(kube_cluster, "sp.spec.autoscaling")
    assert "targetSessionsPerReplica" in text and "Queue-depth autoscaling" in text


def test_scale_subresource(kube_cluster: Any, namespace: str) -> None:
    kube_cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=yaml.safe_dump(POOL))
    kube_cluster.kubectl("scale", "sp/scaled", "--replicas=5", "-n", namespace)
    replicas = kube_cluster.kubectl(
        "get", "sp", "scaled", "-n", namespace, "-o", "jsonpath={.spec.replicas}"
    ).stdout
    assert replicas == "5"

    # The operator writes status.replicas and status.selector; /scale reports them.
    status = {"replicas": 3, "selector": "app.kubernetes.io/instance=scaled"}
    patch_status(kube_cluster, namespace, "sp/scaled", status)
    scale = json.loads(
        kube_cluster.kubectl(
            "get", "--raw", f"/apis/cuda-agent.io/v1alpha1/namespaces/{namespace}/sandboxpools/scaled/scale"
        ).stdout
    )
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 5
    assert scale["status"] == {"replicas": 3, "selector": "app.kubernetes.io/instance=scaled"}


def test_scale_outside_autoscaling_bounds_is_rejected(kube_cluster: Any, namespace: str) -> None:
    pool = {**POOL, "metadata": {"name": "bounded"}}
    kube_cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=yaml.safe_dump(pool))
    result = kube_cluster.kubectl("scale", "sp/bounded", "--replicas=20", "-n", namespace, check=False)
    assert result.returncode != 0
    assert "spec.replicas must lie within" in result.stderr, result.stderr


def test_printer_columns(kube_cluster: Any, namespace: str) -> None:
    kube_cluster.kubectl("apply", "--server-side", "-n", namespace, "-f", "-", input=yaml.safe_dump(RUN))
    status = {"phase": "Running", "step": 12, "metrics": {"meanReward": 1.5, "passRate": 0.75}}
    patch_status(kube_cluster, namespace, "tr/shown", status)
    header, row = kube_cluster.kubectl("get", "tr", "shown", "-n", namespace).stdout.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "STEP", "REWARD", "PASS", "RATE", "AGE"]
    assert row.split()[:5] == ["shown", "Running", "12", "1.5", "0.75"]

    wide = kube_cluster.kubectl("get", "tr", "shown", "-n", namespace, "-o", "wide").stdout
    assert "MODEL" in wide and "/models/q" in wide

    pools = kube_cluster.kubectl("get", "sp", "-n", namespace).stdout.splitlines()[0]
    assert pools.split() == ["NAME", "READY", "DESIRED", "QUEUE", "SESSIONS", "AGE"]

    everything = kube_cluster.kubectl("get", "cuda-agent", "-n", namespace, "-o", "name").stdout.split()
    assert "trainingrun.cuda-agent.io/shown" in everything
