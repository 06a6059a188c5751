"""The rollout of a GPU cluster, here on CPU: the agent loop over engine actors placed on the roles'
placement group, driven step after step on the trainer's one event loop, against a real sandbox server
(fake judge). The engines are transformers engines (vLLM cannot be installed in this venv; it runs on CPU
in tests/rollout/test_vllm_cpu.py); everything else is what `cuda-agent train` runs with vLLM: RayWorkers
on a local Ray cluster (127.0.0.1), `EngineRollout`, the router, the weight sync from the actor rank."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import EXAMPLES
from fixtures.ray_start import init_ray
from sandbox_helpers import RunningServer
from transformers import AutoModelForCausalLM

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.hf import TransformersBackend
from cuda_agent.trainer.data import load_tasks
from cuda_agent.trainer.event_loop import run_async
from cuda_agent.trainer.models import load_pretrained
from cuda_agent.trainer.rollout import RolloutRequest, agent_rollout

CONTEXT = 4608  # SmolLM2's chat template with SKILL.md, model.py and the tool schemas: ~3,500 tokens


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    started = not ray.is_initialized()
    if started:
        init_ray(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()


def test_engine_rollout_runs_episodes_on_engine_actors_across_steps(
    ray_local: Any, sandbox_server: RunningServer, tokenizer: Any, tiny_model: Any, tmp_path: Path
) -> None:
    from cuda_agent.trainer.engine_rollout import EngineRollout, engines_unavailable
    from cuda_agent.trainer.ray.workers import RayWorkers

    policy = tmp_path / "policy"
    tiny_model.save_pretrained(policy)
    tokenizer.save_pretrained(policy)
    run = TrainingRun.model_validate(
        {
            "apiVersion": "cuda-agent.io/v1alpha1",
            "kind": "TrainingRun",
            "metadata": {"name": "engines"},
            "spec": {
                # The actor starts from a seeded random init, the engine from the weights on disk: only
                # the rollout's first sync makes them equal.
                "model": {"base": str(policy), "randomInit": True},
                "dataset": {"uri": str(EXAMPLES / "tasks")},
                "sandboxPoolRef": {"name": "pool"},
                "agent": {"maxContextTokens": CONTEXT},
                "warmup": {"singleTurnPpo": {"maxContextTokens": CONTEXT}},
                "resources": {"trainerGpus": 1, "rolloutGpus": 0},
                "trainer": {"engine": "torch", "precision": "fp32", "useRay": True, "seed": 7},
            },
        }
    )
    env = TrainerEnv(run_name="engines", sandbox_url=sandbox_server.url)
    workers = RayWorkers.build(run.spec, env)
    try:
        # No GPUs here: the default factory keeps the in-process rollout and says why.
        assert engines_unavailable(workers) == "the Ray cluster has no GPUs"
        assert type(agent_rollout(run, env, workers)).__name__ == "AgentRollout"

        rollout = EngineRollout(run, env, workers, engine="transformers")
        assert rollout.description == (
            "transformers on Ray: 1 engine (tensor parallel 1) on CPUs; weight sync object_store"
        )
        tasks = load_tasks(str(EXAMPLES / "tasks"))[:2]
        for step in range(2):  # two steps on one event loop: the router and its engines live on
            request = RolloutRequest(
                stage="ppo",
                step=step,
                tasks=tasks,
                episode_ids=[f"ppo-{step}-{i}" for i in range(len(tasks))],
                max_turns=2,
                max_context_tokens=CONTEXT,
                seed=100 * step,
            )
            trajectories = run_async(rollout.generate(request))
            assert [t.episode_id for t in trajectories] == request.episode_ids
            for t in trajectories:
                assert t.end not in ("sandbox_error", "generation_error"), (t.end, t.error)
                assert t.token_exact and sum(t.loss_mask) > 0
            assert not rollout.backend.sessions or sum(rollout.backend.sessions) == 0  # released

        # The engine holds the actor's weights (its seeded init), not the ones it read from disk.
        actor_policy = load_pretrained(
            AutoModelForCausalLM, run.spec.model, run.spec.model.base, run.spec.trainer
        )
        prompt, sampling = list(range(100, 140)), SamplingParams(temperature=1.0, max_tokens=5, seed=3)
        engine = rollout.engine_group.engines[0]
        ids, logprobs, _ = ray_local.get(engine.generate.remote(prompt, sampling, None))
        stop = list(rollout.codec.stop_token_ids)
        want = run_async(TransformersBackend(actor_policy.eval(), stop).generate(prompt, sampling))
        on_disk = run_async(TransformersBackend(tiny_model, stop).generate(prompt, sampling))
        assert ids == want.token_ids
        assert max(abs(a - b) for a, b in zip(logprobs, want.logprobs, strict=True)) < 1e-4
        assert max(abs(a - b) for a, b in zip(on_disk.logprobs, want.logprobs, strict=False)) > 1e-3
    finally:
        workers.shutdown()
