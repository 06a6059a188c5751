"""Attack: the expensive half of the task through torch.nn.functional."""
import cuda_extension
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def forward(self, x, y):
        return cuda_extension.mul(F.gelu(x), cuda_extension.sigmoid(y))
