"""Attack: compute once per set of input buffers, then replay the cached output."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, a, b, c):
        key = (a.data_ptr(), b.data_ptr(), c.data_ptr())
        if key not in self.cache:
            self.cache[key] = cuda_extension.relu_mul_add(a, b, c)
        return self.cache[key]
