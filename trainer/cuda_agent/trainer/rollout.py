"""What the trainer asks of rollouts, and the default implementation on the agent loop.

The trainer needs one async call, `generate(request) -> list[Trajectory]`, and a weight hook,
`update_weights(bucket)`. `AgentRollout` runs the agent loop (cuda_agent.agent) with the transformers
backend on a copy of the policy (on the GPU when the trainer process has one) and the run's sandbox server;
tests inject scripted rollouts with the same two methods, and a cluster deployment swaps in vLLM engines
behind the same interface. A rollout may say what it is in `description` (logged, and reported in the
run's status.rollout).

Every session gets the run's episode settings (cuda_agent.api.episode) as the operator handed them over
(`TrainerEnv.episode`): the device the pool judges on and the judge options of spec.reward.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.episode import EpisodeSettings, episode_settings
from cuda_agent.api.run_contract import ENV_EPISODE, TrainerEnv
from cuda_agent.api.sandbox import TaskRef
from cuda_agent.api.trainingrun import TrainingRun, TrainingRunSpec
from cuda_agent.trainer.weight_sync import NamedTensors, load_bucket

if TYPE_CHECKING:
    from cuda_agent.agent.chat import ChatCodec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RolloutRequest:
    """One batch of episodes: task i runs as episode episode_ids[i] with seed + i."""

    stage: str
    step: int
    tasks: list[TaskRef]
    episode_ids: list[str]
    max_turns: int
    max_context_tokens: int
    seed: int


class Rollout(Protocol):
    async def generate(self, request: RolloutRequest) -> list[Trajectory]: ...

    def update_weights(self, bucket: NamedTensors) -> Awaitable[None] | None: ...


def run_codec(spec: TrainingRunSpec) -> ChatCodec:
    """The run's tokenizer and chat template with the run's tools: what the policy sees, for rollouts and
    for the demonstrations replayed for its warm-up alike."""
    from transformers import AutoTokenizer

    from cuda_agent.agent.chat import ChatCodec
    from cuda_agent.agent.tools import openai_tools
    from cuda_agent.trainer.models import local_model_dir

    tokenizer = AutoTokenizer.from_pretrained(
        local_model_dir(spec.model.base), gguf_file=spec.model.gguf_file
    )
    return ChatCodec(tokenizer, openai_tools(spec.agent.tools))


def run_episode(run: TrainingRun, env: TrainerEnv) -> EpisodeSettings:
    """The run's episode settings as the operator handed them over; a trainer started by hand without them
    gets the run's own with CPU sessions (any server takes those), and a warning says so."""
    if env.episode is not None:
        return env.episode
    log.warning(
        "%s is not set (no operator started this trainer): sessions ask for CPU judging; set it to the "
        "JSON of cuda_agent.api.episode.episode_settings(spec, pool) for the pool's device",
        ENV_EPISODE,
    )
    return episode_settings(run.spec, None)


class AgentRollout:
    """The agent loop on the transformers backend (one in-process copy of the policy, on the GPU when this
    process has one, in the trainer's dtype) and the sandbox server named by CUDA_AGENT_SANDBOX_URL."""

    def __init__(self, run: TrainingRun, env: TrainerEnv) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from cuda_agent.trainer.models import load_pretrained

        if not env.sandbox_url:
            raise ValueError("the agent loop needs a sandbox server: set CUDA_AGENT_SANDBOX_URL")
        spec = run.spec
        self.episode = run_episode(run, env)
        self.codec = run_codec(spec)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model: Any = load_pretrained(AutoModelForCausalLM, spec.model, spec.model.base, spec.trainer)
        self.model = model.to(self.device)
        self.model.train(False)
        self.sandbox_url = env.sandbox_url
        self.description = f"transformers in process on {self.device} ({spec.trainer.precision})"
        log.info(
            "rollout: %s; sessions judge on %s with %s",
            self.description,
            self.episode.device,
            self.episode.judge.model_dump_json(exclude_none=True),
        )

    async def generate(self, request: RolloutRequest) -> list[Trajectory]:
        from cuda_agent.agent.config import AgentConfig
        from cuda_agent.agent.loop import AgentLoop
        from cuda_agent.rollout.base import SamplingParams
        from cuda_agent.rollout.hf import TransformersBackend
        from cuda_agent.sandbox.client import SandboxClient

        config = AgentConfig.for_episode(
            self.episode, max_turns=request.max_turns, max_context_tokens=request.max_context_tokens
        )
        backend = TransformersBackend(self.model, self.codec.stop_token_ids)
        try:
            async with SandboxClient(self.sandbox_url) as sandbox:
                loop = AgentLoop(backend, sandbox, self.codec, config)
                runs = [
                    loop.run(task, SamplingParams(temperature=1.0, seed=request.seed + i), episode_id)
                    for i, (task, episode_id) in enumerate(
                        zip(request.tasks, request.episode_ids, strict=True)
                    )
                ]
                return list(await asyncio.gather(*runs))
        finally:
            backend.close()

    def update_weights(self, bucket: NamedTensors) -> None:
        load_bucket(self.model, bucket)


def agent_rollout(run: TrainingRun, env: TrainerEnv, workers: Any = None) -> Rollout:
    """The default rollout factory of `cuda-agent train` (`--rollout MODULE:FUNCTION` names another): vLLM
    engines on Ray when the roles run on a Ray cluster with GPUs and vLLM is installed
    (cuda_agent.trainer.engine_rollout), else the agent loop in this process; the log says why."""
    from cuda_agent.trainer.engine_rollout import EngineRollout, engines_unavailable

    reason = engines_unavailable(workers)
    if reason is None:
        return EngineRollout(run, env, workers)
    log.info("rollout: the agent loop in this process, not vLLM engines on Ray: %s", reason)
    return AgentRollout(run, env)


def redundant_loop(trajectory: Trajectory, max_repeats: int) -> bool:
    """True when one generated turn (the same token ids) occurs more than max_repeats times."""
    counts: dict[tuple[int, ...], int] = {}
    turn: list[int] = []
    for token, m in zip([*trajectory.token_ids, -1], [*trajectory.loss_mask, 0], strict=True):
        if m:
            turn.append(token)
        elif turn:
            key = tuple(turn)
            counts[key] = counts.get(key, 0) + 1
            turn = []
    return any(c > max_repeats for c in counts.values())


def learnable(trajectory: Trajectory) -> bool:
    """Episodes the trainer may learn from: the sandbox or the generator did not fail them."""
    return trajectory.end not in ("sandbox_error", "generation_error") and any(trajectory.loss_mask)


def rft_filter(trajectories: Sequence[Trajectory], min_reward: float, max_repeats: int) -> list[Trajectory]:
    """The RFT set: positive (>= min_reward) learnable episodes with no invalid tool call and no loop."""
    return [
        t
        for t in trajectories
        if learnable(t)
        and t.reward >= min_reward
        and t.invalid_tool_calls == 0
        and not redundant_loop(t, max_repeats)
    ]


def describe(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    return {"episodes": len(trajectories), "ends": sorted({t.end for t in trajectories})}
