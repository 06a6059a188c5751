"""The weight sync into rollout engines, and after a resume.

On Ray (CPU processes in placement-group bundles, 127.0.0.1): two ZeRO-2 actor ranks take a PPO step and
send their weights straight to engine actors, bucket by bucket, with nothing passing through the driver.
The engines are a real transformers engine placed on the trainer's bundles (what the rollout starts where
vLLM is missing) and a recording stand-in for a vLLM engine's weight hooks (vLLM cannot be installed in
this venv; tests/rollout/test_vllm_cpu.py runs the real engine): every tensor arrives with its name, shape
and value, the update is finished once, and the real engine's log-probs are the synced policy's.

Resume: a trainer that starts from a finished run's checkpoint syncs the restored policy into the
rollout before anything else, so the rollout holds the actor's weights, not the base model's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from scripted_rollout import ScriptedRollout
from test_ppo_step import make_trajectories
from transformers import AutoModelForCausalLM

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingRun
from cuda_agent.rollout import SamplingParams
from cuda_agent.rollout.hf import TransformersBackend
from cuda_agent.runstatus import FileStatusWriter
from cuda_agent.trainer.checkpoint import CheckpointStore
from cuda_agent.trainer.data import TaskOrder, load_tasks
from cuda_agent.trainer.driver import Trainer
from cuda_agent.trainer.event_loop import run_async
from cuda_agent.trainer.models import Policy
from cuda_agent.trainer.step import ppo_step
from cuda_agent.trainer.weight_sync import NamedTensors, load_bucket
from cuda_agent.trainer.workers import LocalWorkers

REPO = Path(__file__).resolve().parents[2]
EOS = 63  # the tiny model's last token id


class RecordingEngine:
    """A stand-in for a rollout engine's weight hooks as the actor ranks call them on CPU engines
    (`update_weights` per bucket, then `finish_weight_update`): keeps every tensor it was sent."""

    def __init__(self) -> None:
        self.staged: dict[str, torch.Tensor] = {}
        self.applied: dict[str, torch.Tensor] = {}
        self.buckets = 0
        self.finished = 0

    def ready(self) -> bool:
        return True

    def update_weights(self, bucket: NamedTensors) -> None:
        for name, tensor in bucket:
            assert name not in self.staged, f"{name} sent twice in one update"
            self.staged[name] = tensor.clone()
        self.buckets += 1

    def finish_weight_update(self) -> None:
        self.applied, self.staged = self.staged, {}
        self.finished += 1

    def received(self) -> tuple[dict[str, torch.Tensor], int, int]:
        return self.applied, self.buckets, self.finished


class ThroughDriver:
    """An in-process receiver (the path of a rollout that lives in the driver)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.buckets = 0

    def update_weights(self, bucket: NamedTensors) -> None:
        self.buckets += 1
        self.tensors.update(bucket)


class Engines:
    """A sync target whose engines run as Ray actors: RayWorkers sends from the actor ranks."""

    def __init__(self, group: Any) -> None:
        self.engine_group = group


def test_actor_ranks_send_every_tensor_to_the_engines(
    ray_cluster: Any, run_document: Callable[..., dict[str, Any]], tiny_model_dir: Path
) -> None:
    from cuda_agent.trainer.ray.engines import EngineGroup, start_engines
    from cuda_agent.trainer.ray.workers import RayWorkers, rollout_engine_configs

    doc = run_document(
        algorithm={"klCoef": 0.0},
        resources={"trainerGpus": 2, "rolloutGpus": 0},
        trainer={"engine": "deepspeed", "zeroStage": 2, "useRay": True},
    )
    spec = TrainingRun.model_validate(doc).spec
    workers = RayWorkers.build(spec, TrainerEnv(run_name="t"))
    try:
        ppo_step(
            make_trajectories(4, seed=3), workers.actor, workers.critic, None, spec, step_seed=0, train_gpus=2
        )
        workers.bucket_bytes = 8 << 10  # several buckets for the tiny model (the spec's minimum is 1 MB)
        placement, share = workers.rollout_placement()
        real = start_engines(
            rollout_engine_configs(spec, spec.model.base),
            placement,
            share,
            workers.gpus,
            "transformers",
            [EOS],
        )
        assert len(real) == 2  # one per trainer GPU (colocated, tensor parallel 1)
        # Ray workers cannot import this test module: the stand-in's class travels by value.
        ray_cluster.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        recording = ray_cluster.remote(RecordingEngine).options(num_cpus=0).remote()
        timings = workers.sync_weights(Engines(EngineGroup([recording, *real], "object_store")))

        reference = ThroughDriver()
        workers.sync_weights(reference)  # streamed from rank 0 through the driver, bucket by bucket
        got, buckets, finished = ray_cluster.get(recording.received.remote())
        assert finished == 1 and buckets == reference.buckets == timings["weight_sync_buckets"] > 2
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        base_params = dict(base.named_parameters())
        assert set(got) == set(reference.tensors) == set(base_params)
        for name, tensor in got.items():
            assert tensor.shape == base_params[name].shape, name
            assert torch.equal(tensor, reference.tensors[name]), name
        assert any(not torch.equal(got[n], base_params[n].detach()) for n in got), "the step changed nothing"

        # The real engines took the same weights: their log-probs are the synced policy's, not the base's.
        prompt, greedy = list(range(3, 20)), SamplingParams(temperature=1.0, max_tokens=6, seed=1)
        synced = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        load_bucket(synced, list(got.items()))
        want = run_async(TransformersBackend(synced, [EOS]).generate(prompt, greedy))
        old = run_async(TransformersBackend(base, [EOS]).generate(prompt, greedy))
        for engine in real:
            ids, logprobs, _ = ray_cluster.get(engine.generate.remote(prompt, greedy, None))
            assert ids == want.token_ids
            assert max(abs(a - b) for a, b in zip(logprobs, want.logprobs, strict=True)) < 1e-5
        assert max(abs(a - b) for a, b in zip(old.logprobs, want.logprobs, strict=False)) > 1e-4
    finally:
        workers.shutdown()


class PolicyCopyRollout(ScriptedRollout):
    """Scripted episodes (the tiny model has no chat template) plus an in-process copy of the policy that
    takes the weight sync as a staged receiver: buckets are held until `finish_weight_update`."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__()
        self.model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.staged: NamedTensors = []
        self.updates = 0

    async def update_weights(self, bucket: NamedTensors) -> None:  # type: ignore[override]
        super().update_weights(bucket)
        self.staged += bucket

    async def finish_weight_update(self) -> None:
        load_bucket(self.model, self.staged)
        self.staged, self.updates = [], self.updates + 1


def test_resume_syncs_the_restored_policy_into_the_rollout(
    run_document: Callable[..., dict[str, Any]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    run = TrainingRun.model_validate(
        run_document(
            dataset={"uri": str(REPO / "examples" / "tasks")},
            algorithm={"steps": 2},
            warmup={
                "singleTurnPpo": {"enabled": False},
                "rft": {"enabled": False},
                "valuePretraining": {"enabled": False},
            },
        )
    )

    def trainer(rollout: PolicyCopyRollout) -> Trainer:
        return Trainer(
            run=run,
            rollout=rollout,
            workers=LocalWorkers.build(run.spec),
            status=FileStatusWriter(str(tmp_path / "status.jsonl")),
            checkpoints=CheckpointStore(str(tmp_path / "ckpt"), keep=2),
            order=TaskOrder(load_tasks(run.spec.dataset.uri), run.spec.trainer.seed),
        )

    first = PolicyCopyRollout(tiny_model_dir)
    finished = trainer(first)
    finished.train()
    assert first.updates == 2  # after each PPO step

    fresh = PolicyCopyRollout(tiny_model_dir)  # base weights, as rollout engines start
    resumed = trainer(fresh)
    resumed.train()  # nothing left to train: the resume's sync is the only one
    assert fresh.updates == 1 and not fresh.requests
    workers = resumed.workers
    assert isinstance(workers, LocalWorkers) and isinstance(workers.actor.module, Policy)
    actor = dict(workers.actor.module.hf_named_parameters())
    rollout_params = dict(fresh.model.named_parameters())
    base_params = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    assert set(actor) == set(rollout_params)
    for name, param in actor.items():
        assert torch.equal(rollout_params[name].detach(), param.detach()), name
        assert torch.equal(rollout_params[name].detach(), first.model.get_parameter(name).detach()), name
    assert any(not torch.equal(base_params[n], rollout_params[n]) for n in actor)
