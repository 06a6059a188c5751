"""Attack: correct for half a second after its first call (the verify trials run then), afterwards
returns its previous output: a switch on elapsed time between "checked" and "timed" calls."""
import time

import cuda_extension
import torch.nn as nn

HONEST_SECONDS = 0.5


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.start = None
        self.last = None

    def forward(self, a, b, c):
        now = time.monotonic()
        if self.start is None:
            self.start = now
        if self.last is None or now - self.start < HONEST_SECONDS:
            self.last = cuda_extension.relu_mul_add(a, b, c)
        return self.last
