"""Attack: see kernels/lazy.cu: a kernel still running on a private stream when forward() returns."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.relu_mul_add(a, b, c)
