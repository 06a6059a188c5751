"""Settings of one operator process (from the command line), as a validated model."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cuda_agent.operator.tenancy import valid_image

Seconds = Annotated[float, Field(ge=0)]
DEFAULT_TRAINER_COMMAND = (sys.executable, "-m", "cuda_agent.cli", "train", "-f", "{run_yaml}")
DEFAULT_SANDBOX_COMMAND = (sys.executable, "-m", "cuda_agent.cli", "sandbox", "serve", "--config", "{config}")


class LeaderElectionConfig(BaseModel):
    """Leader election through a coordination.k8s.io/v1 Lease (operator/leader.py). Whole seconds: the
    Kubernetes client's elector requires them, and lease > renew deadline > 1.2 x retry period."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(min_length=1, description="Namespace of the Lease (the operator's own).")
    lease_name: str = Field(default="cuda-agent-operator", min_length=1, description="Name of the Lease.")
    identity: str = Field(min_length=1, description="This candidate's holder identity (pod name + suffix).")
    lease_duration: int = Field(
        default=15, ge=2, description="Seconds a follower waits on an unrenewed Lease."
    )
    renew_deadline: int = Field(default=10, ge=2, description="Seconds the leader may fail to renew.")
    retry_period: int = Field(default=2, ge=1, description="Seconds between tries to acquire or renew.")

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionConfig:
        if not self.lease_duration > self.renew_deadline > 1.2 * self.retry_period:
            raise ValueError(
                f"leader election: need lease duration ({self.lease_duration}) > renew deadline "
                f"({self.renew_deadline}) > 1.2 x retry period ({self.retry_period})"
            )
        return self


class OperatorConfig(BaseModel):
    """Everything an operator process needs besides the objects it watches."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: tuple[str, ...] = Field(
        default=(), description="Namespaces to serve; empty means every namespace (cluster-wide)."
    )
    kubeconfig: Path | None = Field(
        default=None, description="Kubeconfig file; default $KUBECONFIG, ~/.kube/config or in-cluster."
    )
    workers: int = Field(default=4, ge=1, le=64, description="Objects reconciled concurrently.")
    verbose: bool = Field(default=False, description="DEBUG logs, Kopf's per-handler lines included.")
    settle_seconds: Seconds = Field(
        default=0.05, description="Wait after the first change before a pass, so event bursts coalesce."
    )
    sync_period: Seconds = Field(
        default=15.0, description="How often autoscaled pools re-read demand and runs re-check progress."
    )
    drain_grace_period: Seconds = Field(
        default=600.0,
        description="Longest wait for a sandbox pod chosen for removal to finish its sessions.",
    )
    suspend_checkpoint_timeout: Seconds = Field(
        default=600.0,
        description="Longest wait for the trainer's checkpoint after spec.suspend before scaling to zero.",
    )
    probe_networks: tuple[str, ...] = Field(
        default=("0.0.0.0/0", "::/0"),
        description="Pod IP ranges whose /v1/status the operator may contact.",
    )
    status_endpoint_map: Path | None = Field(
        default=None,
        description='JSON file {"namespace/pod": "http://host:port"} overriding where a pod is asked.',
    )
    trainer_image: str = Field(
        default="ghcr.io/cuda-agent/trainer:0.1.0",
        description="Image of the Ray head, workers and trainer driver: the cluster admin's choice.",
    )
    allowed_trainer_images: tuple[str, ...] = Field(
        default=(),
        description="Other images a TrainingRun may pick with its cuda-agent.io/trainer-image annotation "
        "(exact references); empty: none, every run gets trainer_image.",
    )
    artifacts_secret: str = Field(
        default="cuda-agent-artifacts",
        description="Secret (in each run's namespace) with the S3/MinIO endpoint and credentials.",
    )
    artifacts_bucket: str = Field(
        default="cuda-agent", description="Bucket of checkpoints for runs whose spec names no prefix."
    )
    trainer_pod_annotations: tuple[tuple[str, str], ...] = Field(
        default=(), description="Annotations put on every Ray and driver pod (service mesh, cost tags, ...)."
    )
    otel_endpoint: str | None = Field(
        default=None,
        description="OTLP endpoint passed to trainer pods (OTEL_EXPORTER_OTLP_ENDPOINT), and to sandbox "
        "pods of pools with spec.telemetry.exportTraces.",
    )
    otel_collector_labels: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="Pod labels of the OTLP collector: a pool exporting traces may reach those pods (on "
        "the endpoint's port, any namespace) and cluster DNS, nothing else.",
    )
    metrics_scraper_labels: tuple[tuple[str, str], ...] = Field(
        default=(),
        description="Pod labels of the Prometheus that scrapes sandbox pods: those pods (any namespace) "
        "may reach every pool's metrics-only port, nothing else of the pods.",
    )
    executor: Literal["cluster", "local"] = Field(
        default="cluster",
        description="Where a TrainingRun's trainer runs: pods on a Ray cluster, or processes on this "
        "machine (the embedded default, whose kwok nodes cannot run pods).",
    )
    run_dir: Path = Field(
        default=Path.home() / ".cache" / "cuda-agent" / "runs",
        description="Local executor: run.yaml, logs and sandbox state under <run_dir>/<namespace>/<run>/.",
    )
    trainer_command: tuple[str, ...] = Field(
        default=DEFAULT_TRAINER_COMMAND,
        min_length=1,
        description="Local executor: the trainer's argv; {run_yaml} is replaced by the run file's path.",
    )
    sandbox_command: tuple[str, ...] = Field(
        default=DEFAULT_SANDBOX_COMMAND,
        min_length=1,
        description="Local executor: the sandbox server's argv; {config} is replaced by its config file.",
    )
    pvc_root: Path | None = Field(
        default=None,
        description="Local executor: where pvc://CLAIM/path lives on this machine (DIR/CLAIM/path), as a "
        "pod would mount the claim; passed to the trainer as CUDA_AGENT_PVC_ROOT.",
    )
    restart_backoff: Seconds = Field(
        default=2.0, description="Local executor: first wait before restarting a crashed process (doubles)."
    )
    liveness_endpoint: str | None = Field(
        default=None, description="Kopf's liveness endpoint, e.g. http://0.0.0.0:8080/healthz."
    )
    gang_scheduler_name: str = Field(
        default="scheduler-plugins-scheduler",
        description="schedulerName of Ray pods when scheduler-plugins' coscheduling serves PodGroups "
        "(it runs as a second scheduler; this is its Helm chart's default name).",
    )
    metrics_port: int = Field(
        default=0, ge=0, le=65_535, description="Port of the operator's Prometheus /metrics; 0 turns it off."
    )
    leader_election: LeaderElectionConfig | None = Field(
        default=None,
        description="Run Kopf only while holding the Lease (replicas > 1, rolling updates); None: "
        "standalone.",
    )

    @field_validator("trainer_image")
    @classmethod
    def _image_parses(cls, value: str) -> str:
        if not valid_image(value):
            raise ValueError(f"--trainer-image {value!r}: not an image reference (registry/path:tag)")
        return value

    @field_validator("allowed_trainer_images")
    @classmethod
    def _images_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for image in value:
            if not valid_image(image):
                raise ValueError(f"--allowed-trainer-image {image!r}: not an image reference")
        return value

    @field_validator("probe_networks")
    @classmethod
    def _networks_parse(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            try:
                ipaddress.ip_network(network)
            except ValueError as error:
                raise ValueError(f"--probe-network {network!r}: {error}") from error
        return value

    def probe_network_objects(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(network) for network in self.probe_networks)
