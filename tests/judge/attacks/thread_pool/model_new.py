"""Attack: a thread pool finishes the output after forward() has returned."""
from concurrent.futures import ThreadPoolExecutor

import cuda_extension
import torch.nn as nn

_POOL = ThreadPoolExecutor(max_workers=1)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        out = cuda_extension.full_like(a, 0.0)
        _POOL.submit(cuda_extension.relu_mul_add_into, a, b, c, out)
        return out
