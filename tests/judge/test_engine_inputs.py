"""Trial inputs: reproducible from the seed alone, distinct per seed and per tensor, fingerprinted the same
way on the host and (through the device checksum) on a GPU."""

from __future__ import annotations

import types

import torch

from cuda_agent.sandbox.judge import task as task_lib

TWO_INPUTS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a * b

def get_inputs():
    return [torch.randn(64, 32), torch.randn(64, 32), 7]

def get_init_inputs():
    return []
"""


def _task() -> types.ModuleType:
    return task_lib.load_task(TWO_INPUTS, "two_inputs.py")


def test_inputs_are_reproducible_from_the_seed_for_every_variant() -> None:
    task = _task()
    for variant in task_lib.VARIANTS:
        first = task_lib.make_inputs(task, 1234, variant, "cpu")
        again = task_lib.make_inputs(task, 1234, variant, "cpu")
        other = task_lib.make_inputs(task, 1235, variant, "cpu")
        assert task_lib.values_digest(first) == task_lib.values_digest(again)
        assert task_lib.values_digest(first) != task_lib.values_digest(other)
        assert first[2] == 7


def test_same_shaped_inputs_get_independent_redraws() -> None:
    """One generator serves all tensors in order: a uniform redraw of a and b must not be the same noise."""
    a, b, _ = task_lib.make_inputs(_task(), 99, "uniform", "cpu")
    unit_a = (a - a.min()) / (a.max() - a.min())
    unit_b = (b - b.min()) / (b.max() - b.min())
    assert not torch.allclose(unit_a, unit_b)


def test_device_checksum_sees_one_changed_bit_and_the_position_of_values() -> None:
    """The GPU fingerprint (run here on CPU tensors) changes with a single flipped bit and with a swap."""
    x = torch.arange(1000, dtype=torch.float32)
    base = task_lib._device_checksum(x.reshape(-1))
    flipped = x.clone()
    flipped.view(torch.int32)[500] ^= 1
    swapped = x.clone()
    swapped[[3, 4]] = swapped[[4, 3]]
    assert task_lib._device_checksum(flipped.reshape(-1)) != base
    assert task_lib._device_checksum(swapped.reshape(-1)) != base
    odd = torch.arange(7, dtype=torch.uint8)
    assert len(task_lib._device_checksum(odd)) == 32
