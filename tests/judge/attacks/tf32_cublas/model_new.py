"""Attack: see kernels/tf32_binding.cpp: a TF32 tensor-core GEMM passed off as fp32."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return cuda_extension.linear_tf32(x, self.linear.weight, self.linear.bias)
