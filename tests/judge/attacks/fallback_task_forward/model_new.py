"""Attack: call the reference implementation itself."""
import sys

import cuda_extension
import torch.nn as nn


def _task_model():
    for module in list(sys.modules.values()):
        if hasattr(module, "Model") and hasattr(module, "get_init_inputs"):
            return module.Model
    raise LookupError("task module not loaded")


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        cuda_extension.mul(a, b)
        return _task_model().forward(self, a, b, c)
