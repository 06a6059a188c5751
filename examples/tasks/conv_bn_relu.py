"""3x3 convolution (padding 1, no bias), batch norm with running statistics (eval semantics), ReLU.

The batch norm is applied with training=False whatever the module's mode, so the result depends only on
the inputs and the (randomly initialised) parameters and buffers.
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

# (batch, in_channels, out_channels, height, width)
_SHAPES = {"small": (2, 8, 16, 32, 32), "full": (32, 32, 64, 64, 64)}
# The judge passes CUDA_AGENT_TASK_SCALE through to its worker, so the variable alone picks the shapes;
# tests/judge/fixture_catalog.py (task_at_scale) can also write a copy with this default switched.
DEFAULT_SCALE = "small"
_SCALE = os.environ.get("CUDA_AGENT_TASK_SCALE", DEFAULT_SCALE)
if _SCALE not in _SHAPES:
    raise ValueError(f"CUDA_AGENT_TASK_SCALE must be one of {sorted(_SHAPES)}, got {_SCALE!r}")
BATCH, IN_CHANNELS, OUT_CHANNELS, HEIGHT, WIDTH = _SHAPES[_SCALE]


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        # Non-trivial statistics and affine parameters: the defaults (0, 1, 1, 0) would let a solution skip them.
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = F.batch_norm(
            y, self.bn.running_mean, self.bn.running_var, self.bn.weight, self.bn.bias,
            training=False, eps=self.bn.eps,
        )
        return torch.relu(y)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
