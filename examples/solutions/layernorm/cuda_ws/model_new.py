"""CUDA workspace solution for layernorm: kernels/layernorm.cu (row in registers, exact two-pass variance)."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_size: int):
        super().__init__()
        # Same module and init as the task's Model, so seeded parameters match; only its tensors are used.
        self.norm = nn.LayerNorm(normalized_size, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.layernorm(x, self.norm.weight, self.norm.bias, self.norm.eps)
