"""Attack: correct during the first ten calls (the verify trials), then returns its previous output
without computing anything: a switch on the call count between "checked" and "timed" calls."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.last = None

    def forward(self, a, b, c):
        self.calls += 1
        if self.last is None or self.calls <= 10:
            self.last = cuda_extension.relu_mul_add(a, b, c)
        return self.last
