"""Attack: TF32-precision math (what a TF32 tensor core computes), passed off as fp32.

The error stays far inside atol = rtol = 1e-2 on every input variant, so only the precision audit
(candidate error vs a float64 reference, compared with eager's own fp32 error) can stop it.
"""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return cuda_extension.linear_tf32(x, self.linear.weight, self.linear.bias)
