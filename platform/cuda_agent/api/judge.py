"""The judge's shared types: what crosses the boundary between the judge and the processes that ask it and
read it (the session server, `cuda-agent eval`, the agent loop, the TrainingRun's reward spec).

One home for each value list (device, precision, compile mode, the reward scale), the options a caller may
set (`JudgeOptions`: the session server hands them to the judge as this model's JSON, `--options-json`),
the tolerances and timeouts they override, the verdict the judge prints (`JudgeVerdict`) and the milestone
reward it computes. Pydantic only. Every judge process runs this module: it is among the judge's hashed
files (cuda_agent.api.judge_files.JUDGE_CONTRACT_MODULES).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = get_args(Device)
# strict-fp32: candidate and baselines in full fp32 (TF32 off, audited against float64); tf32: TF32 allowed.
Precision = Literal["strict-fp32", "tf32"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
# The torch.compile baseline's mode; none skips it (the reward is then at most 2).
CompileMode = Literal["default", "max-autotune", "none"]
COMPILE_MODES: tuple[CompileMode, ...] = get_args(CompileMode)
# The CUDA Agent paper's milestone reward: -1 failed, 1 correct, 2 faster than eager, 3 faster than both.
Reward = Literal[-1, 1, 2, 3]


class Tolerances(BaseModel):
    """When an output counts as correct (all must hold) and how strict the strict-fp32 audit is."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    atol: float = Field(default=1e-2, ge=0)
    rtol: float = Field(default=1e-2, ge=0)
    # ||out - ref|| / ||ref|| bound: decides on tiny-magnitude tasks where atol alone passes zeros.
    rel_norm: float = Field(default=1e-2, gt=0)
    # strict-fp32: candidate's error vs a float64 reference may be at most
    # max(precision_factor * eager fp32 error, precision_floor). TF32/FP16 GEMMs land near 3e-4.
    precision_factor: float = Field(default=64.0, gt=1)
    precision_floor: float = Field(default=3e-5, gt=0)


class Timeouts(BaseModel):
    """Wall-clock limits in seconds; each phase also stops at the total deadline."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    total: float = Field(default=1800.0, gt=0)
    build: float = Field(default=900.0, gt=0)
    verify: float = Field(default=300.0, gt=0)
    profile: float = Field(default=600.0, gt=0)


# The judge CLI's argument that carries a JudgeOptions as JSON: how the session server passes them.
OPTIONS_JSON_FLAG = "--options-json"


class JudgeOptions(BaseModel):
    """What a caller may set of one judge run; None leaves the judge's default. A TrainingRun's `spec.reward`
    reaches every session through these (cuda_agent.api.episode): precision, tolerances, speedup margin.
    The session server passes them to the judge as this model's JSON (`--options-json`); the judge CLI's
    flags for people build the same model."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    trials: int | None = Field(default=None, ge=1, le=100)
    precision: Precision | None = None
    compile_mode: CompileMode | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    # 0 is allowed (the judge's own Tolerances take it): stricter, never looser, than any positive value.
    atol: float | None = Field(default=None, ge=0)
    rtol: float | None = Field(default=None, ge=0)
    profile_trials: int | None = Field(default=None, ge=0, le=1000)
    # "Faster" in the milestone reward means speedup > 1 + margin (the paper's eq. 1).
    margin: float | None = Field(default=None, ge=0, le=1)


class TimingTriple(BaseModel):
    """One number per timed function; null where it was not measured (with the reason in `notes`)."""

    model_config = ConfigDict(extra="forbid")

    candidate: float | None = None
    eager: float | None = None
    compile: float | None = None


class Speedups(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eager: float | None = None
    compile: float | None = None


class PhaseSeconds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    build: float = 0.0
    verify: float = 0.0
    profile: float = 0.0


class Roofline(BaseModel):
    """The candidate's time against the physics of the device (judge/plausibility.py): the minimum bytes
    that must cross device memory and the matmul FLOPs the task's ops need, and the fraction of the
    device's measured bandwidth / peak FLOP/s its time implies. Null where not known."""

    model_config = ConfigDict(extra="forbid")

    min_bytes: int | None = None
    min_flops: float | None = None
    # Measured copy bandwidth (read + write) and peak matmul FLOP/s of this device, from the judge's cache.
    device_bandwidth_gbs: float | None = None
    device_tflops: float | None = None
    candidate_gbs: float | None = None
    bandwidth_fraction: float | None = None
    flops_fraction: float | None = None
    eager_bandwidth_fraction: float | None = None
    # Whether an implied speed above the limits is a violation here (GPU) or only reported (CPU).
    enforced: bool = False


class JudgeVerdict(BaseModel):
    """The judge's verdict; `--json` prints exactly this object (keys per docs/judge.md)."""

    model_config = ConfigDict(extra="forbid")

    reward: Reward = -1
    compiled: bool = False
    correct: bool = False
    violations: list[str] = Field(default_factory=list)
    error: str | None = None
    timings_ms: TimingTriple = Field(default_factory=TimingTriple)
    speedup: Speedups = Field(default_factory=Speedups)
    cv: TimingTriple = Field(default_factory=TimingTriple)
    precision: Precision = "strict-fp32"
    device: Device = "cpu"
    build_log: str | None = None
    seconds: PhaseSeconds = Field(default_factory=PhaseSeconds)
    # extras (allowed by the contract)
    timing_method: str | None = None
    latency_ms: TimingTriple = Field(default_factory=TimingTriple)
    task_flags: list[str] = Field(default_factory=list)
    build_cached: bool = False
    # Seconds waited for the device lock (verify + profile) and for build-cache locks (PCH).
    lock_wait_s: float = 0.0
    build_lock_wait_s: float = 0.0
    layout: str | None = None
    # How outputs reached the orchestrator: "cuda-ipc" (device memory) or "channel" (raw bytes).
    output_transfer: str | None = None
    trials: int = 0
    profile_trials: int = 0
    seed_id: str | None = None
    isolation: dict[str, str] = Field(default_factory=dict)
    # Where the wall time went, step by step (orchestrator clock; `worker.*` as the worker reported it).
    steps_s: dict[str, float] = Field(default_factory=dict)
    roofline: Roofline = Field(default_factory=Roofline)
    notes: list[str] = Field(default_factory=list)


def milestone_reward(
    *,
    compiled: bool,
    correct: bool,
    violations: list[str],
    speedup_eager: float | None,
    speedup_compile: float | None,
    margin: float = 0.05,
) -> Reward:
    """The CUDA Agent paper's eq. 1: -1 unless built, correct and clean; then 3 / 2 / 1 by speedup tier."""
    if not compiled or not correct or violations:
        return -1
    faster_than_eager = speedup_eager is not None and speedup_eager > 1.0 + margin
    faster_than_compile = speedup_compile is not None and speedup_compile > 1.0 + margin
    if faster_than_eager and faster_than_compile:
        return 3
    if faster_than_eager:
        return 2
    return 1
