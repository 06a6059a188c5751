"""Layer normalisation over the last dimension with a learned (random) scale and shift."""

import os

import torch
import torch.nn as nn

_SHAPES = {"small": (256, 1024), "full": (8192, 4096)}
# The judge passes CUDA_AGENT_TASK_SCALE through to its worker, so the variable alone picks the shapes;
# tests/judge/fixture_catalog.py (task_at_scale) can also write a copy with this default switched.
DEFAULT_SCALE = "small"
_SCALE = os.environ.get("CUDA_AGENT_TASK_SCALE", DEFAULT_SCALE)
if _SCALE not in _SHAPES:
    raise ValueError(f"CUDA_AGENT_TASK_SCALE must be one of {sorted(_SHAPES)}, got {_SCALE!r}")
ROWS, COLS = _SHAPES[_SCALE]


class Model(nn.Module):
    def __init__(self, normalized_size: int):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_size, eps=1e-5)
        # Random affine parameters: the defaults (ones, zeros) would let a solution ignore them.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    # An offset mean makes a one-pass E[x^2] - E[x]^2 variance lose precision, as real activations do.
    return [torch.randn(ROWS, COLS) * 2.0 + 3.0]


def get_init_inputs():
    return [COLS]
