"""Pydantic models of an evaluation: its configuration, one row per judged candidate, and the report."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cuda_agent.api.episode import EpisodeSettings
from cuda_agent.api.judge import CompileMode, Device, JudgeOptions, Precision

# judged: the judge gave a verdict; task-error: the task itself failed (judge exit 2 / HTTP 422);
# no-result: the judge produced nothing (crash, timeout, sandbox failure); no-candidate: nothing to judge.
RowStatus = Literal["judged", "task-error", "no-result", "no-candidate"]


class JudgeSettings(BaseModel):
    """The judge flags every evaluation of a run uses (None: the judge's own default). With `--run` the
    precision, tolerances and margin are the TrainingRun's spec.reward (its episode settings' judge)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trials: int | None = Field(default=None, ge=1, le=100)
    profile_trials: int | None = Field(default=None, ge=3, le=1000)
    precision: Precision = "strict-fp32"
    compile_mode: CompileMode = "default"
    timeout_s: float = Field(default=1800.0, gt=0, le=3600)
    atol: float | None = Field(default=None, ge=0)
    rtol: float | None = Field(default=None, ge=0)
    # "Faster" as the judge's milestone reward defines it: speedup > 1 + margin (eq. 1 of the paper).
    margin: float = Field(default=0.05, ge=0, le=1)

    def options(self) -> JudgeOptions:
        """The same settings as a session's or an evaluate request's judge options."""
        return JudgeOptions.model_validate(self.model_dump())


class EvalConfig(BaseModel):
    """One `cuda-agent eval` run; `out_dir` holds results.jsonl (resumable), report.json/.md and plots."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tasks: str = Field(description="directory of KernelBench-format tasks, or an s3:// prefix")
    out_dir: Path
    solutions: Path | None = None
    policy: str | None = Field(default=None, description="policy backend spec, e.g. replay:FILE (policy.py)")
    device: Device = "cpu"
    jobs: int = Field(default=2, ge=1, le=1024, description="evaluations in flight")
    sandbox_url: str | None = Field(default=None, description="judge through this sandbox server")
    judge: JudgeSettings = JudgeSettings()
    episode: EpisodeSettings | None = Field(
        default=None,
        description="a TrainingRun's episode settings (--run): policy episodes get its evaluation turn "
        "limit, context and tools; device and judge settings come from it too",
    )
    levels: list[str] = Field(default_factory=list, description="only these levels (empty: all)")
    only: list[str] = Field(default_factory=list, description="only these task names (empty: all)")
    fast_p: list[float] = Field(default_factory=lambda: [0.0, 0.5, 0.8, 1.0, 1.5, 2.0])
    suspicious_speedup: float = Field(default=10.0, gt=1)
    compare_allclose: bool = False
    gpus: int | None = Field(default=None, ge=1, description="GPUs the evaluations shared (per-GPU-hour)")

    @model_validator(mode="after")
    def _one_source(self) -> EvalConfig:
        if (self.solutions is None) == (self.policy is None):
            raise ValueError("give exactly one of solutions (--solutions) or policy (--policy)")
        return self

    @property
    def margin(self) -> float:
        return self.judge.margin


class AllcloseCheck(BaseModel):
    """What a plain KernelBench-style harness (import ModelNew, compare outputs at atol=rtol) said."""

    model_config = ConfigDict(extra="forbid")

    accepted: bool
    max_abs_err: float | None = None
    detail: str = ""
    # True: run as an agent command in a sandbox session (--sandbox); False: unconfined on this machine.
    confined: bool = False


class TaskResult(BaseModel):
    """One judged candidate (a solution file or directory, or one policy episode); a line of results.jsonl."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="unique within a run: level/task[/candidate]; reruns skip done keys")
    level: str
    task: str
    candidate: str | None = None
    status: RowStatus = "judged"
    reward: int = Field(default=-1, ge=-1, le=3)
    compiled: bool = False
    correct: bool = False
    violations: list[str] = Field(default_factory=list)
    error: str | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    timings_ms: dict[str, float | None] = Field(default_factory=dict)
    precision: str | None = None
    device: str | None = None
    build_cached: bool | None = None
    seconds: float = Field(default=0.0, ge=0, description="wall time of this evaluation")
    # Where that time went, as the judge reported it (docs/judge.md, `--json`): its phases (build, verify,
    # profile), its step breakdown, and the seconds it waited for the device lock and for build-cache locks
    # (the precompiled header).
    phase_s: dict[str, float] = Field(default_factory=dict)
    steps_s: dict[str, float] = Field(default_factory=dict)
    lock_wait_s: float | None = None
    build_lock_wait_s: float | None = None
    judge_service: bool = Field(
        default=False,
        description="the local judge process handed this evaluation to a warm judge service "
        "(CUDA_AGENT_JUDGE_SERVICE) instead of judging in-process",
    )
    allclose: AllcloseCheck | None = None
    # policy episodes only
    episode_end: str | None = None
    turns: int | None = None

    @property
    def refused_not_build(self) -> bool:
        """Refused for a reason other than a build failure: a violation, or wrong / crashed once built."""
        if self.status != "judged" or self.reward > 0:
            return False
        return bool(self.violations) or self.compiled

    @property
    def refusal(self) -> str:
        """The judge's reason in one line: the first violation, else the error's first line."""
        if self.violations:
            return self.violations[0]
        return (self.error or "incorrect").splitlines()[0][:300]


class LevelSummary(BaseModel):
    """Metrics over the rows of one level (or all of them: level `overall`)."""

    model_config = ConfigDict(extra="forbid")

    level: str
    candidates: int
    judged: int
    correct: int
    pass_rate: float
    faster_than_eager: float
    faster_than_compile: float | None = Field(description="None when no torch.compile time was measured")
    geomean_speedup_eager: float | None
    geomean_speedup_compile: float | None
    fast_p_eager: dict[str, float]
    fast_p_compile: dict[str, float]
    mean_reward: float
    rewards: dict[str, int] = Field(description="count of rows per reward value")


class Flagged(BaseModel):
    """A row listed for review: a refusal the allclose harness accepted, or a suspicious speedup."""

    model_config = ConfigDict(extra="forbid")

    key: str
    reason: str
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    max_abs_err: float | None = None


class EvalReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Literal["solutions", "policy"]
    tasks: str
    source: str = Field(description="the solutions directory or the policy spec")
    device: str
    precision: str
    compile_mode: str
    task_scale: str | None = None
    margin: float
    fast_p: list[float]
    levels: list[LevelSummary]
    overall: LevelSummary
    refused_allclose_accepts: list[Flagged] = Field(default_factory=list)
    allclose_checked: int = 0
    allclose_confined: bool = Field(
        default=False, description="every allclose check ran in a sandbox session"
    )
    suspicious: list[Flagged] = Field(default_factory=list)
    suspicious_speedup: float
    evaluations: int = Field(description="rows evaluated by this invocation (not resumed)")
    wall_s: float
    gpus: int | None
    evaluations_per_gpu_hour: float | None = Field(
        default=None, description="on CPU: evaluations per hour of this machine"
    )
    task_errors: list[str] = Field(default_factory=list)
