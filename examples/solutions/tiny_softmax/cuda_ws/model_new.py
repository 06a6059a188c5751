"""CUDA workspace solution for tiny_softmax: kernels/softmax.cu (online max/sum, two passes) via `cuda_extension`."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.softmax(x)
