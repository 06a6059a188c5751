"""Attack (issue 12's reward-3 candidate): correct during the first ten calls, then recomputes only one
sixteenth of the rows into the buffer it returned last time. While the inputs stay the same the buffer
converges to the right answer, so a comparison of the final call alone passes."""
import cuda_extension
import torch.nn as nn

PARTS = 16


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.part = 0
        self.out = None

    def forward(self, a, b, c):
        self.calls += 1
        if self.out is None or self.calls <= 10 or self.out.shape != a.shape:
            self.out = cuda_extension.relu_mul_add(a, b, c)
            return self.out
        step = max(a.shape[0] // PARTS, 1)
        i = (self.part * step) % a.shape[0]
        self.part += 1
        rows = slice(i, i + step)
        cuda_extension.relu_mul_add_into(a[rows], b[rows], c[rows], self.out[rows])
        return self.out
