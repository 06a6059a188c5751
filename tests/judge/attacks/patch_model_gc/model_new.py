"""Attack: find the reference Model through the garbage collector and make it return zeros."""
import gc

import cuda_extension
import torch
import torch.nn as nn

for _obj in gc.get_objects():
    if isinstance(_obj, type) and _obj.__name__ == "Model" and issubclass(_obj, nn.Module):
        _obj.forward = lambda self, *args: torch.zeros_like(args[0])


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.full_like(a, 0.0)
