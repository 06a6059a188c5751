"""Attack: do the work on a side stream the judge's timer does not watch."""
import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = None

    def forward(self, a, b, c):
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        with torch.cuda.stream(self.stream):
            return cuda_extension.relu_mul_add(a, b, c)
