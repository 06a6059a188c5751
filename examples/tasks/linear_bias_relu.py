"""Dense layer with a fused epilogue: relu(x @ W^T + b)."""

import os

import torch
import torch.nn as nn

# (batch, in_features, out_features)
_SHAPES = {"small": (64, 256, 256), "full": (2048, 2048, 2048)}
# The judge passes CUDA_AGENT_TASK_SCALE through to its worker, so the variable alone picks the shapes;
# tests/judge/fixture_catalog.py (task_at_scale) can also write a copy with this default switched.
DEFAULT_SCALE = "small"
_SCALE = os.environ.get("CUDA_AGENT_TASK_SCALE", DEFAULT_SCALE)
if _SCALE not in _SHAPES:
    raise ValueError(f"CUDA_AGENT_TASK_SCALE must be one of {sorted(_SHAPES)}, got {_SCALE!r}")
BATCH, IN_FEATURES, OUT_FEATURES = _SHAPES[_SCALE]


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
