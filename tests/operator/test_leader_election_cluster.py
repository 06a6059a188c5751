"""Two operators with leader election against the real kube-apiserver: only the Lease holder reconciles,
the follower answers its liveness probe while it waits, and when the holder dies (SIGKILL, as a node
loss) the follower takes the Lease and reconciles from then on."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from operator_harness import Namespace, OperatorProcess, pool_manifest, wait_for

from cuda_agent.localhost import free_port

POOL = "pool"
# Short Lease timings keep the takeover within seconds (the elector needs whole seconds).
TIMINGS = ("--leader-elect-lease-duration", "4", "--leader-elect-renew-deadline", "3")


def _candidate(namespace: Namespace, workdir: Path, identity: str) -> tuple[OperatorProcess, str]:
    workdir.mkdir()
    liveness = f"http://127.0.0.1:{free_port()}/healthz"
    args = [
        "--leader-elect", "--leader-elect-resource-namespace", namespace.name,
        "--leader-elect-identity", identity, "--leader-elect-retry-period", "1", *TIMINGS,
        "--liveness-endpoint", liveness,
    ]  # fmt: skip
    operator = OperatorProcess(namespace.cluster.kubeconfig, namespace.name, workdir, args)
    operator.start()
    return operator, liveness


def _holder(namespace: Namespace) -> str | None:
    lease = namespace.get_or_none("lease", "cuda-agent-operator")
    return None if lease is None else lease["spec"].get("holderIdentity")


def _answers(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body = response.read()
            return json.loads(body) if body.strip().startswith(b"{") else {"status": response.status}
    except OSError:
        return None


def _replicas(namespace: Namespace) -> int | None:
    statefulset = namespace.get_or_none("statefulset", POOL)
    return None if statefulset is None else int(statefulset["spec"]["replicas"])


def test_only_the_lease_holder_reconciles_and_the_follower_takes_over(
    namespace: Namespace, tmp_path: Path
) -> None:
    leader, _ = _candidate(namespace, tmp_path / "a", "operator-a")
    follower = None
    try:
        wait_for(lambda: _holder(namespace) == "operator-a", "operator-a to hold the Lease", timeout=60)
        follower, follower_liveness = _candidate(namespace, tmp_path / "b", "operator-b")
        namespace.apply(pool_manifest(POOL, 1))
        wait_for(lambda: _replicas(namespace) == 1, "the leader to create the pool's StatefulSet")
        # The follower waits, alive to its probe, without starting Kopf.
        assert wait_for(lambda: _answers(follower_liveness), "the follower's liveness answer") == {
            "leader": False
        }
        assert _holder(namespace) == "operator-a" and follower.alive()
        assert "waits for the Lease" in follower.log_text()
        assert "holds the Lease" not in follower.log_text()

        leader.kill()
        wait_for(lambda: _holder(namespace) == "operator-b", "operator-b to take the Lease", timeout=60)
        wait_for(lambda: "holds the Lease" in follower.log_text(), "operator-b to start Kopf")
        namespace.kubectl("scale", f"sandboxpool/{POOL}", "--replicas=2")
        wait_for(lambda: _replicas(namespace) == 2, "the new leader to scale the pool")
    finally:
        for operator in (leader, follower):
            if operator is not None:
                operator.stop()
                print(f"--- {operator.workdir.name} ---\n{operator.log_text()[-3000:]}")
