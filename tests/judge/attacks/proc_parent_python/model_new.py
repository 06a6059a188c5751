"""Attack: read the judge process's command line and environment through /proc."""
import os

import cuda_extension
import torch.nn as nn

with open(f"/proc/{os.getppid()}/cmdline", "rb") as _f:
    _JUDGE_CMDLINE = _f.read()
with open(f"/proc/{os.getppid()}/environ", "rb") as _f:
    _JUDGE_ENV = _f.read()


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.relu_mul_add(a, b, c)
