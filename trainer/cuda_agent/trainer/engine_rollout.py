"""The rollout on a GPU cluster: the agent loop over vLLM engines running as Ray actors.

`cuda_agent.trainer.rollout.agent_rollout` picks it when the roles run on Ray (`trainer.useRay`), the Ray
cluster has GPUs and vLLM is installed; otherwise the agent loop runs on the in-process transformers
backend (`AgentRollout`), and the log says why. The engines sit where `RayWorkers.rollout_placement`
says (their own GPUs, spec.resources.rolloutGpus, or colocated on the trainer's), one per
tensorParallelSize GPUs; episodes are routed to the least-loaded engine and stay there
(`RoutedBackend`). Weights go from the actor ranks to the engines (`ray.engines`): CUDA IPC when
colocated, a NCCL group otherwise, through vLLM's own weight-transfer entry points. The engines start
without reading the policy's weights (`load_format="dummy"`): the constructor syncs the actor's in, so
they hold exactly the actor's policy from the first rollout on.

The coroutines run on the trainer's one event loop (`event_loop.run_async`), so the router's state and
the engines' clients live across steps.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import sys
from typing import TYPE_CHECKING, Any

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.trainer.rollout import RolloutRequest, run_codec, run_episode
from cuda_agent.trainer.weight_sync import NamedTensors

if TYPE_CHECKING:
    from cuda_agent.trainer.ray.engines import EngineKind
    from cuda_agent.trainer.ray.workers import RayWorkers

log = logging.getLogger(__name__)

COLOCATED_GPU_MEMORY = 0.3  # share of a GPU's memory a colocated vLLM engine may take


def engines_unavailable(workers: Any) -> str | None:
    """Why this run cannot use vLLM engines on Ray (None when it can)."""
    ray_workers = sys.modules.get("cuda_agent.trainer.ray.workers")  # not imported: no roles on Ray
    if ray_workers is None or not isinstance(workers, ray_workers.RayWorkers):
        return "the roles are not on Ray (trainer.useRay is false)"
    if not workers.gpus:
        return "the Ray cluster has no GPUs"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed in the trainer's environment"
    return None


class EngineRollout:
    """The agent loop over rollout engines on Ray, and their weights' sync target (`engine_group`)."""

    def __init__(
        self, run: TrainingRun, env: TrainerEnv, workers: RayWorkers, engine: EngineKind = "vllm"
    ) -> None:
        from cuda_agent.rollout.router import EngineActorBackend, RoutedBackend
        from cuda_agent.trainer.ray.engines import EngineGroup, start_engines, weight_transport
        from cuda_agent.trainer.ray.workers import rollout_engine_configs

        if not env.sandbox_url:
            raise ValueError("the agent loop needs a sandbox server: set CUDA_AGENT_SANDBOX_URL")
        spec = run.spec
        self.sandbox_url = env.sandbox_url
        self.episode = run_episode(run, env)
        self.codec = run_codec(spec)
        placement, share = workers.rollout_placement()
        colocated = workers.rollout_bundles is None
        transport = weight_transport(workers.gpus, colocated)
        fields: dict[str, Any] = {}
        if engine == "vllm":
            backend = {"cuda_ipc": "ipc", "nccl": "nccl"}.get(transport)
            fields = {"weight_transfer": backend, "load_format": "dummy"}
            if colocated:
                # The roles train on the same GPUs while the engine keeps its weights and KV cache (vLLM's
                # sleep mode is not used): leave them most of the memory. A starting point, not measured.
                fields["gpu_memory_utilization"] = COLOCATED_GPU_MEMORY
        configs = rollout_engine_configs(spec, spec.model.base, **fields)
        handles = start_engines(
            configs, placement, share, workers.gpus, engine, list(self.codec.stop_token_ids)
        )
        self.backend = RoutedBackend([EngineActorBackend(h) for h in handles])
        tp = spec.resources.tensor_parallel_size
        self.engine_group = EngineGroup(handles, transport, tp)
        where = (
            "colocated with the actor" if colocated else f"on {spec.resources.rollout_gpus} GPUs of their own"
        )
        if not workers.gpus:
            where = "on CPUs"
        engines = f"{len(handles)} engine{'s' if len(handles) > 1 else ''}"
        self.description = (
            f"{engine} on Ray: {engines} (tensor parallel {tp}) {where}; weight sync {transport}"
        )
        log.info("rollout: %s; sessions judge on %s", self.description, self.episode.device)
        # The engines started without the policy's weights: the actor's go in before the first rollout.
        timings = workers.sync_weights(self)
        log.info("rollout engines hold the actor's weights (%.2f GB in %.2f s)", timings["weight_sync_gb"],
                 timings["weight_sync_s"])  # fmt: skip

    async def generate(self, request: RolloutRequest) -> list[Trajectory]:
        from cuda_agent.agent.config import AgentConfig
        from cuda_agent.agent.loop import AgentLoop
        from cuda_agent.rollout.base import SamplingParams
        from cuda_agent.sandbox.client import SandboxClient

        config = AgentConfig.for_episode(
            self.episode, max_turns=request.max_turns, max_context_tokens=request.max_context_tokens
        )
        async with SandboxClient(self.sandbox_url) as sandbox:
            loop = AgentLoop(self.backend, sandbox, self.codec, config)
            runs = [
                loop.run(task, SamplingParams(temperature=1.0, seed=request.seed + i), episode_id)
                for i, (task, episode_id) in enumerate(zip(request.tasks, request.episode_ids, strict=True))
            ]
            return list(await asyncio.gather(*runs))

    # A sender in this process (not the actor ranks) goes through the router, bucket by bucket.
    async def update_weights(self, bucket: NamedTensors) -> None:
        await self.backend.update_weights(bucket)

    async def finish_weight_update(self) -> None:
        await self.backend.finish_weight_update()
