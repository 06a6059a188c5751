"""The roles as Ray actor groups: two data-parallel ranks (DeepSpeed ZeRO-2 over gloo, CPU processes in
placement-group bundles) take the same PPO step as one in-process actor, the weight sync carries the
result back in buckets, and each rank's checkpoint shard goes to storage and comes back."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from test_ppo_step import make_trajectories

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.trainer.models import Policy
from cuda_agent.trainer.step import ppo_step
from cuda_agent.trainer.workers import LocalWorkers


class Collect:
    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.buckets = 0

    def update_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        self.buckets += 1
        self.tensors.update(bucket)


def test_data_parallel_ray_groups_equal_one_local_actor(
    ray_cluster: Any, run_document: Callable[..., dict[str, Any]], tmp_path: Path
) -> None:
    from cuda_agent.trainer.ray.workers import RayWorkers

    doc = run_document(
        algorithm={"klCoef": 0.0},
        resources={"trainerGpus": 2, "rolloutGpus": 0},
        trainer={"weightSyncBucketMb": 1},
    )
    local_spec = TrainingRun.model_validate(doc).spec
    ray_doc = copy.deepcopy(doc)
    ray_doc["spec"]["trainer"].update(engine="deepspeed", zeroStage=2, useRay=True)
    ray_spec = TrainingRun.model_validate(ray_doc).spec

    trajectories = make_trajectories(6, seed=3)
    local = LocalWorkers.build(local_spec)
    local_metrics = ppo_step(trajectories, local.actor, local.critic, None, local_spec, step_seed=0)

    workers = RayWorkers.build(ray_spec, TrainerEnv(run_name="t"))
    assert workers.train_gpus == 2 and len(workers.actor.workers) == 2
    ray_metrics = ppo_step(
        trajectories, workers.actor, workers.critic, None, ray_spec, step_seed=0, train_gpus=2
    )

    received = Collect()
    sync = workers.sync_weights(received)
    assert received.buckets >= 1 and sync["weight_sync_s"] > 0
    policy = local.actor.module
    assert isinstance(policy, Policy)
    want = dict(policy.lm.named_parameters())
    assert set(received.tensors) == set(want)
    for name, tensor in received.tensors.items():
        torch.testing.assert_close(tensor, want[name].detach(), rtol=1e-4, atol=1e-6, msg=name)
    for key in ("value_loss", "explained_variance", "reward", "actor_grad_norm"):
        assert abs(ray_metrics[key] - local_metrics[key]) < 1e-4, key

    # Each rank saves its ZeRO shard and uploads it to the checkpoint; loading restores the same weights.
    uri = str(tmp_path / "ckpt-000000")
    workers.save(tmp_path / "unused", uri)
    shards = sorted(p.name for p in (tmp_path / "ckpt-000000" / "actor" / "state").glob("*optim_states.pt"))
    assert len(shards) == 2, shards  # one optimizer shard per rank
    workers.load(tmp_path / "unused", uri)
    reloaded = Collect()
    workers.sync_weights(reloaded)
    for name, tensor in reloaded.tensors.items():
        assert torch.equal(tensor, received.tensors[name]), name
