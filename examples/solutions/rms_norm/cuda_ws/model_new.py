"""CUDA workspace solution for rms_norm: kernels/rms_norm.cu (row held in registers, one read, one write)."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        # Same parameter, created the same way as the task's Model, so seeded init and state dicts match.
        self.weight = nn.Parameter(torch.rand(normalized_size) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.rms_norm(x, self.weight, self.eps)
