"""Fixtures of the operator's cluster tests: a namespace per test and the operator as a real subprocess
(helpers in operator_harness.py, a uniquely named module: several test directories have a conftest)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures.cluster import KubeCluster
from operator_harness import Namespace, OperatorProcess


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[Namespace]:
    """A fresh namespace that enforces Pod Security "restricted"; released afterwards, so the next test
    finds every GPU free again."""
    name = f"op-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    kube_cluster.kubectl(
        "label", "namespace", name,
        "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/enforce-version=latest",
    )  # fmt: skip
    try:
        yield Namespace(kube_cluster, name)
    finally:
        release_namespace(kube_cluster, name)


def release_namespace(kube_cluster: KubeCluster, name: str) -> None:
    """Frees the namespace's GPUs for the next test without waiting for the namespace controller's
    sweep (~10 s a test): a Terminating namespace admits no new pod, and pods on kwok nodes (no kubelet
    to confirm their end) are force-deleted, so only their removal is waited for."""
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    kube_cluster.kubectl(
        "delete", "pods", "--all", "-n", name, "--grace-period=0", "--force", "--wait=false", check=False
    )
    kube_cluster.kubectl("wait", "--for=delete", "pods", "--all", "-n", name, "--timeout=120s", check=False)


@pytest.fixture
def operator_factory(
    kube_cluster: KubeCluster, namespace: Namespace, tmp_path: Path
) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(*extra_args: str) -> OperatorProcess:
        operator = OperatorProcess(kube_cluster.kubeconfig, namespace.name, tmp_path, list(extra_args))
        operator.start()
        started.append(operator)
        return operator

    yield start
    for operator in started:
        operator.stop()
        if operator.starts:
            print(f"--- operator log ({operator.workdir}) ---\n{operator.log_text()[-6000:]}")
