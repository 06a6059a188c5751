"""Records and configs of the data pipeline: catalogue entries, synthesized samples with their filter
verdicts, the run summary, and the configs of the composer, the filters and `cuda-agent data synth`.

A sample's Ops-6K fields (`ops`, `data_source`, `code`) are the released set's columns; everything else is
ours (id, verdicts, accepted) and is written next to them.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cuda_agent.api.judge import Device

OpKind = Literal["module", "functional", "tensor"]
OpStatus = Literal["runnable", "failed", "unsupported", "excluded"]
# In the order the filters run: cheap static checks first, torch.compile last (a sample stops at its
# first failing filter).
FilterName = Literal[
    "composed",
    "decontamination",
    "no_stochastic_ops",
    "runs_eager",
    "deterministic",
    "nontrivial_output",
    "runtime",
    "runs_compiled",
]
FILTER_ORDER: tuple[FilterName, ...] = get_args(FilterName)


class CatalogueEntry(BaseModel):
    """One crawled operator. `name` is how generated code spells it (`nn.Conv2d`, `F.gelu`, `torch.sum`,
    `transformers.NewGELUActivation`); `status` says whether the composer may use it and `reason` why not."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: OpKind
    source: Literal["torch", "transformers"] = "torch"
    family: str | None = None
    status: OpStatus
    reason: str = ""
    required_args: tuple[str, ...] = ()
    input_ranks: tuple[int, ...] = ()
    inline_source: str = Field(default="", description="class source pasted into tasks (transformers ops)")


class Verdict(BaseModel):
    """One filter's decision on one sample; `detail` says why (a measured number or an error)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    filter: FilterName
    passed: bool
    detail: str = ""
    value: float | None = Field(default=None, description="the measured number: runtime ms, similarity")


CalibrationOutcome = Literal["in_window", "memory", "shape", "rounds", "no_progress", "failed"]


class Calibration(BaseModel):
    """How calibrate.py sized a programmatic task on the target device: the factor its batch dimension
    was scaled by, why the search stopped, and the eager time it measured at the chosen size (the
    runtime filter then times the task again)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_scale: float = Field(gt=0, description="2**shift; 1.0: composed size")
    outcome: CalibrationOutcome
    rounds: int = Field(ge=0, description="measurements taken")
    ms: float | None = Field(default=None, description="median eager ms measured at the chosen size")
    peak_bytes: int | None = None


class Sample(BaseModel):
    """One composed task with the Ops-6K fields and what the filters said. `data_source` is
    `<source>#<number of ops>` as in the released set (`torch#2`)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    ops: list[str]
    data_source: str
    code: str
    composer: str = "programmatic"
    verdicts: list[Verdict] = Field(default_factory=list)
    accepted: bool = False
    rejected_by: FilterName | None = None
    calibration: Calibration | None = None

    @property
    def n_ops(self) -> int:
        return len(self.ops)


class Summary(BaseModel):
    """What a run produced: counts, the share of 1-5-op samples among accepted ones, and how many
    candidates each filter rejected (each candidate counted once, at its first failing filter)."""

    model_config = ConfigDict(extra="forbid")

    candidates: int
    passed: int = Field(description="candidates that passed every filter")
    accepted: int = Field(description="samples in the dataset: the first n that passed")
    ops_share: dict[str, float] = Field(
        description="'1'..'5' -> share of accepted samples with that many ops"
    )
    rejections: dict[str, int]
    runtime_ms: dict[str, float] = Field(
        default_factory=dict, description="p10 / p50 / p90 of the median eager time of candidates timed"
    )
    calibration: dict[str, int] = Field(
        default_factory=dict,
        description="calibrated candidates per outcome, plus scaled_up / scaled_down / unscaled counts",
    )
    device: Device
    composer: str
    seed: int


class FilterConfig(BaseModel):
    """Which filters run and their thresholds. Runtime bounds default to the paper's [1, 100] ms on CUDA;
    CPU runs use wider bounds (`for_device`) since a CPU is one to three orders of magnitude slower."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: tuple[FilterName, ...] = FILTER_ORDER
    device: Device = "cpu"
    min_runtime_ms: float = Field(default=1.0, ge=0)
    max_runtime_ms: float = Field(default=100.0, gt=0)
    runtime_repeats: int = Field(default=5, ge=1, le=1000)
    compile_backend: str = Field(default="inductor", description="torch.compile backend of runs_compiled")
    compile_rtol: float = Field(default=1e-3, gt=0)
    compile_atol: float = Field(default=1e-3, gt=0)
    similarity_threshold: float = Field(default=0.9, gt=0, le=1)
    timeout_s: float = Field(default=300.0, ge=0, description="per task, all execution filters; 0: none")
    seed: int = 0

    @model_validator(mode="after")
    def _bounds_ordered(self) -> FilterConfig:
        if self.min_runtime_ms >= self.max_runtime_ms:
            raise ValueError(f"min_runtime_ms {self.min_runtime_ms} must be below max_runtime_ms")
        return self

    @classmethod
    def for_device(cls, device: Device, **overrides: object) -> FilterConfig:
        bounds = {"cuda": (1.0, 100.0), "cpu": (0.001, 1000.0)}[device]
        values: dict[str, object] = {
            "device": device,
            "min_runtime_ms": bounds[0],
            "max_runtime_ms": bounds[1],
        }
        values.update(overrides)
        return cls.model_validate(values)


class CalibrationConfig(BaseModel):
    """Device-aware sizing of programmatic tasks (calibrate.py): measure each composed task's eager time
    on the target device and scale its batch dimension by powers of two towards `target_ms`, within the
    memory and tensor-size caps, before the filters (whose runtime window is not changed) run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    target_ms: float | None = Field(
        default=None, gt=0, description="aim; default: the runtime window's geometric middle (10 ms on cuda)"
    )
    margin: float = Field(
        default=1.5, ge=1, description="a size is settled once within [min*margin, max/margin] ms"
    )
    max_rounds: int = Field(default=5, ge=1, le=20, description="measurements per task at most")
    max_step: int = Field(default=4, ge=1, le=16, description="log2 of the largest batch change per round")
    memory_fraction: float = Field(
        default=0.1,
        gt=0,
        le=0.9,
        description="peak memory of one task at most this share of the device's (the judge holds several "
        "copies of a task's tensors)",
    )
    max_tensor_elements: int = Field(
        default=(1 << 31) - 1, ge=1, description="no tensor larger (32-bit indexing in some kernels)"
    )


class ComposerConfig(BaseModel):
    """How the composer samples: the distribution of the number of ops (1-5) and the shape scale."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op_count_weights: dict[int, float] = Field(
        default_factory=lambda: {1: 0.05, 2: 0.6, 3: 0.2, 4: 0.1, 5: 0.05},
        description="weight of each number of ops; the paper's filtered set is 83.8% two-op",
    )
    scale: Literal["small", "full"] = Field(
        default="small", description="small: CPU-sized tensors; full: sizes that take milliseconds on a GPU"
    )
    include_transformers: bool = Field(
        default=True, description="sample transformers modules (inlined into the task) when installed"
    )
    target_ms: float | None = Field(
        default=None, gt=0, description="eager time the LLM composer is asked to size tasks for (cuda)"
    )

    @model_validator(mode="after")
    def _weights_valid(self) -> ComposerConfig:
        if not self.op_count_weights or any(k not in range(1, 6) for k in self.op_count_weights):
            raise ValueError("op_count_weights keys must be op counts 1..5")
        if any(w < 0 for w in self.op_count_weights.values()) or sum(self.op_count_weights.values()) <= 0:
            raise ValueError("op_count_weights must be non-negative and not all zero")
        return self
