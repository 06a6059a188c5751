"""Configuration of one sandbox server (one per GPU pod, or one local process)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.api.sandbox import SANDBOX_PORT

IsolationMode = Literal["auto", "root", "restricted"]


class ProcessLimits(BaseModel):
    """setrlimit values applied in the child before it runs any agent or judge code."""

    model_config = ConfigDict(extra="forbid")

    cpu_seconds: int = Field(default=3600, ge=1, description="RLIMIT_CPU per process")
    memory_mib: int | None = Field(
        default=8192,
        ge=64,
        description="RLIMIT_AS per process; None on GPU hosts, where CUDA reserves huge virtual ranges",
    )
    processes: int = Field(default=256, ge=8, description="RLIMIT_NPROC: per uid, so per session when root")
    file_size_mib: int = Field(
        default=512, ge=1, description="RLIMIT_FSIZE: largest file one process may write"
    )
    open_files: int = Field(default=1024, ge=16, description="RLIMIT_NOFILE")

    def rlimits(self) -> dict[str, list[int]]:
        limits = {
            "RLIMIT_CPU": [self.cpu_seconds, self.cpu_seconds],
            "RLIMIT_NPROC": [self.processes, self.processes],
            "RLIMIT_FSIZE": [self.file_size_mib << 20, self.file_size_mib << 20],
            "RLIMIT_NOFILE": [self.open_files, self.open_files],
            "RLIMIT_CORE": [0, 0],
        }
        if self.memory_mib is not None:
            limits["RLIMIT_AS"] = [self.memory_mib << 20, self.memory_mib << 20]
        return limits


def default_judge_command() -> list[str]:
    """The judge CLI module itself: the same program as `cuda-agent judge`, without the dispatcher."""
    return [sys.executable, "-m", "cuda_agent.sandbox.judge.cli"]


class SandboxServerConfig(BaseModel):
    """Everything `cuda-agent sandbox serve` can be told; the CLI flags map one to one onto these fields."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=SANDBOX_PORT, ge=0, le=65535)
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="also serve GET /metrics, and nothing else, on this port (0: any free port), so a "
        "NetworkPolicy can admit Prometheus there without opening the session API",
    )
    state_dir: Path = Path("/var/lib/cuda-agent-sandbox")
    max_sessions: int = Field(default=64, ge=1)
    session_ttl_s: float = Field(
        default=1800.0, gt=0, description="an idle session is deleted after this long"
    )
    isolation: IsolationMode = "auto"
    uid_base: int = Field(
        default=61000, ge=1000, description="root mode: session slot k uses uids base+2k, base+2k+1"
    )
    agent_limits: ProcessLimits = ProcessLimits()
    judge_limits: ProcessLimits = ProcessLimits(memory_mib=None, processes=512, file_size_mib=2048)
    workspace_quota_mib: int = Field(
        default=2048,
        ge=16,
        le=1 << 20,
        description="bytes a session's workspace, /tmp and /dev/shm may hold together",
    )
    workspace_max_inodes: int = Field(
        default=100_000, ge=1000, description="files and directories a session's scratch space may hold"
    )
    user_namespaces: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="restricted mode: give agent commands private PID, IPC, mount and network namespaces "
        "through an unprivileged user namespace (auto: when the kernel and the pod's seccomp profile "
        "allow it)",
    )
    bash_default_timeout_s: float = Field(default=120.0, gt=0)
    bash_max_timeout_s: float = Field(default=600.0, gt=0)
    output_limit_chars: int = Field(
        default=30000, ge=1000, description="longer tool output is cut in the middle"
    )
    max_background_jobs: int = Field(default=8, ge=1, description="running at once, per session")
    background_job_timeout_s: float = Field(
        default=3600.0, gt=0, description="a background job running longer is killed (its process group)"
    )
    tool_workers: int = Field(
        default=8, ge=1, le=256, description="processes running the file tools and the bash_output filter"
    )
    max_tool_workers_per_session: int = Field(
        default=2, ge=1, le=256, description="tool workers one session may hold at once (of tool_workers)"
    )
    tool_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="a file tool running longer is stopped (its worker killed)"
    )
    tool_memory_mib: int = Field(
        default=1024, ge=256, le=65536, description="RLIMIT_AS of a file tool worker process"
    )
    max_tool_calls_per_session: int = Field(
        default=4, ge=1, le=1024, description="tool calls of one session running at once; more wait"
    )
    max_requests_per_session: int = Field(
        default=32,
        ge=1,
        le=65536,
        description="requests of one session in flight (running or waiting); more are answered 429",
    )
    judge_command: list[str] = Field(default_factory=default_judge_command)
    judge_zygote: Literal["on", "off"] = Field(
        default="on",
        description="fork judges from a pre-started process that has imported torch and inductor (seconds "
        "faster per evaluation; the same confinement), default judge_command only; judges are exec'd "
        "when the zygote cannot start or fails its CUDA self-check",
    )
    judge_dir: Path | None = Field(default=None, description="files hash-checked before every judge run")
    frozen_dir: Path | None = Field(
        default=None, description="binding.cpp / binding_registry.h copied into workspaces"
    )
    shared_judge_cache: bool = Field(
        default=False,
        description="one build cache for all judge runs (fast: the torch PCH is built once) instead of one "
        "per session; candidate code could then plant artifacts for other sessions' builds",
    )
    judge_seed_dir: Path | None = Field(
        default=None,
        description="trusted, read-only seed of precompiled torch headers (`cuda-agent judge-seed`) that "
        "judges use in place of building them into a session's empty cache; refused at startup when a judge "
        "or agent could write it, skipped with a warning when missing",
    )
    judge_timeout_s: float = Field(default=1800.0, gt=0, description="wall clock for one whole judge process")
    max_concurrent_judges: int = Field(
        default=2, ge=1, description="judge processes at once (builds share the CPUs)"
    )
    gpus: int | None = Field(default=None, ge=0, description="GPUs to share; None: count /dev/nvidia[0-9]*")
    agent_gpu_access: bool = Field(
        default=False, description="let agent commands see the GPU (disturbs timing; drops their RLIMIT_AS)"
    )
    mask_paths: list[Path] = Field(
        default_factory=lambda: [Path("/root")],
        description="root mode: hidden from agent and judge processes (the interpreter is re-exposed)",
    )
    env_passthrough: list[str] = Field(default_factory=lambda: [
            "LANG", "LC_ALL", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "TORCH_CUDA_ARCH_LIST",
            "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
        ],
        description="the only server environment variables agent and judge processes inherit",
    )  # fmt: skip

    @property
    def sandbox_uids(self) -> range:
        """Root mode's uids: the judges' group (uid_base - 1) and a pair per slot (sessions' and judges')."""
        slots = self.max_sessions + self.max_concurrent_judges
        return range(self.uid_base - 1, self.uid_base + 2 * slots)
