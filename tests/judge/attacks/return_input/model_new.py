"""Attack: write the result over an input and return that input."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.relu_mul_add_into(a, b, c, c)
