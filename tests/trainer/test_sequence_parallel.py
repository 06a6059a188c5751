"""Ulysses sequence parallelism (`spec.resources.sequenceParallelSize`) equals one rank holding whole
sequences: two CPU processes (gloo on 127.0.0.1, the tiny random-init Qwen2 of conftest.py with 4 query
and 2 key/value heads) each feed one half of every sequence.

1. One micro-batch of three padded episodes of odd lengths: the clip-higher policy loss and the clipped
   value loss, token means over the batch, and every parameter gradient of policy and critic (each
   rank's gradients summed over the group) equal the single-rank ones.
2. One whole PPO step through the roles (`ppo_step`: actor, critic and reference, DeepSpeed ZeRO-3
   partitioned over both ranks, sequence-parallel group of 2, data-parallel size 1) ends with the same
   weights and metrics as the plain-torch single-rank roles.

Tolerances: everything is fp32. The sharded run adds the same terms in another order (per-slice matmuls,
attention over a sequence padded to even length, gradients summed over two ranks), which moves results
by float32 rounding, ~1e-7 relative. rtol 1e-4 / atol 1e-6 (as test_ppo_step's ZeRO comparisons) allows
that and nothing more: a wrong position id, a missed all-to-all (attention over half the sequence) or a
loss counted on both ranks changes losses and gradients at the 1e-2..1 level.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures.ray_start import init_ray
from test_ppo_step import full_params, make_trajectories
from torch import nn
from torch.multiprocessing.spawn import start_processes

from cuda_agent.api.trainingrun import TrainingRun, TrainingRunSpec
from cuda_agent.localhost import free_port
from cuda_agent.trainer import ppo
from cuda_agent.trainer.experience import collate, episode_from_trajectory, gather
from cuda_agent.trainer.models import Policy, build_critic, build_policy
from cuda_agent.trainer.roles import PolicyActor, Reference, ValueCritic
from cuda_agent.trainer.sequence_parallel import (
    SequenceLayout,
    SequenceParallel,
    WholeSequence,
    check_heads,
    sequence_layout,
)
from cuda_agent.trainer.step import ppo_step

METRICS = (
    "policy_loss",
    "clip_fraction",
    "approx_kl",
    "actor_grad_norm",
    "value_loss",
    "critic_grad_norm",
    "kl",
    "explained_variance",
    "entropy",
    "rollout_logprob_gap",
)


def micro_batch_gradients(spec: TrainingRunSpec, layout: SequenceLayout) -> dict[str, torch.Tensor]:
    """Losses and parameter gradients of one micro-batch on this rank (its slice under `layout`)."""
    policy, critic = build_policy(spec.model, spec.trainer), build_critic(spec.model, spec.trainer)
    layout.install(policy)
    layout.install(critic)
    episodes = [episode_from_trajectory(t) for t in make_trajectories(3, seed=4)]
    generator = torch.Generator().manual_seed(3)
    for e in episodes:  # old log-probs near the policy's own (ratios around 1, some clipped)
        n = e.length - 1
        e.old_logprobs = -4.16 + 0.2 * torch.randn(n, generator=generator)
        e.advantages = torch.randn(n, generator=generator) * e.mask
        e.values = 0.1 * torch.randn(n, generator=generator)
        e.returns = torch.randn(n, generator=generator) * e.mask
    batch = collate(episodes, [0, 1, 2], torch.device("cpu"))
    assert batch.attention_mask is not None and batch.input_ids.shape[1] == 27  # padded, odd length
    total = float(batch.mask.sum())
    x, local = layout.inputs(batch), layout.local
    mask = local(batch.mask)
    logp, _ = policy(x.input_ids, x.attention_mask, x.position_ids, x.targets)
    old, advantages = (local(gather(episodes, batch, n)) for n in ("old_logprobs", "advantages"))
    policy_loss = ppo.policy_loss(logp, old, advantages, mask, 0.2, 0.28).loss_sum / total
    values = layout.action_values(critic(x.input_ids, x.attention_mask, x.position_ids))
    old_values, returns = (local(gather(episodes, batch, n)) for n in ("values", "returns"))
    value_loss = ppo.value_loss(values, old_values, returns, mask, 0.2)[0] / total
    (policy_loss + value_loss).backward()  # type: ignore[no-untyped-call]
    out = {f"policy.{n}": p.grad for n, p in policy.named_parameters() if p.grad is not None}
    out.update({f"critic.{n}": p.grad for n, p in critic.named_parameters() if p.grad is not None})
    out["loss.policy"], out["loss.value"] = policy_loss.detach(), value_loss.detach()
    return out


def roles_step(spec: TrainingRunSpec) -> tuple[dict[str, float], nn.Module, nn.Module]:
    cpu = torch.device("cpu")
    actor, critic = PolicyActor(spec, cpu), ValueCritic(spec, cpu)
    metrics = ppo_step(make_trajectories(4, seed=5), actor, critic, Reference(spec, cpu), spec, step_seed=0)
    return metrics, actor.module, critic.engine.module


def _rank_main(rank: int, port: int, spec_json: str, out: str) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    spec = TrainingRunSpec.model_validate_json(spec_json)
    layout = sequence_layout(spec)  # the spec selects the path
    assert isinstance(layout, SequenceParallel) and (layout.size, layout.rank) == (2, rank)
    grads = micro_batch_gradients(spec, layout)
    for tensor in grads.values():
        torch.distributed.all_reduce(tensor, group=layout.group)

    metrics, actor, critic = roles_step(spec)
    assert isinstance(actor, Policy) and actor.lm.config._attn_implementation == "cuda_agent_ulysses_sdpa"
    import deepspeed

    params = [*actor.parameters(), *critic.parameters()]
    assert all(getattr(p, "ds_numel", 0) for p in params)  # ZeRO-3 partitioned them over both ranks
    with deepspeed.zero.GatheredParameters(params):
        weights = {"policy": full_params(actor), "critic": full_params(critic)}
    if rank == 0:
        torch.save({"grads": grads, "metrics": metrics, **weights}, out)


@pytest.fixture(scope="module")
def specs(run_document: Callable[..., dict[str, Any]]) -> tuple[TrainingRunSpec, TrainingRunSpec]:
    single = TrainingRun.model_validate(run_document()).spec
    sequence_parallel = TrainingRun.model_validate(
        run_document(
            resources={"trainerGpus": 2, "sequenceParallelSize": 2},
            trainer={"engine": "deepspeed", "zeroStage": 3},
        )
    ).spec
    return single, sequence_parallel


def test_two_rank_sequence_parallel_equals_single_rank(
    specs: tuple[TrainingRunSpec, TrainingRunSpec], tmp_path: Path
) -> None:
    single, sequence_parallel = specs
    out = tmp_path / "rank0.pt"
    ranks = start_processes(  # type: ignore[no-untyped-call]
        _rank_main,
        args=(free_port(), sequence_parallel.model_dump_json(), str(out)),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    # The single-rank results are computed while the ranks start.
    assert isinstance(sequence_layout(single), WholeSequence)
    want_grads = micro_batch_gradients(single, WholeSequence())
    want_metrics, want_policy, want_critic = roles_step(single)
    while not ranks.join():
        pass
    got = torch.load(out, weights_only=False)

    assert set(got["grads"]) == set(want_grads)
    for name, want in want_grads.items():
        torch.testing.assert_close(got["grads"][name], want, rtol=1e-4, atol=1e-6, msg=name)
    assert float(want_grads["loss.policy"].abs()) > 1e-3 and float(want_grads["loss.value"]) > 1e-3

    for got_weights, module in ((got["policy"], want_policy), (got["critic"], want_critic)):
        for name, value in full_params(module).items():
            torch.testing.assert_close(got_weights[name], value, rtol=1e-4, atol=1e-6, msg=name)
    for key in METRICS:
        assert got["metrics"][key] == pytest.approx(want_metrics[key], rel=1e-4, abs=1e-6), key


def test_bad_sequence_parallel_size_is_rejected_naming_the_field(
    run_document: Callable[..., dict[str, Any]],
) -> None:
    from pydantic import ValidationError
    from transformers import Qwen2Config

    with pytest.raises(ValidationError, match="sequenceParallelSize"):
        TrainingRun.model_validate(run_document(resources={"trainerGpus": 3, "sequenceParallelSize": 2}))
    with pytest.raises(
        ValueError, match=r"spec.resources.sequenceParallelSize = 3 must divide .* 4 attention"
    ):
        check_heads(Qwen2Config(num_attention_heads=4, num_key_value_heads=2, hidden_size=32), 3)
    with pytest.raises(ValueError, match=r"sequenceParallelSize = 2 must divide .* 3 key/value heads"):
        check_heads(Qwen2Config(num_attention_heads=6, num_key_value_heads=3, hidden_size=36), 2)
    check_heads(Qwen2Config(num_attention_heads=4, num_key_value_heads=1, hidden_size=32), 4)  # replicated
    plain = TrainingRun.model_validate(
        run_document(resources={"trainerGpus": 2, "sequenceParallelSize": 2})
    ).spec
    with pytest.raises(ValueError, match=r"sequenceParallelSize = 2 needs spec.trainer.engine: deepspeed"):
        sequence_layout(plain)
    deepspeed_spec = plain.model_copy(
        update={"trainer": plain.trainer.model_copy(update={"engine": "deepspeed"})}
    )
    with pytest.raises(ValueError, match=r"sequenceParallelSize = 2 must divide the trainer's 1 processes"):
        sequence_layout(deepspeed_spec)  # this test process is a world of one


def test_rollout_engines_take_the_tensor_parallel_size(run_document: Callable[..., dict[str, Any]]) -> None:
    """vLLM cannot run here: only the configuration the engines would be started with is checked."""
    from cuda_agent.trainer.ray.workers import rollout_engine_configs

    spec = TrainingRun.model_validate(
        run_document(resources={"trainerGpus": 2, "rolloutGpus": 4, "tensorParallelSize": 2})
    ).spec
    configs = rollout_engine_configs(spec, "/models/policy")
    assert [c.tensor_parallel_size for c in configs] == [2, 2]
    assert {c.max_model_len for c in configs} == {spec.agent.max_context_tokens}
    assert len({c.seed for c in configs}) == 2
    shared = spec.model_copy(update={"resources": spec.resources.model_copy(update={"rollout_gpus": 0})})
    assert len(rollout_engine_configs(shared, "/models/policy")) == 1  # the 2 trainer GPUs, TP 2


@pytest.mark.skipif(
    os.environ.get("CUDA_AGENT_RAY_SP_CHECK") != "1",
    reason="12 Ray actor processes, ~1-2 min on 2 cores: run by hand with CUDA_AGENT_RAY_SP_CHECK=1",
)
def test_ray_groups_data_and_sequence_parallel_equal_one_local_rank(
    run_document: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    """Four Ray ranks (data-parallel 2 x sequence-parallel 2, ZeRO-3): the driver sends each group its
    shard, the PPO step, the weight sync, a checkpoint round trip and a second step equal one local rank."""
    import ray

    from cuda_agent.api.run_contract import TrainerEnv
    from cuda_agent.trainer.ray.workers import RayWorkers
    from cuda_agent.trainer.workers import LocalWorkers

    assert not ray.is_initialized(), "run alone: this test starts its own 4-CPU cluster"
    init_ray(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        local_spec = TrainingRun.model_validate(run_document(trainer={"weightSyncBucketMb": 1})).spec
        ray_spec = TrainingRun.model_validate(
            run_document(
                resources={"trainerGpus": 4, "sequenceParallelSize": 2, "rolloutGpus": 0},
                trainer={"engine": "deepspeed", "zeroStage": 3, "useRay": True, "weightSyncBucketMb": 1},
            )
        ).spec
        local = LocalWorkers.build(local_spec)
        workers = RayWorkers.build(ray_spec, TrainerEnv(run_name="t"))

        class Collect:
            def __init__(self) -> None:
                self.tensors: dict[str, torch.Tensor] = {}

            def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
                self.tensors.update(bucket)

        for step, seed in ((0, 3), (1, 4)):
            trajectories = make_trajectories(6, seed=seed)
            want = ppo_step(trajectories, local.actor, local.critic, local.reference, local_spec, step)
            got = ppo_step(trajectories, workers.actor, workers.critic, workers.reference, ray_spec, step, 4)
            for key in ("value_loss", "actor_grad_norm", "critic_grad_norm", "explained_variance", "entropy"):
                assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
            received = Collect()
            workers.sync_weights(received)
            policy = local.actor.module
            assert isinstance(policy, Policy)
            for name, value in policy.lm.named_parameters():
                torch.testing.assert_close(received.tensors[name], value.detach(), rtol=1e-4, atol=1e-6)
            if step == 0:  # a checkpoint round trip between the steps
                uri = str(tmp_path / "ckpt-000000")
                workers.save(tmp_path, uri)
                workers.load(tmp_path, uri)
    finally:
        ray.shutdown()
