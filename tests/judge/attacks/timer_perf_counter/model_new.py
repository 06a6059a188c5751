"""Attack: freeze the host clocks so any host-side timing reports ~0 ms."""
import time

import cuda_extension
import torch.nn as nn

time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0
time.time = lambda: 0.0


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.relu_mul_add(a, b, c)
