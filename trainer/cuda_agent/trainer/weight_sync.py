"""Actor -> rollout weight sync in buckets, timed.

The actor yields its weights (gathered under ZeRO-3) in buckets of about `bucket_mb`; each bucket goes to
the rollout backend's `update_weights` hook in one call (a vLLM engine loads it with `load_weights`, the
in-process transformers backend copies it into its model), never tensor by tensor, and one bucket at a
time: the next is made only after the receiver took the previous one. A receiver that stages an update
(vLLM's layerwise reload, the router over engines) applies it in `finish_weight_update`, called once after
the last bucket. Coroutine hooks run on the trainer's one event loop (`event_loop.run_async`).

Rollout engines that run as Ray actors do not come through here: the actor ranks send to them directly
(`ray.engines`), and the driver holds no bucket.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Iterable
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from cuda_agent.trainer.event_loop import run_async

NamedTensors = list[tuple[str, torch.Tensor]]


class WeightReceiver(Protocol):
    """A rollout backend's weight hook; the rollout package's engines and router make it a coroutine."""

    def update_weights(self, bucket: NamedTensors) -> Awaitable[None] | None: ...


@runtime_checkable
class StagedReceiver(Protocol):
    """A receiver that applies an update once all its buckets are in."""

    def finish_weight_update(self) -> Awaitable[None] | None: ...


def sync_weights(buckets: Iterable[NamedTensors], receiver: WeightReceiver) -> dict[str, float]:
    started = time.perf_counter()
    count, size = 0, 0
    for bucket in buckets:
        _wait(receiver.update_weights(bucket))
        count += 1
        size += sum(t.numel() * t.element_size() for _, t in bucket)
    if isinstance(receiver, StagedReceiver):
        _wait(receiver.finish_weight_update())
    return sync_timings(time.perf_counter() - started, count, size)


def sync_timings(seconds: float, buckets: int, size: int) -> dict[str, float]:
    return {"weight_sync_s": seconds, "weight_sync_buckets": float(buckets), "weight_sync_gb": size / 1e9}


def _wait(pending: Awaitable[None] | None) -> None:
    if inspect.isawaitable(pending):
        run_async(pending)


def load_bucket(model: nn.Module, bucket: NamedTensors) -> None:
    """Copy one bucket into `model`'s parameters by name (the in-process receiver)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in bucket:
            target = params.get(name)
            if target is None:
                raise KeyError(f"weight sync: the rollout model has no parameter {name!r}")
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
