"""The chart against the real local control plane (etcd, kube-apiserver, controllers, kwok GPU nodes):
what `helm template` renders is accepted by the apiserver (server-side dry run, Pod Security "restricted"
for the operator, MinIO and collector pods); `helm install`, `upgrade` and `uninstall`; and the operator,
run with the arguments of the chart's Deployment and the token of the chart's ServiceAccount, reconciles a
SandboxPool and a TrainingRun with exactly the chart's RBAC.

kwok's nodes run no containers, so the operator cannot run in its pod here: it runs as a local process
(`python -m cuda_agent.cli operator` plus the rendered args), authenticated as the chart's ServiceAccount
through a TokenRequest token, which is what the kubelet would mount into the pod.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.cluster import GPU_PRODUCT, KubeCluster
from install_helpers import CHART, EXAMPLE_KEYS, GPU_EXAMPLE, Helm, answers, find, wait_for

from cuda_agent.localhost import free_port
from cuda_agent.operator import labels
from cuda_agent.operator.cli import parse_args

EVERYTHING = ("--set", "minio.enabled=true", "--set", "telemetry.collector.enabled=true")


@pytest.fixture
def namespaces(kube_cluster: KubeCluster) -> Iterator[list[str]]:
    """Namespaces a test creates (append to the list), deleted afterwards. Their pods are removed at once
    (a terminating namespace accepts no new ones), so the next test (the operator's 128-GPU pool, say)
    finds every GPU free without waiting ~10 s per namespace for the namespace controller."""
    created: list[str] = []
    yield created
    if created:
        kube_cluster.kubectl("delete", "namespace", *created, "--ignore-not-found", "--wait=false")
        for name in created:
            force = ("--all", "--force", "--grace-period=0", "--wait=false")
            kube_cluster.kubectl("-n", name, "delete", "pods", *force, check=False)


def new_namespace(cluster: KubeCluster, created: list[str], prefix: str, *labels: str) -> str:
    name = f"{prefix}-{len(created)}-{_token()}"
    cluster.kubectl("create", "namespace", name)
    if labels:
        cluster.kubectl("label", "namespace", name, *labels)
    created.append(name)
    return name


def _token() -> str:
    import secrets

    return secrets.token_hex(3)


def objects_of(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def test_rendered_chart_passes_a_server_side_dry_run(
    kube_cluster: KubeCluster, helm: Helm, namespaces: list[str]
) -> None:
    release_ns = new_namespace(kube_cluster, namespaces, "dry")
    restricted = new_namespace(
        kube_cluster, namespaces, "restricted", "pod-security.kubernetes.io/enforce=restricted"
    )
    variants = {
        "defaults": (),
        "minio-and-collector": EVERYTHING,
        # The example's namespaced watch pointed at this namespace; its pools are real SandboxPools,
        # validated by the CRD's schema and CEL rules.
        "gpu-cluster-example": (
            "-f", str(GPU_EXAMPLE), *EXAMPLE_KEYS, "--set", f"operator.watch.namespaces={{{release_ns}}}",
        ),
    }  # fmt: skip
    for name, values in variants.items():
        manifest = helm(
            "template", f"dry{len(name)}", str(CHART), "-n", release_ns, "--include-crds", *values
        )
        proc = kube_cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "--dry-run=server", "-f", "-",
            input=manifest.stdout, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        if name == "gpu-cluster-example":
            assert proc.stdout.count("sandboxpool.cuda-agent.io/") == 3, proc.stdout
    # Every pod but the seccomp installer's (a hostPath) passes Pod Security "restricted": the long-running
    # ones and the MinIO tenants Job's.
    rendered = objects_of(helm("template", "rel", str(CHART), "-n", restricted, *EVERYTHING).stdout)
    kube_cluster.kubectl(
        "-n", restricted, "create", "serviceaccount", find(rendered, "ServiceAccount")["metadata"]["name"]
    )
    assert [o for o in rendered if o["kind"] == "Job"], "the MinIO tenants Job"
    for deployment in (o for o in rendered if o["kind"] in ("Deployment", "Job")):
        template = deployment["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": deployment["metadata"]["name"], "labels": template["metadata"]["labels"]},
            "spec": template["spec"],
        }
        proc = kube_cluster.kubectl(
            "-n", restricted, "create", "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
        )
        assert proc.returncode == 0 and "violate" not in proc.stderr, proc.stderr


def test_install_upgrade_uninstall(kube_cluster: KubeCluster, helm: Helm, namespaces: list[str]) -> None:
    namespace = new_namespace(kube_cluster, namespaces, "install")
    release = f"ca-{_token()}"
    local = helm.bound_to(kube_cluster.kubeconfig)
    out = local("install", release, str(CHART), "-n", namespace, *EVERYTHING).stdout
    assert f"kubectl -n {namespace} rollout status deployment/{release}-cuda-agent-operator" in out  # NOTES

    def get(*args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(
            kube_cluster.kubectl("-n", namespace, "get", *args, "-o", "json").stdout
        )
        return result

    operator = get("deployment", f"{release}-cuda-agent-operator")
    assert "--workers=4" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    # The Deployment's pod is created: the ServiceAccount and the rendered pod spec are accepted.
    wait_for(
        lambda: get("pods", "-l", "app.kubernetes.io/name=cuda-agent-operator")["items"],
        "the operator pod",
    )
    minio_password = get("secret", f"{release}-cuda-agent-minio")["data"]["MINIO_ROOT_PASSWORD"]
    # The release namespace's artifacts Secret holds its own MinIO user, not the root keys.
    tenant_key = get("secret", "cuda-agent-artifacts")["data"]["AWS_SECRET_ACCESS_KEY"]
    assert tenant_key != minio_password
    cluster_roles = {f"{release}-cuda-agent-operator", f"{release}-cuda-agent-operator-cluster"}
    cluster_roles |= {f"{release}-cuda-agent-edit", f"{release}-cuda-agent-view"}
    for role in cluster_roles:
        kube_cluster.kubectl("get", "clusterrole", role)
    # Namespace users get the two kinds through Kubernetes' default roles (aggregated ClusterRoles).
    for user, role in (("alice", "edit"), ("bob", "view")):
        kube_cluster.kubectl(
            "-n", namespace, "create", "rolebinding", user, f"--clusterrole={role}", f"--user={user}"
        )
    wait_for(
        lambda: can_i(kube_cluster, "alice", "create", "trainingruns.cuda-agent.io", "-n", namespace),
        "edit to aggregate the chart's ClusterRole",
    )
    assert can_i(
        kube_cluster, "alice", "patch", "sandboxpools.cuda-agent.io", "--subresource=scale", "-n", namespace
    )
    assert not can_i(
        kube_cluster, "alice", "patch", "trainingruns.cuda-agent.io", "--subresource=status", "-n", namespace
    )
    wait_for(
        lambda: can_i(kube_cluster, "bob", "list", "trainingruns.cuda-agent.io", "-n", namespace),
        "view to aggregate the chart's ClusterRole",
    )
    assert not can_i(kube_cluster, "bob", "create", "sandboxpools.cuda-agent.io", "-n", namespace)
    assert not can_i(kube_cluster, "bob", "list", "trainingruns.cuda-agent.io", "-n", "default")

    local("upgrade", release, str(CHART), "-n", namespace, "--reuse-values", "--set", "operator.workers=8")
    operator = get("deployment", f"{release}-cuda-agent-operator")
    assert "--workers=8" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    # MinIO's credentials survive the upgrade (its data is tied to them), and so do the namespace's own.
    assert get("secret", f"{release}-cuda-agent-minio")["data"]["MINIO_ROOT_PASSWORD"] == minio_password
    assert get("secret", "cuda-agent-artifacts")["data"]["AWS_SECRET_ACCESS_KEY"] == tenant_key
    history = json.loads(local("history", release, "-n", namespace, "-o", "json").stdout)
    assert [entry["revision"] for entry in history] == [1, 2]

    local("uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")
    gone = kube_cluster.kubectl(
        "-n", namespace, "get", "deployment", f"{release}-cuda-agent-operator", check=False
    )
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    for role in cluster_roles:
        assert kube_cluster.kubectl("get", "clusterrole", role, check=False).returncode != 0
    # CRDs stay (Helm never deletes them: that would delete every pool and run); so do MinIO's data.
    kube_cluster.kubectl("get", "crd", "sandboxpools.cuda-agent.io", "trainingruns.cuda-agent.io")
    kube_cluster.kubectl("-n", namespace, "get", "pvc", f"{release}-cuda-agent-minio")


def token_kubeconfig(cluster: KubeCluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount with a TokenRequest token."""
    admin = json.loads(cluster.kubectl("config", "view", "--raw", "--minify", "-o", "json").stdout)
    token = cluster.kubectl("-n", namespace, "create", "token", account, "--duration=3600s").stdout.strip()
    admin["users"] = [{"name": account, "user": {"token": token}}]
    admin["contexts"][0]["context"]["user"] = account
    path.write_text(json.dumps(admin))
    return path


def can_i(cluster: KubeCluster, subject: str, *args: str) -> bool:
    proc = cluster.kubectl("auth", "can-i", f"--as={subject}", *args, check=False)
    return proc.stdout.strip() == "yes"


@pytest.mark.parametrize("watch", ["namespaced", "cluster-wide"])
def test_operator_reconciles_with_the_charts_rbac(
    kube_cluster: KubeCluster, helm: Helm, namespaces: list[str], tmp_path: Path, watch: str
) -> None:
    operator_ns = new_namespace(kube_cluster, namespaces, "ops")
    team = new_namespace(kube_cluster, namespaces, "team")
    release = f"rb-{_token()}"
    liveness_port, metrics_port = free_port(), free_port()
    local = helm.bound_to(kube_cluster.kubeconfig)
    scope = (
        ("--set", "operator.watch.allNamespaces=false", "--set", f"operator.watch.namespaces={{{team}}}")
        if watch == "namespaced"
        else ("--set", f"artifacts.namespaces={{{team}}}")  # the Secret where the run lives
    )
    local(
        "install", release, str(CHART), "-n", operator_ns, *scope,
        "--set", f"operator.livenessPort={liveness_port}", "--set", f"metrics.port={metrics_port}",
        "--set", "artifacts.external.endpoint=http://127.0.0.1:9",
        "--set", "artifacts.external.accessKey=key", "--set", "artifacts.external.secretKey=secret",
    )  # fmt: skip
    try:
        manifest = objects_of(local("get", "manifest", release, "-n", operator_ns).stdout)
        container = find(manifest, "Deployment", "-operator")["spec"]["template"]["spec"]["containers"][0]
        account = find(manifest, "ServiceAccount")["metadata"]["name"]
        subject = f"system:serviceaccount:{operator_ns}:{account}"
        # A namespaced watch writes only where it watches; Secrets: only the artifacts one, either way.
        assert can_i(kube_cluster, subject, "create", "statefulsets", "-n", team)
        everywhere = can_i(kube_cluster, subject, "create", "statefulsets", "-n", "default")
        assert everywhere == (watch == "cluster-wide")
        assert can_i(kube_cluster, subject, "get", "secret/cuda-agent-artifacts", "-n", team)
        assert not can_i(kube_cluster, subject, "get", "secret/other", "-n", team)
        assert not can_i(kube_cluster, subject, "list", "secrets", "-n", team)
        # Leader election: its own Lease in its own namespace, no other.
        election = parse_args(container["args"]).leader_election
        assert election is not None and election.namespace == operator_ns
        lease = f"leases/{election.lease_name}"
        assert can_i(kube_cluster, subject, "update", lease, "-n", operator_ns)
        assert not can_i(kube_cluster, subject, "update", "leases/other", "-n", operator_ns)
        assert not can_i(kube_cluster, subject, "create", "leases", "-n", team)
        kubeconfig = token_kubeconfig(kube_cluster, operator_ns, account, tmp_path / "operator.kubeconfig")
        # The pod's own arguments; only the liveness address moves to loopback (tests bind 127.0.0.1).
        args = [a.replace("http://0.0.0.0:", "http://127.0.0.1:") for a in container["args"]]
        _run_operator_and_reconcile(
            kube_cluster, team, args, kubeconfig, tmp_path, liveness_port, metrics_port
        )
    finally:
        local("uninstall", release, "-n", operator_ns, check=False)


def _run_operator_and_reconcile(
    cluster: KubeCluster,
    team: str,
    args: list[str],
    kubeconfig: Path,
    tmp_path: Path,
    liveness_port: int,
    metrics_port: int,
) -> None:
    log_path = tmp_path / "operator.log"

    def get(*what: str) -> dict[str, Any] | None:
        found = cluster.kubectl("-n", team, "get", *what, "-o", "json", check=False)
        return json.loads(found.stdout) if found.returncode == 0 else None

    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cuda_agent.cli", "operator", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(
            lambda: proc.poll() is not None or answers(f"http://127.0.0.1:{liveness_port}/healthz"),
            "the operator's liveness endpoint",
        )
        assert proc.poll() is None, log_path.read_text()[-3000:]

        pool = {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "SandboxPool",
            "metadata": {"name": "pool", "namespace": team},
            "spec": {"replicas": 2, "gpu": {"count": 1, "product": GPU_PRODUCT}, "image": "sandbox:test"},
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pool))
        ready = wait_for(
            lambda: (
                (s := (get("sandboxpool", "pool") or {}).get("status") or {}).get("readyReplicas") == 2 and s
            ),
            "the SandboxPool's two pods to be ready",
        )
        assert any(c["type"] == "Ready" and c["status"] == "True" for c in ready["conditions"])
        # A TrainingRun: the operator validates the chart's artifacts Secret, creates the trainer's
        # ServiceAccount, Role and RoleBinding (RBAC lets it grant only what it holds) and decides on
        # admission from every node's and pod's GPUs.
        run = {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "run", "namespace": team},
            "spec": {
                "model": {"base": "pvc://models/tiny"},
                "dataset": {"uri": "pvc://datasets/tiny"},
                "sandboxPoolRef": {"name": "pool"},
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(run))
        wait_for(lambda: get("rolebinding", "run-trainer"), "the trainer's RoleBinding")
        admitted = wait_for(
            lambda: next(
                (c for c in ((get("trainingrun", "run") or {}).get("status") or {}).get("conditions") or []
                 if c["type"] == "Admitted"),
                None,
            ),
            "the run's Admitted condition",
        )  # fmt: skip
        if admitted["status"] == "True":
            selector = f"{labels.RUN_LABEL}=run"
            wait_for(lambda: (get("pods", "-l", selector) or {}).get("items"), "the run's pods")
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        )
        assert 'controller_runtime_reconcile_total{controller="trainingrun"' in metrics
    except AssertionError as failure:
        run_status = (get("trainingrun", "run") or {}).get("status")
        raise AssertionError(
            f"{failure}\nrun status: {run_status}\noperator log:\n{log_path.read_text()[-6000:]}"
        ) from failure
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # RBAC refusals read 'is forbidden: User "system:serviceaccount:..." cannot ...'. (A cluster-wide
    # operator may also meet other tests' namespaces being deleted: "forbidden: unable to create new
    # content in namespace ... because it is being terminated", which is no RBAC matter.)
    refused = [line for line in log_path.read_text().splitlines() if 'forbidden: User "system:' in line]
    assert not refused, "\n".join(refused[:20])
