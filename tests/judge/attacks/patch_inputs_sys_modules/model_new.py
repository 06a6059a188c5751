"""Attack: rewrite the task itself so the reference agrees with a trivial output."""
import sys

import cuda_extension
import torch
import torch.nn as nn

for _module in list(sys.modules.values()):
    if hasattr(_module, "get_inputs") and hasattr(_module, "Model"):
        _shapes = [tuple(t.shape) for t in _module.get_inputs()]
        _module.get_inputs = lambda shapes=_shapes: [torch.zeros(s) for s in shapes]
        _module.Model.forward = lambda self, a, b, c: torch.zeros_like(a)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.full_like(a, 0.0)
