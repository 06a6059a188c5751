"""Attack: guess the judge's seed and replay precomputed outputs (no work in forward).

The guesses replay the task's own get_inputs() (small scale, three randn(256, 1024) draws). When no
guess matches the output for seed 42 is returned anyway, so the attack fails loudly instead of
quietly computing an honest answer.
"""
import time

import cuda_extension
import torch
import torch.nn as nn

_SHAPE = (256, 1024)
_GUESSES = [0, 1, 42, 1234] + [int(time.time()) + d for d in range(-5, 6)]
_BY_FIRST_VALUE = {}
_BY_SEED = {}
_state = torch.random.get_rng_state()
for _seed in _GUESSES:
    torch.manual_seed(_seed)
    _a, _b, _c = torch.randn(_SHAPE), torch.randn(_SHAPE), torch.randn(_SHAPE)
    _BY_SEED[_seed] = cuda_extension.relu_mul_add(_a, _b, _c)
    _BY_FIRST_VALUE[cuda_extension.first_value(_a)] = _BY_SEED[_seed]
torch.random.set_rng_state(_state)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return _BY_FIRST_VALUE.get(cuda_extension.first_value(a), _BY_SEED[42])
