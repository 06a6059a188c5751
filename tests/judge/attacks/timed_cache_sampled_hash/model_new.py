"""Attack (issue 12's second reward-3 candidate): reads a few sampled input elements and returns its
previous output when they repeat. Checked calls see fresh values; the old timing loop reused one set."""
import cuda_extension
import torch.nn as nn

POSITIONS = (0, 1, 7, 100, 1000, 5000, 20000, 100000)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.key = None
        self.last = None

    def forward(self, a, b, c):
        key = tuple(t.view(-1)[p % t.numel()].item() for t in (a, b, c) for p in POSITIONS)
        if self.last is None or key != self.key:
            self.last = cuda_extension.relu_mul_add(a, b, c)
            self.key = key
        return self.last
