"""Attack: a helper process that keeps running next to the judge."""
import subprocess
import sys

import cuda_extension
import torch.nn as nn

_HELPER = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.relu_mul_add(a, b, c)
