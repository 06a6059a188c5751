"""Attack: a thread again, imported by a name the screen cannot see."""
import importlib

import cuda_extension
import torch.nn as nn

_threads = importlib.import_module("thread" + "ing")


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        out = cuda_extension.full_like(a, 0.0)
        _threads.Thread(target=cuda_extension.relu_mul_add_into, args=(a, b, c, out)).start()
        return out
