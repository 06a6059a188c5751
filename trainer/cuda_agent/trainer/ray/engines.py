"""Rollout engines as Ray actors, and the weights' way from the actor ranks to them.

Engines are placed by the roles' placement groups (`RayWorkers.rollout_placement`): on their own bundles
(spec.resources.rolloutGpus > 0, a whole GPU each) or colocated on the trainer's bundles with a share of
each GPU. One engine per tensor-parallel group of bundles, from `rollout_engine_configs`.

A weight sync goes from the actor ranks straight to the engines; the driver only starts it and gets the
timings back. Every rank iterates its buckets (ZeRO-3 gathers are collective), one bucket at a time, and
the next bucket is gathered only after every engine has loaded the previous one. How a bucket travels:

- `cuda_ipc` (engines colocated on the actor's GPUs): vLLM's IPC weight transfer
  (`IPCWeightTransferEngine.trainer_send_weights`): each rank exports CUDA IPC handles of the bucket on its
  GPU, rank 0 sends all handles and each engine worker opens the one of its own GPU; nothing is copied.
- `nccl` (engines on their own GPUs): vLLM's NCCL weight transfer: one NCCL group of actor rank 0 and every
  engine worker, made on the first sync and kept; rank 0 sends each bucket's names, dtypes and shapes to
  the engines and broadcasts the tensors.
- `object_store` (engines without GPUs: CPU clusters, tests): rank 0 puts the bucket (on the CPU) into
  Ray's object store once and every engine's `update_weights` takes it from there.

The first two use vLLM's own entry points (`init_weight_transfer_engine`, `start_weight_update`,
`update_weights`, `finish_weight_update`; `VLLMEngineConfig.weight_transfer` turns them on in the engine).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import ray
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cuda_agent.rollout.hf import TransformersEngine
from cuda_agent.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig
from cuda_agent.trainer.models import local_model_dir
from cuda_agent.trainer.weight_sync import NamedTensors, sync_timings

WeightTransport = Literal["cuda_ipc", "nccl", "object_store"]
EngineKind = Literal["vllm", "transformers"]


def weight_transport(gpus: bool, colocated: bool) -> WeightTransport:
    if not gpus:
        return "object_store"
    return "cuda_ipc" if colocated else "nccl"


@dataclass(frozen=True)
class EngineGroup:
    """What the actor ranks need to send weights to the engines (pickled into each rank's call)."""

    engines: list[Any]  # Ray actor handles
    transport: WeightTransport
    workers_per_engine: int = 1  # an engine's tensor-parallel size: its ranks in the NCCL group
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


class VLLMPolicyEngine(VLLMEngine):
    """A VLLMEngine that resolves the policy's URI on its own node (an s3:// model is downloaded there)."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        super().__init__(config.model_copy(update={"model": str(local_model_dir(config.model))}))

    def ready(self) -> bool:
        return True


class TransformersPolicyEngine(TransformersEngine):
    """The transformers engine with the same start-up (Ray clusters without vLLM, and the tests)."""

    def __init__(self, config: VLLMEngineConfig, eos_token_ids: list[int]) -> None:
        super().__init__(str(local_model_dir(config.model)), eos_token_ids, dtype=config.dtype)

    def ready(self) -> bool:
        return True

    async def finish_weight_update(self) -> None:
        return None  # each bucket is copied into the model as it arrives


def start_engines(
    configs: list[VLLMEngineConfig],
    placement: PlacementGroup,
    gpu_share: float,
    gpus: bool,
    kind: EngineKind = "vllm",
    eos_token_ids: list[int] | None = None,
) -> list[Any]:
    """One engine actor per config on bundle `i * tensorParallelSize` of `placement`; the handles once
    every engine has started (a start-up error surfaces here)."""
    engines: list[Any] = []
    for i, config in enumerate(configs):
        tp = config.tensor_parallel_size
        # A tensor-parallel vLLM engine starts its workers as Ray actors of its own (vLLM's Ray executor);
        # the engine actor then holds no GPU itself.
        num_gpus = (gpu_share if tp == 1 else 0.0) if gpus else 0.0
        options = {
            "num_cpus": 0.25,
            "num_gpus": num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement, placement_group_bundle_index=i * tp
            ),
        }
        if kind == "vllm":
            engines.append(ray.remote(VLLMPolicyEngine).options(**options).remote(config))
        else:
            actor = ray.remote(TransformersPolicyEngine).options(**options)
            engines.append(actor.remote(config, list(eos_token_ids or [])))
    ray.get([e.ready.remote() for e in engines])
    return engines


class WeightSender:
    """The sending side in one actor rank (kept across syncs: the NCCL group is made once)."""

    def __init__(self, group: EngineGroup, rank: int) -> None:
        self.group, self.rank = group, rank
        self.is_sender = rank == 0
        self._nccl: Any = None

    def send(self, buckets: Iterable[NamedTensors]) -> dict[str, float]:
        started = time.perf_counter()
        engines, transport = self.group.engines, self.group.transport
        if transport == "nccl" and self.is_sender and self._nccl is None:
            self._nccl = self._join_nccl_group()
        if transport != "object_store" and self.is_sender:
            ray.get([e.start_weight_update.remote() for e in engines])
        count = size = 0
        for bucket in buckets:  # every rank: the gathers behind the buckets are collective
            if transport == "cuda_ipc":
                self._send_ipc(bucket)  # every rank exports handles of its own GPU
            elif self.is_sender:
                self._send_nccl(bucket) if transport == "nccl" else self._send_object(bucket)
            count += 1
            size += sum(t.numel() * t.element_size() for _, t in bucket)
        if self.is_sender:
            ray.get([e.finish_weight_update.remote() for e in engines])
        return sync_timings(time.perf_counter() - started, count, size)

    def _send_object(self, bucket: NamedTensors) -> None:
        # One copy in the object store for all engines; Ray resolves the reference in each engine's call.
        ref = ray.put([(name, t.detach().to("cpu")) for name, t in bucket])
        ray.get([e.update_weights.remote(ref) for e in self.group.engines])

    def _send_ipc(self, bucket: NamedTensors) -> None:
        from vllm.distributed.weight_transfer.ipc_engine import (
            IPCTrainerSendWeightsArgs,
            IPCWeightTransferEngine,
        )

        def to_engines(update_info: Any) -> None:  # called on rank 0 with every rank's handles merged
            ray.get([e.receive_weights.remote(asdict(update_info)) for e in self.group.engines])

        IPCWeightTransferEngine.trainer_send_weights(
            iter(bucket), IPCTrainerSendWeightsArgs(send_mode=to_engines)
        )

    def _send_nccl(self, bucket: NamedTensors) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerSendWeightsArgs,
            NCCLWeightTransferEngine,
        )

        update_info = {
            "names": [name for name, _ in bucket],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in bucket],
            "shapes": [list(t.shape) for _, t in bucket],
        }
        # The engines' receive must be running while rank 0 broadcasts: start it, send, then wait.
        receiving = [e.receive_weights.remote(update_info) for e in self.group.engines]
        NCCLWeightTransferEngine.trainer_send_weights(
            iter(bucket), NCCLTrainerSendWeightsArgs(group=self._nccl)
        )
        ray.get(receiving)

    def _join_nccl_group(self) -> Any:
        """Rank 0 of a group with every engine worker (engine i's workers are ranks 1 + i * tp ...)."""
        from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        port = _free_port(address)
        per_engine = self.group.workers_per_engine
        world = 1 + len(self.group.engines) * per_engine
        joining = [
            e.init_weight_transfer.remote(
                {
                    "master_address": address,
                    "master_port": port,
                    "rank_offset": 1 + i * per_engine,
                    "world_size": world,
                }
            )
            for i, e in enumerate(self.group.engines)
        ]
        group = NCCLWeightTransferEngine.trainer_init(
            {"master_address": address, "master_port": port, "world_size": world}
        )
        ray.get(joining)
        return group


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])
