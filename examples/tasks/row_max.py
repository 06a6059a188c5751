"""Reduction: maximum of each row (values only)."""

import os

import torch
import torch.nn as nn

_SHAPES = {"small": (128, 2048), "full": (8192, 4096)}
# The judge passes CUDA_AGENT_TASK_SCALE through to its worker, so the variable alone picks the shapes;
# tests/judge/fixture_catalog.py (task_at_scale) can also write a copy with this default switched.
DEFAULT_SCALE = "small"
_SCALE = os.environ.get("CUDA_AGENT_TASK_SCALE", DEFAULT_SCALE)
if _SCALE not in _SHAPES:
    raise ValueError(f"CUDA_AGENT_TASK_SCALE must be one of {sorted(_SHAPES)}, got {_SCALE!r}")
ROWS, COLS = _SHAPES[_SCALE]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
