"""A real Kubernetes control plane on 127.0.0.1, driven by kwokctl's binary runtime.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the kwok controller run as local
processes built from pinned Go modules (see `binaries`). kwokctl owns their flags, certificates, ports and
process lifecycle; this module gives it our binaries (so it never downloads anything), then adds what the
platform needs on top: fake GPU nodes that kwok keeps Ready and our CRDs.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.localcluster import binaries

PORT_OPTIONS = (
    "etcdPort",
    "etcdPeerPort",
    "kubeApiserverPort",
    "kubeControllerManagerPort",
    "kubeSchedulerPort",
    "kwokControllerPort",
)
# kwokctl picks free ports counting down from 32767 in every process, so two clusters created at the same
# moment (parallel test sessions) pick the same ones; random ports from a range below that seldom collide.
PORT_RANGE = range(20000, 30000)


def _unused_loopback_ports(count: int) -> list[int]:
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.choice(PORT_RANGE)
        if port not in chosen and _bindable(port):
            chosen.append(port)
    return chosen


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def default_workdir() -> Path:
    return Path.home() / ".cache" / "cuda-agent" / "kwok"


class ClusterConfig(BaseModel):
    """What local cluster to run: its name, where kwokctl keeps its state, and its fake GPU fleet."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(default="cuda-agent", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    workdir: Path = Field(
        default_factory=default_workdir, description="KWOK_WORKDIR: clusters/<name>/ lives here"
    )
    nodes: int = Field(default=16, ge=0, le=1000)
    gpus_per_node: int = Field(default=8, ge=0)
    gpu_product: str = "NVIDIA-H200"
    gpu_resource: str = "nvidia.com/gpu"
    node_cpu: str = "192"
    node_memory: str = "2Ti"
    # kwok's docs taint fake nodes so real workloads stay off them; in a cluster made only of fake nodes
    # the taint would just keep every pod Pending, so it is opt-in.
    taint_fake_nodes: bool = False
    start_timeout_s: float = Field(default=180.0, gt=0)


class ComponentState(BaseModel):
    name: str
    state: str


class ClusterStatus(BaseModel):
    """What `cuda-agent cluster status` reports, read from kwokctl and the apiserver itself."""

    name: str
    exists: bool
    apiserver_ready: bool
    server: str | None = None
    kubeconfig: Path | None = None
    components: list[ComponentState] = []
    nodes: int = 0
    ready_nodes: int = 0


class ClusterError(RuntimeError):
    """A kwokctl or cluster operation failed; the message carries the tool's own output."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero; unlike CalledProcessError its message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{(self.stderr or '').strip()}"


class LocalCluster:
    """One kwokctl-managed cluster. `up()` is idempotent; `down()` removes processes and state."""

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config or ClusterConfig()

    @property
    def cluster_dir(self) -> Path:
        return self.config.workdir / "clusters" / self.config.name

    def kubeconfig_path(self) -> Path:
        return self.cluster_dir / "kubeconfig.yaml"

    def exists(self) -> bool:
        return (self.cluster_dir / "kwok.yaml").is_file()

    # -- lifecycle ---------------------------------------------------------------------------------------

    def up(self) -> None:
        """Starts the control plane (building binaries first if needed) and waits for the apiserver."""
        paths = {name: binaries.ensure(name) for name in binaries.CONTROL_PLANE_BINARIES}
        self.config.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self._kwokctl_config_file()
        config_file.write_text(yaml.safe_dump(self._kwokctl_configuration(paths), sort_keys=False))
        timeout = f"{int(self.config.start_timeout_s)}s"
        self._kwokctl(
            "--config", str(config_file), "create", "cluster", "--runtime", "binary",
            "--kubeconfig=", "--wait", timeout, "--timeout", timeout,
        )  # fmt: skip
        self.wait_apiserver_ready()

    def down(self) -> None:
        """Stops every component and deletes the cluster's state; a no-op when it does not exist."""
        if not self.exists():
            return
        # kwokctl removes the cluster's context from the kubeconfig it is given (default ~/.kube/config,
        # and it refuses an empty path): point it at the cluster's own file, which goes away with it.
        self._kwokctl("delete", "cluster", "--kubeconfig", str(self.kubeconfig_path()))
        self._kwokctl_config_file().unlink(missing_ok=True)

    def _kwokctl_config_file(self) -> Path:
        return self.config.workdir / f"{self.config.name}.kwokctl.yaml"

    def _kwokctl_configuration(self, paths: dict[str, Path]) -> dict[str, Any]:
        return {
            "kind": "KwokctlConfiguration",
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "options": {
                "runtime": "binary",
                "kubeVersion": binaries.KUBERNETES_VERSION,
                "bindAddress": "127.0.0.1",
                "securePort": True,
                "quietPull": True,
                "cacheDir": str(self.config.workdir / "cache"),
                "etcdBinary": str(paths["etcd"]),
                "kubeApiserverBinary": str(paths["kube-apiserver"]),
                "kubeControllerManagerBinary": str(paths["kube-controller-manager"]),
                "kubeSchedulerBinary": str(paths["kube-scheduler"]),
                "kubectlBinary": str(paths["kubectl"]),
                "kwokControllerBinary": str(paths["kwok"]),
                **dict(zip(PORT_OPTIONS, _unused_loopback_ports(len(PORT_OPTIONS)), strict=True)),
            },
        }

    def _kwokctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # Only KWOK_WORKDIR reaches kwokctl: a stray KWOK_* variable in the caller's shell would override
        # the binaries or ports given in the configuration file.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KWOK_")}
        env["KWOK_WORKDIR"] = str(self.config.workdir)
        command = [str(binaries.ensure("kwokctl")), "--name", self.config.name, *args]
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise ClusterError(
                f"kwokctl {' '.join(args)} failed (exit {proc.returncode}), cluster {self.config.name!r}:\n"
                f"{proc.stderr.strip()}\n(component logs: {self.cluster_dir / 'logs'})"
            )
        return proc

    # -- talking to the apiserver --------------------------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Runs our kubectl against this cluster; with `check`, a failure raises KubectlError."""
        command = [str(binaries.ensure("kubectl")), "--kubeconfig", str(self.kubeconfig_path()), *args]
        proc = subprocess.run(command, input=input, capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise KubectlError(proc.returncode, command, proc.stdout, proc.stderr)
        return proc

    def wait_apiserver_ready(self, timeout_s: float | None = None) -> None:
        deadline = time.monotonic() + (timeout_s or self.config.start_timeout_s)
        while True:
            proc = self.kubectl("get", "--raw", "/readyz", check=False)
            if proc.returncode == 0 and proc.stdout.strip() == "ok":
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"kube-apiserver of {self.config.name!r} not ready: {proc.stderr.strip()}")
            time.sleep(0.5)

    def server(self) -> str | None:
        if not self.kubeconfig_path().is_file():
            return None
        kubeconfig = yaml.safe_load(self.kubeconfig_path().read_text())
        clusters = kubeconfig.get("clusters") or []
        return str(clusters[0]["cluster"]["server"]) if clusters else None

    def status(self) -> ClusterStatus:
        if not self.exists():
            return ClusterStatus(name=self.config.name, exists=False, apiserver_ready=False)
        listing = self._kwokctl("get", "components", "-o", "wide", check=False)
        components = [
            ComponentState(name=fields[0], state=fields[1])
            for fields in (line.split() for line in listing.stdout.splitlines()[1:])
            if len(fields) >= 2
        ]
        ready = self.kubectl("get", "--raw", "/readyz", check=False)
        status = ClusterStatus(
            name=self.config.name,
            exists=True,
            apiserver_ready=ready.returncode == 0 and ready.stdout.strip() == "ok",
            server=self.server(),
            kubeconfig=self.kubeconfig_path(),
            components=components,
        )
        if status.apiserver_ready:
            nodes = self.get_json("nodes")["items"]
            status.nodes = len(nodes)
            status.ready_nodes = sum(1 for node in nodes if _is_ready(node))
        return status

    def get_json(self, *args: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json").stdout)
        return result

    # -- what the platform adds ------------------------------------------------------------------------------

    def install_crds(self, directory: Path, timeout_s: float = 60.0) -> list[str]:
        """Applies every CRD in `directory`/*.yaml, waits until each is Established, returns their names."""
        files = sorted(directory.glob("*.yaml"))
        names = [name for path in files for name in _crd_names(path)]
        if not names:
            return []
        # Server-side apply: a generated CRD with full OpenAPI schemas can exceed the 256 KiB annotation
        # that client-side apply would store.
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", *(arg for f in files for arg in ("-f", str(f)))
        )
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout_s)}s",
            *(f"crd/{n}" for n in names),
        )
        return names

    def create_gpu_nodes(
        self,
        count: int | None = None,
        gpus: int | None = None,
        product: str | None = None,
        timeout_s: float = 60.0,
    ) -> list[str]:
        """Creates kwok-managed nodes with GPU capacity and waits until kwok reports them Ready."""
        nodes = [
            gpu_node_manifest(
                f"kwok-gpu-{index:03d}",
                self.config,
                gpus=self.config.gpus_per_node if gpus is None else gpus,
                product=product or self.config.gpu_product,
            )
            for index in range(self.config.nodes if count is None else count)
        ]
        if not nodes:
            return []
        self.kubectl(
            "apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes})
        )
        names = [str(node["metadata"]["name"]) for node in nodes]
        self.kubectl(
            "wait", "--for=condition=Ready", f"--timeout={int(timeout_s)}s", *(f"node/{n}" for n in names)
        )
        return names


def gpu_node_manifest(name: str, config: ClusterConfig, gpus: int, product: str) -> dict[str, Any]:
    """A Node the way kwok's docs describe a fake node, plus the labels and capacity of a GPU node."""
    resources = {
        "cpu": config.node_cpu,
        "memory": config.node_memory,
        "pods": "110",
        "ephemeral-storage": "1Ti",
        config.gpu_resource: str(gpus),
    }
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                # The labels NVIDIA's GPU feature discovery puts on real nodes; SandboxPool selects on them.
                f"{config.gpu_resource}.product": product,
                f"{config.gpu_resource}.count": str(gpus),
            },
        },
        "spec": {},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            # Every field the API marks required; kwok plays the kubelet, so the versions say so.
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "osImage": "kwok",
                "kernelVersion": "kwok",
                "containerRuntimeVersion": "kwok",
                "kubeletVersion": "kwok",
                "kubeProxyVersion": "kwok",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
            },
        },
    }
    if config.taint_fake_nodes:
        node["spec"]["taints"] = [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]
    return node


def _crd_names(path: Path) -> list[str]:
    try:
        documents = list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as err:
        raise ClusterError(f"{path}: not valid YAML: {err}") from err
    names = []
    for index, doc in enumerate(documents):
        if not doc:
            continue
        if doc.get("kind") != "CustomResourceDefinition" or not doc.get("metadata", {}).get("name"):
            raise ClusterError(
                f"{path}: document {index} is not a CustomResourceDefinition with metadata.name"
            )
        names.append(str(doc["metadata"]["name"]))
    return names


def _is_ready(node: dict[str, Any]) -> bool:
    conditions: Sequence[dict[str, Any]] = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
