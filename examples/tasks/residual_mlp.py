"""A small residual block: x + fc2(relu(fc1(x)))."""

import os

import torch
import torch.nn as nn

# (batch, features, hidden)
_SHAPES = {"small": (64, 256, 512), "full": (2048, 1024, 4096)}
# The judge passes CUDA_AGENT_TASK_SCALE through to its worker, so the variable alone picks the shapes;
# tests/judge/fixture_catalog.py (task_at_scale) can also write a copy with this default switched.
DEFAULT_SCALE = "small"
_SCALE = os.environ.get("CUDA_AGENT_TASK_SCALE", DEFAULT_SCALE)
if _SCALE not in _SHAPES:
    raise ValueError(f"CUDA_AGENT_TASK_SCALE must be one of {sorted(_SHAPES)}, got {_SCALE!r}")
BATCH, FEATURES, HIDDEN = _SHAPES[_SCALE]


class Model(nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [FEATURES, HIDDEN]
