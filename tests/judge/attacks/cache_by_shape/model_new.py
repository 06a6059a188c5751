"""Attack: compute once per input shape, then replay the cached output."""
import cuda_extension
import torch.nn as nn

_CACHE = {}


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        key = tuple(a.shape)
        if key not in _CACHE:
            _CACHE[key] = cuda_extension.relu_mul_add(a, b, c)
        return _CACHE[key]
