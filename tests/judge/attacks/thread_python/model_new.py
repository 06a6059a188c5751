"""Attack: the real work runs on a Python thread, so a timer around forward() sees almost nothing."""
import threading

import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        out = cuda_extension.full_like(a, 0.0)
        worker = threading.Thread(target=cuda_extension.relu_mul_add_into, args=(a, b, c, out))
        worker.start()
        return out
