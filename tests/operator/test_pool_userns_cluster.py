"""A SandboxPool with spec.security.userNamespaces: Required against the real apiserver's PodSecurity
admission and the operator as a subprocess.

Found here (Kubernetes 1.36): Pod Security "restricted" refuses `procMount: Unmasked` even with
`hostUsers: false`; "baseline" allows it for user-namespaced pods since 1.35 (pod-security-admission's
check_procMount_baseline.go and check_procMount_restricted.go). Such a pool therefore runs in a namespace
that enforces baseline; the operator still renders every other restricted requirement, and the
namespace's `warn: restricted` names the one exception.

kwok runs no containers, so whether a node's runtime builds the namespaces is tested elsewhere (the profile
variant under libseccomp in tests/sandbox/test_seccomp.py; the server's namespaces in
tests/sandbox/test_sandbox_isolation.py).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from operator_harness import Namespace, OperatorProcess, pool_manifest, wait_for
from pydantic import ValidationError

from cuda_agent.api.pool_server import server_config
from cuda_agent.api.sandboxpool import USERNS_PROFILE_NAME, SandboxPoolSpec
from cuda_agent.operator.pool_children import PoolIdentity, statefulset
from cuda_agent.sandbox.server.config import SandboxServerConfig

POOL = "userns"
USERNS_SECURITY = {
    "seccompProfile": {"type": "Localhost", "localhostProfile": f"cuda-agent/{USERNS_PROFILE_NAME}"},
    "userNamespaces": "Required",
}


def _pods(ns: Namespace) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = ns.items("pods", "-l", f"cuda-agent.io/sandbox-pool={POOL}")
    return pods


def _rendered_pod(namespace: str, security: dict[str, Any]) -> dict[str, Any]:
    """The pod the pool's StatefulSet would create, rendered by the operator's own code."""
    spec = SandboxPoolSpec.model_validate(pool_manifest(POOL, 1, security=security)["spec"])
    template = statefulset(PoolIdentity(POOL, namespace, "0"), spec, 1, [], "hash")["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POOL, **template["metadata"]},
        "spec": template["spec"],
    }


def test_user_namespaced_pool_admission_and_its_pods(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess]
) -> None:
    """One namespace (each costs ~5 s to delete): first enforcing restricted, then baseline.

    CEL refuses the field without a Localhost profile; restricted refuses the pods' unmasked /proc (if
    Kubernetes relaxes restricted as it did baseline, this fails and docs/sandbox.md, "User-namespaced
    pools", should drop the exception); under baseline with warn=restricted the operator's pods are
    admitted with a warning and keep every field."""

    def dry_run(verb: str, manifest: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        result: subprocess.CompletedProcess[str] = namespace.kubectl(
            verb, "--dry-run=server", "-f", "-", input=json.dumps(manifest), check=False
        )
        return result

    runtime_default = {"seccompProfile": {"type": "RuntimeDefault"}, "userNamespaces": "Required"}
    refused = dry_run("apply", pool_manifest(POOL, 1, security=runtime_default))
    assert refused.returncode != 0
    assert "spec.security.seccompProfile.type" in refused.stderr
    assert "userNamespaces Required needs spec.security.seccompProfile type Localhost" in refused.stderr

    refused = dry_run("create", _rendered_pod(namespace.name, USERNS_SECURITY))
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest": procMount' in refused.stderr
    assert "hostUsers" not in refused.stderr  # hostUsers false itself is fine under restricted
    masked = _rendered_pod(namespace.name, USERNS_SECURITY)
    del masked["spec"]["containers"][0]["securityContext"]["procMount"]
    admitted = dry_run("create", masked)
    assert admitted.returncode == 0, admitted.stderr

    # The pool in the restricted namespace: its pods are refused, and the pool says why.
    operator = operator_factory()
    namespace.apply(pool_manifest(POOL, 1, security=USERNS_SECURITY))

    def refused_condition() -> dict[str, Any] | None:
        pool = namespace.get("sandboxpool", POOL)
        conditions = (pool.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("reason") == "PodsRefused"), None)

    degraded = wait_for(refused_condition, "the pool's Degraded/PodsRefused condition")
    assert degraded["type"] == "Degraded" and degraded["status"] == "True"
    assert 'violates PodSecurity "restricted:latest": procMount' in degraded["message"]

    namespace.cluster.kubectl(
        "label", "namespace", namespace.name, "--overwrite",
        "pod-security.kubernetes.io/enforce=baseline", "pod-security.kubernetes.io/warn=restricted",
    )  # fmt: skip
    warned = dry_run("create", _rendered_pod(namespace.name, USERNS_SECURITY))
    assert warned.returncode == 0, warned.stderr
    assert 'would violate PodSecurity "restricted:latest": procMount' in warned.stderr
    # The StatefulSet controller retries with a growing backoff; a change to the object syncs it now.
    namespace.kubectl("annotate", "statefulset", POOL, "test/retry=1")

    def pod() -> dict[str, Any] | None:
        pods = _pods(namespace)
        return pods[0] if pods else None

    found = wait_for(pod, "a sandbox pod once the namespace enforces baseline")
    # Read back from the apiserver: a field whose feature gate is off would have been dropped silently.
    spec = found["spec"]
    (container,) = spec["containers"]
    assert spec["hostUsers"] is False
    assert container["securityContext"]["procMount"] == "Unmasked"
    profile = {"type": "Localhost", "localhostProfile": f"cuda-agent/{USERNS_PROFILE_NAME}"}
    assert spec["securityContext"]["seccompProfile"] == profile
    assert container["securityContext"]["seccompProfile"] == profile
    # Everything else stays restricted.
    assert container["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["runAsUser"] == 65532
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # The server refuses to start without the namespaces instead of falling back to shared /proc.
    configmap = namespace.get("configmap", f"{POOL}-judge")
    config = SandboxServerConfig.model_validate(yaml.safe_load(configmap["data"]["sandbox.yaml"]))
    assert (config.isolation, config.user_namespaces) == ("auto", "on")  # uid 65532: restricted

    # The pod goes at once (the namespace's deletion would otherwise wait ~6 s more for it).
    operator.stop()
    namespace.kubectl("delete", "statefulset", POOL, "--cascade=orphan")
    namespace.kubectl("delete", "pods", "--all", "--force", "--grace-period=0", "--wait=false")


def test_only_a_pool_requiring_user_namespaces_changes_its_pods() -> None:
    """Without the field the pods and the server config are what they were before it existed."""
    plain = _rendered_pod("ns", {})["spec"]
    assert "hostUsers" not in plain and "procMount" not in plain["containers"][0]["securityContext"]
    plain_config = server_config(SandboxPoolSpec.model_validate(pool_manifest(POOL, 1)["spec"]))
    assert "user_namespaces" not in plain_config
    with pytest.raises(ValidationError, match="userNamespaces Required needs"):
        SandboxPoolSpec.model_validate(
            pool_manifest(POOL, 1, security={"userNamespaces": "Required"})["spec"]
        )
