"""Attack: reach into the judge itself and neuter every function it defines."""
import cuda_extension
import torch.nn as nn

import cuda_agent.sandbox.judge as judge

for _name in dir(judge):
    if callable(getattr(judge, _name)):
        setattr(judge, _name, lambda *args, **kwargs: True)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.mul(a, b)
