"""Attack: a PyTorch op reached through a Tensor method rather than torch.* or F.*."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.add(cuda_extension.mul(a, b).relu(), c)
