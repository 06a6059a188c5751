"""The operator <-> trainer contract: what a trainer process is given, and what it reports back.

The operator (a driver pod on a cluster, a local process under `cuda-agent demo`) starts
`cuda-agent train -f run.yaml` with these environment variables; the trainer reads them through
`TrainerEnv.from_environ` and never spells a name itself. Progress goes back as a `TrainerProgress`,
which the trainer's status writer turns into the TrainingRun's status through the API models.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.api.episode import EpisodeSettings
from cuda_agent.api.trainingrun import TrainingMetrics, TrainingRunPhase

ENV_RUN_NAME = "CUDA_AGENT_RUN_NAME"
ENV_RUN_NAMESPACE = "CUDA_AGENT_RUN_NAMESPACE"
ENV_SANDBOX_URL = "CUDA_AGENT_SANDBOX_URL"
ENV_CHECKPOINT_PREFIX = "CUDA_AGENT_CHECKPOINT_PREFIX"
ENV_RESUME_FROM = "CUDA_AGENT_RESUME_FROM"
# What every episode's session gets (cuda_agent.api.episode.EpisodeSettings as JSON): the operator computes it
# from the run's spec and the SandboxPool it observed, so the device is what the pool's servers judge on.
ENV_EPISODE = "CUDA_AGENT_EPISODE"
# How progress is reported: "kubernetes" patches the TrainingRun's status subresource (in-cluster service
# account or the kubeconfig named by KUBECONFIG); "file" writes JSON lines to ENV_STATUS_FILE; "none" logs.
ENV_STATUS_MODE = "CUDA_AGENT_STATUS_MODE"
ENV_STATUS_FILE = "CUDA_AGENT_STATUS_FILE"
ENV_RAY_ADDRESS = "RAY_ADDRESS"
# Where the trainer serves its Prometheus /metrics (cuda_agent.telemetry reads it, as TelemetryConfig's
# metrics_port): the driver pod's port `metrics`, a free loopback port under the local executor.
ENV_METRICS_PORT = "CUDA_AGENT_METRICS_PORT"
TRAINER_METRICS_PORT = 9471
ENV_OTEL_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"

StatusMode = Literal["kubernetes", "file", "none"]


class TrainerEnv(BaseModel):
    """The environment a trainer process is started with (one field per variable above)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_name: str = Field(min_length=1)
    run_namespace: str = "default"
    sandbox_url: str | None = None
    checkpoint_prefix: str | None = None
    resume_from: str | None = None
    episode: EpisodeSettings | None = None
    status_mode: StatusMode = "none"
    status_file: str | None = None
    ray_address: str | None = None
    otel_endpoint: str | None = None
    metrics_port: int | None = Field(default=None, ge=1, le=65535)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], default_run_name: str = "local") -> TrainerEnv:
        def get(name: str) -> str | None:
            return environ.get(name) or None

        return cls(
            run_name=get(ENV_RUN_NAME) or default_run_name,
            run_namespace=get(ENV_RUN_NAMESPACE) or "default",
            sandbox_url=get(ENV_SANDBOX_URL),
            checkpoint_prefix=get(ENV_CHECKPOINT_PREFIX),
            resume_from=get(ENV_RESUME_FROM),
            episode=_episode(get(ENV_EPISODE)),
            status_mode=_status_mode(get(ENV_STATUS_MODE)),
            status_file=get(ENV_STATUS_FILE),
            ray_address=get(ENV_RAY_ADDRESS),
            otel_endpoint=get(ENV_OTEL_ENDPOINT),
            metrics_port=_port(get(ENV_METRICS_PORT)),
        )

    def to_environ(self) -> dict[str, str]:
        """The variables that reproduce this object (unset fields are left out)."""
        values = {
            ENV_RUN_NAME: self.run_name,
            ENV_RUN_NAMESPACE: self.run_namespace,
            ENV_SANDBOX_URL: self.sandbox_url,
            ENV_CHECKPOINT_PREFIX: self.checkpoint_prefix,
            ENV_RESUME_FROM: self.resume_from,
            ENV_EPISODE: self.episode.model_dump_json() if self.episode is not None else None,
            ENV_STATUS_MODE: self.status_mode,
            ENV_STATUS_FILE: self.status_file,
            ENV_RAY_ADDRESS: self.ray_address,
            ENV_OTEL_ENDPOINT: self.otel_endpoint,
            ENV_METRICS_PORT: str(self.metrics_port) if self.metrics_port else None,
        }
        if self.otel_endpoint:
            values[ENV_OTEL_SERVICE_NAME] = f"cuda-agent-trainer.{self.run_name}"
        return {name: value for name, value in values.items() if value}


def _episode(value: str | None) -> EpisodeSettings | None:
    if value is None:
        return None
    try:
        return EpisodeSettings.model_validate_json(value)
    except ValueError as exc:
        raise ValueError(f"{ENV_EPISODE}: {exc}") from None


def _port(value: str | None) -> int | None:
    if value is None or value == "0":  # 0: not served, as cuda_agent.telemetry reads it
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{ENV_METRICS_PORT}={value!r}: expected a port number") from None


def _status_mode(value: str | None) -> StatusMode:
    if value in (None, "none"):
        return "none"
    if value in ("kubernetes", "file"):
        return value  # type: ignore[return-value]
    raise ValueError(f"{ENV_STATUS_MODE}={value!r}: expected kubernetes, file or none")


class TrainerProgress(BaseModel):
    """One progress report of a trainer: what the status writer mirrors into TrainingRun.status."""

    model_config = ConfigDict(extra="forbid")

    phase: TrainingRunPhase
    step: int = Field(ge=0)
    stage: str = Field(description="Stage the trainer is in: rft, value_pretraining, single_turn_ppo, ppo.")
    metrics: TrainingMetrics | None = None
    last_checkpoint: str | None = None
    message: str = ""
    rollout: str | None = Field(default=None, max_length=256, description="The rollout backend and device.")
