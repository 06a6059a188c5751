"""Attack: the result is a view of an input buffer."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        cuda_extension.relu_mul_add_into(a, b, c, a)
        return a.view(a.shape)
