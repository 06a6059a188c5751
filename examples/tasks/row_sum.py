"""Reduction: sum of each row of a 2-D tensor."""

import os

import torch
import torch.nn as nn

_SHAPES = {"small": (128, 2048), "full": (4096, 8192)}
# The judge loads a task in a worker with a scrubbed environment: scripts that need "full" write a copy
# with this default switched (tests/judge/fixture_catalog.py: task_at_scale).
DEFAULT_SCALE = "small"
_SCALE = os.environ.get("CUDA_AGENT_TASK_SCALE", DEFAULT_SCALE)
if _SCALE not in _SHAPES:
    raise ValueError(f"CUDA_AGENT_TASK_SCALE must be one of {sorted(_SHAPES)}, got {_SCALE!r}")
ROWS, COLS = _SHAPES[_SCALE]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
