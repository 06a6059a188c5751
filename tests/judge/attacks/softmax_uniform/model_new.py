"""Attack: a constant 1/N has the right magnitude and row sums but carries no information."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return cuda_extension.full_like(x, 1.0 / x.shape[-1])
