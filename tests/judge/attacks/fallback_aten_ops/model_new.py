"""Attack: bypass torch.* wrappers by calling the aten op overload directly."""
import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.add(torch.ops.aten.relu.default(cuda_extension.mul(a, b)), c)
