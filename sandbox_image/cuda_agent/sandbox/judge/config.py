"""How one judge run is configured: `JudgeConfig` (built by the CLI from `JudgeOptions`), its timing
settings and its op policy. The types shared with the judge's callers (options, tolerances, timeouts, the
verdict, milestone_reward) live in cuda_agent.api.judge.

The judge's trusted side imports it (cli, orchestrator, references, policy, plausibility). The worker never
does: it receives its settings as a plain JSON object so it stays free of pydantic and starts fast.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.api.judge import CompileMode, Device, JudgeOptions, Precision, Timeouts, Tolerances
from cuda_agent.api.judge_files import JUDGE_CACHE_ENV


def default_cache_dir() -> Path:
    """Content-addressed build cache shared by all judge runs of this user (PCH, objects, extensions)."""
    env = os.environ.get(JUDGE_CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "cuda-agent" / "judge-build"


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


def judge_config(
    task: Path, candidate: Path, device: Device, options: JudgeOptions, **settings: object
) -> JudgeConfig:
    """One run's configuration from the caller's options (the one place they become JudgeConfig fields); an
    unset option keeps the judge's default. `settings`: JudgeConfig fields no caller's options name
    (seed_file, cache_dir)."""
    fields: dict[str, object] = {
        name: value
        for name in ("trials", "precision", "compile_mode", "margin")
        if (value := getattr(options, name)) is not None
    }
    if options.timeout_s is not None:
        fields["timeouts"] = timeouts_within(options.timeout_s)
    tolerances = {name: value for name in ("atol", "rtol") if (value := getattr(options, name)) is not None}
    if tolerances:
        fields["tolerances"] = Tolerances.model_validate(tolerances)
    if options.profile_trials is not None:
        fields["profile"] = ProfileSettings(trials=options.profile_trials)
    return JudgeConfig.model_validate(
        {"task": task, "candidate": candidate, "device": device, **fields, **settings}
    )


def timeouts_within(total: float) -> Timeouts:
    """A total limit, and each phase's own default limit cut to it."""
    default = Timeouts()
    return Timeouts(
        total=total,
        build=min(default.build, total),
        verify=min(default.verify, total),
        profile=min(default.profile, total),
    )
