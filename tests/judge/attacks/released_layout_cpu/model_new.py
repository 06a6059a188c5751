"""Not an attack: a workspace laid out the way the CUDA Agent release publishes it (CPU kernel)."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b, c):
        return cuda_extension.axpby(a, b, c)
