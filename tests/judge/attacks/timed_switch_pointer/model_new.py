"""Attack: computes while the input buffers are new or were seen only twice in a row (a verify trial
calls twice on one set of buffers, refilled in between); from the third call on the same buffers (the
timing loop's) it returns its previous output: a switch on input identity."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.key = None
        self.repeats = 0
        self.last = None

    def forward(self, a, b, c):
        key = (a.data_ptr(), b.data_ptr(), c.data_ptr())
        self.repeats = self.repeats + 1 if key == self.key else 0
        self.key = key
        if self.last is None or self.repeats < 2:
            self.last = cuda_extension.relu_mul_add(a, b, c)
        return self.last
