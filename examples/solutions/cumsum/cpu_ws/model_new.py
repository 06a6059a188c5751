"""CPU workspace solution for cumsum: the judge builds kernels/ into `cuda_extension`."""

import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cuda_extension.cumsum(x)
