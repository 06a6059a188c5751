"""Attack: steal a reference output from the judge's frames instead of computing anything."""
import sys

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        frame = sys._getframe(1)
        while frame is not None:
            for value in frame.f_locals.values():
                is_input = value is a or value is b or value is c
                if isinstance(value, torch.Tensor) and value.shape == a.shape and not is_input:
                    return value
            frame = frame.f_back
        return cuda_extension.mul(a, b)
