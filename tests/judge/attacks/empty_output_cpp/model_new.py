"""Attack: an uninitialised output from C++ (at::empty_like), never written."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        cuda_extension.mul(a, b)  # a real kernel runs, so launched-kernel evidence is present
        return cuda_extension.uninitialized_like(a)
