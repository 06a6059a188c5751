"""How much the SandboxPool operator costs over a plain Deployment when 128 GPU pods come up.

Starts its own local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok with 16
nodes of 8 GPUs) and `cuda-agent operator`, then alternates three ways of going from 0 to 128 ready pods
of the same pod template (the one the operator builds for a pool):

  deployment   `kubectl scale deployment --replicas=128`, until its status shows 128 ready
  statefulset  the same with a plain StatefulSet (Parallel) behind a headless Service: what the pool
               creates, without the operator, to separate the cost of the objects from the operator's
  pool         `kubectl scale sandboxpool --replicas=128`, until the pool's own status shows 128 ready
               and its Ready condition is True (what a user or a TrainingRun waits for)

For each: wall time and API writes (apiserver_request_total of POST/PUT/PATCH/APPLY/DELETE from the
apiserver's /metrics; node and lease heartbeats excluded), medians over the rounds, the ratios
pool/deployment (target: time <= 1.2x), the operator's CPU seconds per scale-up and its resident memory.

    .venv/bin/python bench/operator_scale.py [--rounds 3] [--replicas 128]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.localcluster.cli import bring_up
from cuda_agent.localcluster.cluster import ClusterConfig, LocalCluster
from cuda_agent.operator.pool_children import PoolIdentity, statefulset

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "bench"
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE"}
QUIET_SECONDS = 3.0  # after a scale-down, let garbage collection and endpoint updates finish
HEARTBEATS = {"leases", "nodes"}  # node heartbeats run at a fixed rate whatever the workload does
_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>[0-9.e+]+)$")
POOL_SPEC = {
    "replicas": 0,
    "image": "registry.example/cuda-agent-sandbox:0.1.0",
    "gpu": {"resourceName": "nvidia.com/gpu", "count": 1, "product": "NVIDIA-H200"},
    "limits": {"memory": "8Gi", "workspaceSize": "2Gi"},
}


@dataclass
class Sample:
    seconds: float
    writes: int
    by_resource: dict[str, int]
    operator_cpu: float = 0.0


@dataclass
class Scenario:
    name: str
    target: str  # what `kubectl scale` is given
    ready: Callable[[], bool]
    samples: list[Sample] = field(default_factory=list)

    def median(self, attribute: str) -> float:
        return float(statistics.median(getattr(s, attribute) for s in self.samples))


def api_writes(cluster: LocalCluster) -> dict[str, int]:
    """Cumulative write requests per resource, from the apiserver's own metrics."""
    counts: dict[str, int] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        found = _SAMPLE.match(line)
        if not found:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group("labels")))
        if labels.get("verb") not in WRITE_VERBS or labels.get("resource") in HEARTBEATS:
            continue
        resource = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        counts[resource] = counts.get(resource, 0) + int(float(found.group("value")))
    return counts


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_until(check: Callable[[], bool], what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def get(cluster: LocalCluster, *args: str) -> dict[str, Any]:
    return cluster.get_json("-n", NAMESPACE, *args)


def baseline_manifests() -> list[dict[str, Any]]:
    """A plain Deployment, and a StatefulSet with its headless Service, of exactly the pod template the
    operator gives a pool."""
    pool = PoolIdentity("baseline", NAMESPACE, "none")
    template = statefulset(pool, SandboxPoolSpec.model_validate(POOL_SPEC), 0, [], "x")["spec"]["template"]
    template["spec"]["volumes"] = [v for v in template["spec"]["volumes"] if v["name"] != "judge"]
    container = template["spec"]["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "judge"]
    manifests = []
    for kind, extra in (
        ("Deployment", {}),
        ("StatefulSet", {"serviceName": "sts", "podManagementPolicy": "Parallel"}),
    ):
        labels = {"app": kind.lower()}
        pods = copy.deepcopy(template)
        pods["metadata"]["labels"] = labels
        spec = {"replicas": 0, "selector": {"matchLabels": labels}, "template": pods, **extra}
        metadata = {"name": kind.lower(), "namespace": NAMESPACE}
        manifests.append({"apiVersion": "apps/v1", "kind": kind, "metadata": metadata, "spec": spec})
    service = {"clusterIP": "None", "selector": {"app": "statefulset"}, "ports": [{"port": 8470}]}
    metadata = {"name": "sts", "namespace": NAMESPACE}
    return [*manifests, {"apiVersion": "v1", "kind": "Service", "metadata": metadata, "spec": service}]


class RssSampler:
    """Peak resident memory of a process, sampled every 100 ms from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.last, self._stop = pid, 0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except FileNotFoundError:
                return
            kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
            self.last, self.peak = kib * 1024, max(self.peak, kib * 1024)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def scenarios(cluster: LocalCluster, replicas: int) -> list[Scenario]:
    def workload_ready(kind: str) -> Callable[[], bool]:
        return lambda: (get(cluster, kind, kind).get("status") or {}).get("readyReplicas") == replicas

    def pool_ready() -> bool:
        status = get(cluster, "sandboxpool", "pool").get("status") or {}
        ready = [c for c in status.get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
        return status.get("readyReplicas") == replicas and bool(ready)

    return [
        Scenario("deployment", "deployment/deployment", workload_ready("deployment")),
        Scenario("statefulset", "statefulset/statefulset", workload_ready("statefulset")),
        Scenario("pool", "sandboxpool/pool", pool_ready),
    ]


def measure(cluster: LocalCluster, scenario: Scenario, replicas: int, operator_pid: int) -> Sample:
    before, cpu_before = api_writes(cluster), cpu_seconds(operator_pid)
    start = time.monotonic()
    cluster.kubectl("-n", NAMESPACE, "scale", scenario.target, f"--replicas={replicas}")
    wait_until(scenario.ready, f"{scenario.name} ready")
    seconds = time.monotonic() - start
    after, cpu_after = api_writes(cluster), cpu_seconds(operator_pid)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}
    return Sample(seconds, sum(delta.values()), delta, cpu_after - cpu_before)


def run(rounds: int, replicas: int, workdir: Path) -> int:
    cluster = LocalCluster(ClusterConfig(name="bench-operator-scale", workdir=workdir))
    print(f"starting the local control plane in {workdir} ...", flush=True)
    bring_up(cluster, REPO / "crds")
    operator = None
    log = (workdir / "operator.log").open("wb")  # closed in `finally`, after the operator has stopped
    try:
        cluster.kubectl("create", "namespace", NAMESPACE)
        command = [sys.executable, "-m", "cuda_agent.cli", "operator", "-n", NAMESPACE]
        command += ["--kubeconfig", str(cluster.kubeconfig_path()), "--probe-network", "127.0.0.0/8"]
        command += ["--drain-grace-period", "0"]
        operator = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        rss = RssSampler(operator.pid)
        pool = {"apiVersion": "cuda-agent.io/v1alpha1", "kind": "SandboxPool", "spec": POOL_SPEC}
        pool["metadata"] = {"name": "pool", "namespace": NAMESPACE}
        for manifest in [*baseline_manifests(), pool]:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        wait_until(
            lambda: (get(cluster, "sandboxpool", "pool").get("status") or {}).get("replicas") == 0,
            "the operator to take the pool",
        )
        idle_rss = rss.last
        runs = scenarios(cluster, replicas)
        for round_ in range(rounds):
            # Rotate the order, so no scenario always runs in the wake of the same other one.
            for scenario in runs[round_ % len(runs) :] + runs[: round_ % len(runs)]:
                sample = measure(cluster, scenario, replicas, operator.pid)
                scenario.samples.append(sample)
                line = f"round {round_ + 1} {scenario.name:<11} {sample.seconds:6.2f} s"
                print(f"{line} {sample.writes:5d} writes {sample.by_resource}", flush=True)
                cluster.kubectl("-n", NAMESPACE, "scale", scenario.target, "--replicas=0")
                wait_until(lambda: not get(cluster, "pods")["items"], "pods to go")
                time.sleep(QUIET_SECONDS)
        rss.stop()
        operator.terminate()
        operator.wait(timeout=30)
        log.flush()
        return report(runs, replicas, idle_rss, rss.peak, operator_writes(workdir / "operator.log"), rounds)
    finally:
        if operator is not None and operator.poll() is None:
            operator.kill()
        log.close()
        cluster.down()


def operator_writes(path: Path) -> dict[str, int]:
    """The writes the operator itself made over the whole run, as it logs them when it stops."""
    marker = "API writes by this operator: "
    lines = [line for line in path.read_text(errors="replace").splitlines() if marker in line]
    return dict(json.loads(lines[-1].split(marker, 1)[1])) if lines else {}


def report(
    runs: list[Scenario], replicas: int, idle_rss: int, peak_rss: int, own: dict[str, int], rounds: int
) -> int:
    by_name = {scenario.name: scenario for scenario in runs}
    base, pool = by_name["deployment"], by_name["pool"]
    time_ratio = pool.median("seconds") / base.median("seconds")
    rows = [("scenario", f"0 -> {replicas} ready, median s", "API writes, median", "time / deployment")]
    for scenario in runs:
        ratio = scenario.median("seconds") / base.median("seconds")
        rows.append(
            (
                scenario.name,
                f"{scenario.median('seconds'):.2f}",
                f"{scenario.median('writes'):.0f}",
                f"{ratio:.2f}x",
            )
        )
    rows.append(("pool / deployment writes", "", f"{pool.median('writes') / base.median('writes'):.2f}x", ""))
    print()
    print(f"operator writes over {rounds} rounds (pool creation, scale-ups and scale-downs): {own}")
    print(f"operator CPU per pool scale-up: {pool.median('operator_cpu'):.2f} s (median)")
    print(f"operator RSS: {idle_rss / 2**20:.0f} MiB idle with one pool, {peak_rss / 2**20:.0f} MiB peak")
    width = [max(len(row[i]) for row in rows) for i in range(4)]
    for index, row in enumerate(rows):
        print(" | ".join(cell.ljust(width[i]) for i, cell in enumerate(row)))
        if index == 0:
            print("-+-".join("-" * w for w in width))
    return 0 if time_ratio <= 1.2 else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as workdir:
        return run(args.rounds, args.replicas, Path(workdir))


if __name__ == "__main__":
    sys.exit(main())
