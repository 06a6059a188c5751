"""Actor -> rollout weight sync in buckets, timed.

The actor yields its weights (gathered under ZeRO-3) in buckets of about `bucket_mb`; each bucket goes to
the rollout backend's `update_weights` hook in one call (a vLLM engine loads it with `load_weights`, the
in-process transformers backend copies it into its model), never tensor by tensor.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Iterable
from typing import Protocol

import torch
from torch import nn

NamedTensors = list[tuple[str, torch.Tensor]]


class WeightReceiver(Protocol):
    """A rollout backend's weight hook; the rollout package's engines and router make it a coroutine."""

    def update_weights(self, bucket: NamedTensors) -> Awaitable[None] | None: ...


def sync_weights(buckets: Iterable[NamedTensors], receiver: WeightReceiver) -> dict[str, float]:
    started = time.perf_counter()
    count, size = 0, 0
    for bucket in buckets:
        pending = receiver.update_weights(bucket)
        if inspect.isawaitable(pending):
            asyncio.run(_wait(pending))
        count += 1
        size += sum(t.numel() * t.element_size() for _, t in bucket)
    return {
        "weight_sync_s": time.perf_counter() - started,
        "weight_sync_buckets": float(count),
        "weight_sync_gb": size / 1e9,
    }


async def _wait(pending: Awaitable[None]) -> None:
    await pending


def load_bucket(model: nn.Module, bucket: NamedTensors) -> None:
    """Copy one bucket into `model`'s parameters by name (the in-process receiver)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in bucket:
            target = params.get(name)
            if target is None:
                raise KeyError(f"weight sync: the rollout model has no parameter {name!r}")
            target.copy_(tensor.to(device=target.device, dtype=target.dtype))
