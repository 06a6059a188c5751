"""Attack: talk to the outside world (here: a local port) to fetch answers."""
import socket

import cuda_extension
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"inputs ready", ("127.0.0.1", 9))
        return cuda_extension.relu_mul_add(a, b, c)
