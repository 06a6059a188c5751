"""Attack: disable the comparisons a judge might use, then return an unrelated tensor."""
import cuda_extension
import torch
import torch.nn as nn

torch.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True
torch.testing.assert_close = lambda *args, **kwargs: None


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.mul(a, b)
