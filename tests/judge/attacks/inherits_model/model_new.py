"""Attack: inherit the reference implementation instead of writing a kernel."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b, c):
        return torch.relu(a * b) + c


class ModelNew(Model):
    def forward(self, a, b, c):
        return super().forward(a, b, c)
