"""Attack: exit with status 0 in the middle of verification."""
import os

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        os._exit(0)
