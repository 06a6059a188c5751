"""The episode contract: what every agent episode of a TrainingRun gets, in one place.

A TrainingRun spec and the SandboxPool it names decide together what each episode's sandbox session is:
the device the pool's servers judge on, the judge's options from `spec.reward` (precision, tolerances,
speedup margin), the turn limits of training and evaluation episodes, the context budget and the tools.
`episode_settings` maps them once; the operator computes the result from the pool it observed and hands it
to the trainer through the run contract (`TrainerEnv.episode`), and the trainer's rollout, the warm-up
demonstrations and `cuda-agent eval --run` build their agent config from it. Nothing else re-maps a field.

Bottom layer: pydantic, the API models and the sandbox contract only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.api.judge import Device, JudgeOptions, Precision
from cuda_agent.api.sandbox import ToolName, machine_gpus
from cuda_agent.api.sandboxpool import SandboxPoolSpec
from cuda_agent.api.trainingrun import PrecisionPolicy, TrainingRunSpec

# spec.reward.precision as the judge's --precision spells it.
JUDGE_PRECISION: dict[PrecisionPolicy, Precision] = {
    PrecisionPolicy.STRICT_FP32: "strict-fp32",
    PrecisionPolicy.TF32: "tf32",
}


class EpisodeSettings(BaseModel):
    """The settings every session of a run gets (serialised once, as JSON, into CUDA_AGENT_EPISODE)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Device = Field(description="What the pool's servers judge on: cuda when they have GPUs.")
    judge: JudgeOptions = Field(description="Judge options of every session, from spec.reward.")
    tools: list[ToolName] = Field(min_length=1)
    max_turns_train: int = Field(ge=1)
    max_turns_eval: int = Field(ge=1)
    max_context_tokens: int = Field(ge=16)

    def max_turns(self, evaluation: bool) -> int:
        return self.max_turns_eval if evaluation else self.max_turns_train


def judge_device(pool: SandboxPoolSpec | None) -> Device:
    """cuda when the pool's servers have GPUs. None is a pool nobody observed (a trainer started by hand
    without CUDA_AGENT_EPISODE): CPU sessions, which any server accepts."""
    return "cuda" if pool is not None and pool.gpu.count > 0 else "cpu"


def episode_settings(run: TrainingRunSpec, pool: SandboxPoolSpec | None) -> EpisodeSettings:
    """The settings of the run's episodes on `pool` (as placed: see `on_this_machine` for local servers)."""
    reward = run.reward
    return EpisodeSettings(
        device=judge_device(pool),
        judge=JudgeOptions(
            precision=JUDGE_PRECISION[reward.precision],
            atol=reward.tolerance.atol,
            rtol=reward.tolerance.rtol,
            margin=reward.speedup_margin,
        ),
        tools=list(run.agent.tools),
        max_turns_train=run.agent.max_turns_train,
        max_turns_eval=run.agent.max_turns_eval,
        max_context_tokens=run.agent.max_context_tokens,
    )


def on_this_machine(pool: SandboxPoolSpec, gpus: int | None = None) -> SandboxPoolSpec:
    """The pool as a sandbox server on this machine serves it (the local executor, the demonstrations, a
    local eval): its GPUs are those of the pool's count that this machine has (`gpus`, default the device
    nodes the server itself would count). The local demo's pool asks for a GPU of kwok's fake nodes; on a
    machine without one its server judges on the CPU, and so must its sessions ask."""
    available = machine_gpus() if gpus is None else gpus
    placed = pool.gpu.model_copy(update={"count": min(pool.gpu.count, available)})
    return pool.model_copy(update={"gpu": placed})
