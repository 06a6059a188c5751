"""Helpers of the operator's cluster tests: a namespace view, the operator as a real subprocess, polling.

The operator runs as `python -m cuda_agent.cli operator ...` (the `cuda-agent operator` entry point), so a
test can SIGKILL and restart it for real. It may contact only loopback addresses: kwok gives pods IPs in
10.0.0.0/8 that nothing listens on, so the autoscaler tests name each pod's status server through the
operator's endpoint map instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fixtures.cluster import KubeCluster

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 180.0, interval: float = 0.5) -> T:
    """Poll until `probe` returns something truthy; the timeout is a failure bound, not a measurement."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


@dataclass
class Namespace:
    """A namespace of one test, with helpers that read it through kubectl."""

    cluster: KubeCluster
    name: str

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result: subprocess.CompletedProcess[str] = self.cluster.kubectl(
            "-n", self.name, *args, input=input, check=check
        )
        return result

    def get(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return result

    def get_or_none(self, *args: str) -> dict[str, Any] | None:
        proc = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def items(self, *args: str) -> list[dict[str, Any]]:
        return list(self.get(*args)["items"])

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def condition(self, resource: str, kind: str) -> dict[str, Any] | None:
        found = self.get_or_none(resource)
        conditions = ((found or {}).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("type") == kind), None)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.items("events") if e.get("reason") == reason]


@dataclass
class OperatorProcess:
    """`cuda-agent operator` for one namespace, as a subprocess that can be killed and restarted."""

    kubeconfig: Path
    namespace: str
    workdir: Path
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def endpoint_map(self) -> Path:
        return self.workdir / "endpoints.json"

    @property
    def log(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        command = [
            sys.executable, "-m", "cuda_agent.cli", "operator",
            "--namespace", self.namespace, "--kubeconfig", str(self.kubeconfig),
            "--probe-network", "127.0.0.0/8", "--status-endpoint-map", str(self.endpoint_map),
            "--sync-period", "1", *self.extra_args,
        ]  # fmt: skip
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def kill(self) -> None:
        """SIGKILL: no cleanup handlers run, as when a node dies under the operator."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_bytes(self) -> int:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def set_endpoints(self, endpoints: dict[str, str]) -> None:
        """Where the operator asks each pod for its load: {"pod-name": "http://127.0.0.1:port"}."""
        mapping = {f"{self.namespace}/{pod}": url for pod, url in endpoints.items()}
        tmp = self.endpoint_map.with_suffix(".tmp")
        tmp.write_text(json.dumps(mapping))
        tmp.replace(self.endpoint_map)

    def log_text(self) -> str:
        return "\n".join(
            (self.workdir / f"operator-{i}.log").read_text(errors="replace")
            for i in range(1, self.starts + 1)
        )


def pool_manifest(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "image": "registry.example/cuda-agent-sandbox:0.1.0",
            "gpu": {"resourceName": "nvidia.com/gpu", "count": 1, "product": "NVIDIA-H200"},
            "limits": {"memory": "8Gi", "workspaceSize": "2Gi"},
            **spec,
        },
    }


def metric(text: str, name: str, /, **labels: str) -> float | None:
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
    line = next((line for line in text.splitlines() if line.startswith(prefix)), None)
    return float(line.split()[-1]) if line else None


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def metric_value(port: int, kind: str) -> float:
    """Successful passes over `kind` so far; 0 while the operator does not serve /metrics yet."""
    try:
        text = scrape(port)
    except OSError:
        return 0.0
    # controller-runtime's names: the controller is the lowercase kind; a pass that returned is a
    # `success`, or a `requeue_after` when it asked to be run again later.
    controller = kind.lower()
    return sum(
        metric(text, "controller_runtime_reconcile_total", controller=controller, result=result) or 0.0
        for result in ("success", "requeue_after")
    )
