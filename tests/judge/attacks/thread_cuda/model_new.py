"""Attack: see kernels/late.cu: the kernel is launched from a detached std::thread."""
import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.relu_mul_add(a, b, c)
