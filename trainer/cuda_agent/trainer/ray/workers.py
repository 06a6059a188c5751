"""Role groups on Ray, offering the same methods as the in-process roles (cuda_agent.trainer.roles).

Each trainer GPU is one placement-group bundle. A group has one Ray actor per bundle; the actor, critic
and reference groups are colocated on the same bundles with fractional GPUs (they run one after another
in a PPO step). Rollout engines get their own placement group of spec.resources.rolloutGpus bundles, or
share the trainer bundles when it is 0; `RayWorkers.rollout_placement` hands that to the rollout
(cuda_agent.trainer.engine_rollout starts its engines there, `ray.engines`).
Data parallelism: the driver cuts each mini-batch into one shard per data-parallel group, balanced by
tokens, and sends every rank the mini-batch's total token count and the micro-batch count all ranks run
(ShardPlan). With sequence parallelism (spec.resources.sequenceParallelSize) ranks r // size form one
group: all of them get the group's shard and each runs one slice of every sequence.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cuda_agent.api.run_contract import TrainerEnv
from cuda_agent.api.trainingrun import TrainingRunSpec
from cuda_agent.rollout.vllm_engine import VLLMEngineConfig
from cuda_agent.storage import join_uri, open_store
from cuda_agent.telemetry import TelemetryConfig, attached, configure_tracing, inject_context, span
from cuda_agent.trainer.experience import Episode, pack_micro_batches
from cuda_agent.trainer.ray.engines import EngineGroup, WeightSender
from cuda_agent.trainer.roles import ShardPlan
from cuda_agent.trainer.weight_sync import NamedTensors, WeightReceiver, sync_weights

# Share of a trainer GPU each colocated role asks Ray for (they sum below 1 so rollout can share too).
GPU_SHARE = {"actor": 0.4, "critic": 0.3, "reference": 0.2}
ROLLOUT_GPU_SHARE = 0.1


class RoleWorker:
    """One rank of a role group: builds the role in its own process and answers method calls."""

    def __init__(self, role: str, spec_json: str, rank: int, world_size: int, master: str, port: int) -> None:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK="0",
            WORLD_SIZE=str(world_size),
            MASTER_ADDR=master,
            MASTER_PORT=str(port),
        )
        from cuda_agent.trainer.roles import PolicyActor, Reference, ValueCritic

        # Traces from this actor process join the driver's: calls carry its context (`trace_context`).
        configure_tracing(TelemetryConfig.from_env(service_name="cuda-agent-trainer"))
        self.role_name, self.rank = role, rank
        spec = TrainingRunSpec.model_validate_json(spec_json)
        self.role: Any = {"actor": PolicyActor, "critic": ValueCritic, "reference": Reference}[role](spec)
        self.sender: WeightSender | None = None

    def ready(self) -> bool:
        return True

    def call(self, method: str, *args: Any, trace_context: dict[str, str] | None = None) -> Any:
        with attached(trace_context), span(f"{self.role_name}.{method}", rank=self.rank):
            return getattr(self.role, method)(*args)

    def save_to(self, uri: str) -> None:
        """Save this rank's state and upload it (ranks of a ZeRO group write disjoint file names)."""
        with tempfile.TemporaryDirectory(prefix="cuda-agent-rank-") as tmp:
            self.role.save(Path(tmp))
            open_store(uri).upload_dir(tmp, uri)

    def load_from(self, uri: str) -> None:
        with tempfile.TemporaryDirectory(prefix="cuda-agent-rank-") as tmp:
            open_store(uri).download_dir(uri, tmp)
            self.role.load(Path(tmp))

    @ray.method(num_returns="streaming", _generator_backpressure_num_objects=2)
    def weight_buckets(self, bucket_bytes: int, keep: bool) -> Iterator[NamedTensors]:
        """The policy's buckets as a stream the driver reads one at a time; every rank runs it (ZeRO-3
        gathers are collective), only the rank that `keep`s yields the tensors, the others empty lists."""
        for bucket in self.role.weight_buckets(bucket_bytes):
            yield [(name, t.detach().to("cpu")) for name, t in bucket] if keep else []

    def push_weights(self, group: EngineGroup, bucket_bytes: int) -> dict[str, float]:
        """Send the policy's weights to the rollout engines from this rank (`ray.engines`)."""
        if self.sender is None or self.sender.group.id != group.id:
            self.sender = WeightSender(group, self.rank)
        return self.sender.send(self.role.weight_buckets(bucket_bytes))


def shard(episodes: Sequence[Episode], indices: Sequence[int], world: int) -> list[list[int]]:
    """Indices split into `world` shards of about equal tokens (longest first onto the lightest shard)."""
    shards: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(indices, key=lambda i: -episodes[i].length):
        k = load.index(min(load))
        shards[k].append(i)
        load[k] += episodes[i].length
    return shards


class RoleGroup:
    """The ranks of one role, called like the in-process role."""

    def __init__(
        self, role: str, spec: TrainingRunSpec, bundles: PlacementGroup, world: int, gpus: bool
    ) -> None:
        self.spec, self.world = spec, world
        self.sp = spec.resources.sequence_parallel_size
        self.dp = world // self.sp  # data-parallel groups; rank r is in group r // sp
        cls = ray.remote(RoleWorker)
        port = _free_port_on_node()
        master = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.workers: list[Any] = [  # Ray actor handles
            cls.options(
                num_cpus=0.25,
                num_gpus=GPU_SHARE[role] if gpus else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    bundles, placement_group_bundle_index=rank
                ),
            ).remote(role, spec.model_dump_json(), rank, world, master, port)
            for rank in range(world)
        ]
        ray.get([w.ready.remote() for w in self.workers])  # surface start-up errors here

    # -- experience: each data-parallel group computes its shard, results come back in order
    def _map(self, method: str, episodes: list[Episode]) -> list[Episode]:
        shards = shard(episodes, range(len(episodes)), self.dp)
        results = ray.get(
            [
                w.call.remote(
                    method, [episodes[i] for i in shards[rank // self.sp]], trace_context=inject_context()
                )
                for rank, w in enumerate(self.workers)
            ]
        )
        out = list(episodes)
        # The ranks of a sequence-parallel group return the same episodes: take each group's first.
        for part, result in zip(shards, results[:: self.sp], strict=True):
            for i, e in zip(part, result, strict=True):
                out[i] = e
        return out

    def compute_logprobs(self, episodes: list[Episode]) -> list[Episode]:
        return self._map("compute_logprobs", episodes)

    def compute_values(self, episodes: list[Episode]) -> list[Episode]:
        return self._map("compute_values", episodes)

    # -- updates: every rank takes part in every optimizer step ------------------------------------
    def _train(
        self, method: str, episodes: list[Episode], mini_batches: list[list[int]], *options: Any
    ) -> dict[str, float]:
        budget = self.spec.trainer.micro_batch_tokens
        per_group: list[tuple[list[Episode], list[list[int]]]] = [([], []) for _ in range(self.dp)]
        tokens, counts = [], []
        for indices in mini_batches:
            parts = shard(episodes, indices, self.dp)
            tokens.append(float(sum(float(episodes[i].mask.sum()) for i in indices)))
            counts.append(
                max(len(pack_micro_batches([episodes[i].length for i in p], budget)) for p in parts)
            )
            for (group_episodes, group_minis), part in zip(per_group, parts, strict=True):
                group_minis.append(list(range(len(group_episodes), len(group_episodes) + len(part))))
                group_episodes.extend(episodes[i] for i in part)
        plan = ShardPlan(tokens, counts, self.dp)
        results: list[dict[str, float]] = ray.get(
            [
                w.call.remote(
                    method, *per_group[rank // self.sp], plan, *options, trace_context=inject_context()
                )
                for rank, w in enumerate(self.workers)
            ]
        )
        return _merge_metrics(results)

    def train_ppo(self, episodes: list[Episode], mini_batches: list[list[int]]) -> dict[str, float]:
        return self._train("train_ppo", episodes, mini_batches)

    def train_nll(
        self, episodes: list[Episode], mini_batches: list[list[int]], *, learning_rate: float | None = None
    ) -> dict[str, float]:
        return self._train("train_nll", episodes, mini_batches, learning_rate)

    def train_values(
        self,
        episodes: list[Episode],
        mini_batches: list[list[int]],
        *,
        learning_rate: float | None = None,
        clip: bool = True,
    ) -> dict[str, float]:
        return self._train("train_values", episodes, mini_batches, learning_rate, clip)

    def update_weights(self, bucket: NamedTensors) -> None:
        """One bucket of weights into every rank (the reference group takes the actor's after RFT)."""
        ray.get([w.call.remote("update_weights", bucket) for w in self.workers])

    def save(self, uri: str) -> None:
        # Ranks may sit on other machines: each saves locally and uploads to the checkpoint's storage.
        ray.get([w.save_to.remote(uri) for w in self.workers])

    def load(self, uri: str) -> None:
        ray.get([w.load_from.remote(uri) for w in self.workers])


def _merge_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """Token-weighted means of the ranks' metrics (gradient norms are already global; every rank of a
    sequence-parallel group reports the group's totals)."""
    weights = [r.get("policy_tokens", 1.0) for r in results]
    total = sum(weights) or 1.0
    keys = set().union(*results)
    return {k: sum(r.get(k, 0.0) * w for r, w in zip(results, weights, strict=True)) / total for k in keys}


def rollout_engine_configs(spec: TrainingRunSpec, model_dir: str, **fields: Any) -> list[VLLMEngineConfig]:
    """One vLLM engine per spec.resources.tensorParallelSize rollout GPUs (the trainer's when rolloutGpus
    is 0), each with that tensor-parallel size, the agent's context and the trainer's dtype; `fields` set
    more (the weight transfer backend); RayWorkers.rollout_placement says where they go."""
    r = spec.resources
    return [
        VLLMEngineConfig(
            model=model_dir,
            dtype={"bf16": "bfloat16", "fp32": "float32"}[spec.trainer.precision],
            tensor_parallel_size=r.tensor_parallel_size,
            max_model_len=spec.agent.max_context_tokens,
            seed=spec.trainer.seed + engine,
            **fields,
        )
        for engine in range((r.rollout_gpus or r.trainer_gpus) // r.tensor_parallel_size)
    ]


def _free_port_on_node() -> int:
    from cuda_agent.localhost import free_port

    return free_port()


@dataclass
class RayWorkers:
    """The Workers of the driver (cuda_agent.trainer.driver) on a Ray cluster."""

    actor: RoleGroup
    critic: RoleGroup
    reference: RoleGroup | None
    train_gpus: int
    bucket_bytes: int
    trainer_bundles: PlacementGroup
    rollout_bundles: PlacementGroup | None
    gpus: bool = False  # the Ray cluster has GPUs (else every rank and engine is a CPU process)

    @classmethod
    def build(cls, spec: TrainingRunSpec, env: TrainerEnv, num_cpus: int | None = None) -> RayWorkers:
        if not ray.is_initialized():
            ray.init(address=env.ray_address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=True)
        gpus = bool(ray.cluster_resources().get("GPU", 0))  # type: ignore[no-untyped-call]
        r = spec.resources
        world = r.trainer_gpus  # without GPUs each rank is a CPU process (gloo), as in tests
        if world > 1 and spec.trainer.engine != "deepspeed":
            raise ValueError(
                "spec.trainer.engine torch runs on one device; use deepspeed for trainerGpus > 1"
            )
        bundle = {"CPU": 1.0, "GPU": 1.0} if gpus else {"CPU": 1.0}
        trainer_bundles = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
        ray.get(trainer_bundles.ready())
        rollout_bundles = None
        if gpus and r.rollout_gpus > 0:
            rollout_bundles = placement_group([dict(bundle) for _ in range(r.rollout_gpus)], strategy="PACK")
            ray.get(rollout_bundles.ready())
        reference = None
        if spec.algorithm.kl_coef > 0:
            reference = RoleGroup("reference", spec, trainer_bundles, world, gpus)
        return cls(
            actor=RoleGroup("actor", spec, trainer_bundles, world, gpus),
            critic=RoleGroup("critic", spec, trainer_bundles, world, gpus),
            reference=reference,
            train_gpus=world,
            bucket_bytes=spec.trainer.weight_sync_bucket_mb << 20,
            trainer_bundles=trainer_bundles,
            rollout_bundles=rollout_bundles,
            gpus=gpus,
        )

    def rollout_placement(self) -> tuple[PlacementGroup, float]:
        """Where rollout engines go: their own bundles (a whole GPU each), or the trainer's (a share)."""
        if self.rollout_bundles is not None:
            return self.rollout_bundles, 1.0
        return self.trainer_bundles, ROLLOUT_GPU_SHARE

    def shutdown(self) -> None:
        """Stop the role actors and give the bundles back (the engines placed on them stop with them)."""
        for group in (self.actor, self.critic, self.reference):
            for worker in group.workers if group is not None else []:
                ray.kill(worker)
        for bundles in (self.trainer_bundles, self.rollout_bundles):
            if bundles is not None:
                remove_placement_group(bundles)

    def save(self, root: Path, uri: str) -> None:
        self.actor.save(join_uri(uri, "actor") + "/")
        self.critic.save(join_uri(uri, "critic") + "/")
        if self.reference is not None:
            self.reference.save(join_uri(uri, "reference") + "/")

    def load(self, root: Path, uri: str) -> None:
        self.actor.load(join_uri(uri, "actor") + "/")
        self.critic.load(join_uri(uri, "critic") + "/")
        if self.reference is not None:
            self.reference.load(join_uri(uri, "reference") + "/")

    def reset_reference(self) -> None:
        """The reference group takes the actor's weights, bucket by bucket through the driver."""
        if self.reference is not None:
            sync_weights(self._streamed_buckets(), self.reference)

    def sync_weights(self, receiver: WeightReceiver) -> dict[str, float]:
        """The actor's weights into the rollout. Engines on Ray (a rollout with `engine_group`) get them
        from the actor ranks directly; any other receiver (in this process) bucket by bucket through
        the driver, which holds one bucket at a time."""
        group: EngineGroup | None = getattr(receiver, "engine_group", None)
        if group is not None:
            started = time.perf_counter()
            results = ray.get([w.push_weights.remote(group, self.bucket_bytes) for w in self.actor.workers])
            return {**results[0], "weight_sync_s": time.perf_counter() - started}
        return sync_weights(self._streamed_buckets(), receiver)

    def _streamed_buckets(self) -> Iterator[NamedTensors]:
        streams = [
            w.weight_buckets.remote(self.bucket_bytes, rank == 0) for rank, w in enumerate(self.actor.workers)
        ]
        for refs in zip(*streams, strict=True):  # ranks in step: their gathers are collective
            yield ray.get(list(refs))[0]  # the other ranks' items are empty: a failure there surfaces too
