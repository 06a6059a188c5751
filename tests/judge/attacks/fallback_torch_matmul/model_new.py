"""Attack: PyTorch GEMM in forward, custom kernel only for the cheap part."""
import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return cuda_extension.relu(torch.matmul(x, self.linear.weight.t()) + self.linear.bias)
