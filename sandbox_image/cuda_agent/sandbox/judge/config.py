"""Configuration and result models of the judge (the contract shared with the session server and tests).

The judge's trusted side imports it (cli, orchestrator, references, compare, policy, plausibility,
worker_session), and the sandbox contract (cuda_agent.sandbox.api) reads `Reward` from it. The worker never
does: it receives its settings as a plain JSON object so it stays free of pydantic and starts fast.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.api.judge_files import JUDGE_CACHE_ENV

Device = Literal["cpu", "cuda"]
Precision = Literal["strict-fp32", "tf32"]
CompileMode = Literal["default", "max-autotune", "none"]


def default_cache_dir() -> Path:
    """Content-addressed build cache shared by all judge runs of this user (PCH, objects, extensions)."""
    env = os.environ.get(JUDGE_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "cuda-agent" / "judge-build"


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


class ProfileSettings(BaseModel):
    """How the three functions (candidate, eager, torch.compile) are timed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trials: int = Field(default=100, ge=3)
    warmup: int = Field(default=3, ge=1)
    # Host-side cross-check: K calls between two full device synchronisations, repeated `host_rounds` times.
    host_calls: int = Field(default=20, ge=1)
    host_rounds: int = Field(default=3, ge=1)
    # Allowed host-minus-device gap per call: 2 x eager's own gap + this + per-kernel launch allowance.
    host_gap_ms: float = Field(default=0.05, ge=0)
    host_gap_per_kernel_ms: float = Field(default=0.025, ge=0)
    l2_flush_bytes: int = Field(default=256 << 20, ge=0)
    cpu_thrash_bytes: int = Field(default=32 << 20, ge=0)
    # Timed calls whose outputs are compared with references (a secret sample, the last call included);
    # every timed trial gets fresh input values. A candidate wrong on half the calls escapes 0.5**8.
    checked_calls: int = Field(default=8, ge=1)
    # A time implying more than this multiple of the device's bandwidth or peak FLOP/s: implausible-speed.
    plausibility_slack: float = Field(default=1.05, ge=1.0)


class OpPolicy(BaseModel):
    """Which aten ops may reach the dispatcher while ModelNew.forward runs (names without `aten::`).

    `anywhere`: ops that create, view, copy or fill memory but compute nothing from input values.
    `in_extension`: library GEMM/convolution ops, allowed only while a function of the candidate's own
    extension is executing (the candidate wraps cuBLAS/cuDNN; plain PyTorch fallbacks are not allowed).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    anywhere: frozenset[str] = frozenset(
        {
            # allocation and constants
            "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
            "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor",
            "fill_", "zero_", "resize_", "as_strided_", "lift_fresh", "lift_fresh_copy",
            # views and metadata
            "view", "_unsafe_view", "reshape", "as_strided", "permute", "transpose", "t", "expand",
            "expand_as", "squeeze", "unsqueeze", "select", "slice", "narrow", "split", "split_with_sizes",
            "unbind", "chunk", "detach", "alias", "view_as", "flatten", "unflatten", "movedim", "contiguous",
            "resolve_conj", "resolve_neg", "conj", "_conj", "is_nonzero", "_local_scalar_dense", "item",
            "size", "stride", "sym_size", "sym_stride", "sym_numel", "dim", "is_contiguous", "to", "type_as",
            # layout preparation: copies move existing values, they compute none
            "clone", "copy_", "_to_copy", "cat", "stack",
        }
    )  # fmt: skip
    in_extension: frozenset[str] = frozenset(
        {
            "mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "mv", "addmv", "dot",
            "convolution", "_convolution", "convolution_overrideable", "cudnn_convolution",
            "cudnn_convolution_transpose", "mkldnn_convolution", "_mkldnn_convolution",
            "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
            "_scaled_mm", "_int_mm",
        }
    )  # fmt: skip
    # Vendor libraries the extension may call directly (CUDA Agent's rules: cuBLAS/cuBLASLt for GEMM,
    # cuDNN for convolution): library -> regexes of the kernel names it launches (demangled, as the
    # profiler reports them). Their kernels, launched from extension code with no aten op around the
    # launch, count as the candidate's device work like its own `__global__` kernels (policy.py).
    # fmt: off
    libraries: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: {
            # Checked in this order: cuDNN's names first (its convolutions are implicit GEMMs too). Seen
            # on the H200: sm80_xmma_fprop_implicit_gemm_..._cudnn, sm80_xmma_gemm_..._cublas.
            "cudnn": (
                r"cudnn", r"fprop", r"dgrad", r"wgrad", r"convolve", r"conv\w*kernel", r"winograd", r"\bfft",
                r"implicit_gemm", r"nchwToNhwc", r"nhwcToNchw", r"flip_filter", r"op_generic_tensor_kernel",
                r"scalePackedTensor", r"genericConv",
            ),
            "cublas": (
                r"cublas", r"gemm", r"gemv", r"splitKreduce", r"\bdot_kernel", r"\breduce_1Block_kernel",
                r"\bscal_kernel", r"\baxpy_kernel", r"cutlass", r"xmma", r"\bsm\d+_",
            ),
        }
    )
    # fmt: on


class JudgeConfig(BaseModel):
    """Everything one judge run needs; built from the CLI (or the session server) and validated here."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Path
    candidate: Path
    device: Device = "cpu"
    trials: int = Field(default=5, ge=1, le=100)
    precision: Precision = "strict-fp32"
    compile_mode: CompileMode = "default"
    tolerances: Tolerances = Tolerances()
    timeouts: Timeouts = Timeouts()
    profile: ProfileSettings = ProfileSettings()
    ops: OpPolicy = OpPolicy()
    seed_file: Path | None = None
    cache_dir: Path = Field(default_factory=default_cache_dir)
    # Reward margin of the paper's eq. 1: "faster" means speedup > 1 + margin.
    margin: float = Field(default=0.05, ge=0)


Reward = Literal[-1, 1, 2, 3]


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
