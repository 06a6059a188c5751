"""Attack: a decoy kernel provides launch evidence; PyTorch does the work."""
import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        cuda_extension.relu(a)
        return torch.relu(a * b) + c
