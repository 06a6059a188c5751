"""The plain-torch engine under bf16 steps fp32 master weights (as DeepSpeed's bf16 optimizer does).

Stepping bf16 parameters directly rounds away every update smaller than the weight's bf16 resolution: at
the paper's actor rate a PPO step left almost every weight of the policy unchanged.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cuda_agent.trainer.engine import TrainEngine


def one_weight(value: float) -> nn.Module:
    module = nn.Linear(1, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        module.weight.fill_(value)
    return module


def engine(module: nn.Module, lr: float) -> TrainEngine:
    return TrainEngine(module, lr=lr, backend="torch", zero_stage=0, max_grad_norm=1e9, bf16=True)


def step(e: TrainEngine, module: nn.Module, micro_batches: int = 1) -> None:
    e.start(micro_batches)
    for _ in range(micro_batches):
        e.backward(module.weight.sum() / micro_batches)
    e.finish()


def test_updates_below_bf16_resolution_add_up() -> None:
    """1.0 - 1e-3 rounds back to 1.0 in bf16 (resolution 2^-7 there): ten AdamW steps of ~1e-3 each
    must still move the weight, because they accumulate in the fp32 master."""
    module = one_weight(1.0)
    e = engine(module, lr=1e-3)
    for _ in range(10):
        step(e, module)
    weight = float(module.weight.detach())
    assert module.weight.dtype == torch.bfloat16
    assert weight < 1.0, "the bf16 weight never moved: updates are rounded away"
    assert abs(weight - 0.990) < 0.004  # bf16 rounding of the fp32 master, 1 - 10 x 1e-3


def test_micro_batch_gradients_accumulate_in_fp32() -> None:
    """Gradients of many micro-batches are summed in fp32: the step equals the one-micro-batch step."""
    whole, split = one_weight(0.5), one_weight(0.5)
    a, b = engine(whole, lr=1e-2), engine(split, lr=1e-2)
    step(a, whole, micro_batches=1)
    step(b, split, micro_batches=7)
    assert float(whole.weight.detach()) == float(split.weight.detach())
    assert float(whole.weight.detach()) < 0.5


def test_checkpoint_keeps_masters(tmp_path: Path) -> None:
    """A resumed engine steps from the saved fp32 masters, not from masters re-rounded from bf16."""
    module = one_weight(1.0)
    e = engine(module, lr=1e-3)
    for _ in range(3):  # master 0.997: bf16 still 1.0
        step(e, module)
    e.save(tmp_path)
    resumed_module = one_weight(1.0)
    resumed = engine(resumed_module, lr=1e-3)
    resumed.load(tmp_path)
    for _ in range(7):
        step(e, module)
        step(resumed, resumed_module)
    assert float(resumed_module.weight.detach()) == float(module.weight.detach()) < 1.0
