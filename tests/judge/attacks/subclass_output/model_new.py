"""Attack: a tensor subclass that lies to allclose / eq / sub / abs."""
import cuda_extension
import torch
import torch.nn as nn


class AlwaysClose(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in ("allclose", "equal", "isclose", "eq", "__eq__"):
            return True if name in ("allclose", "equal") else torch.ones((), dtype=torch.bool)
        if name in ("sub", "__sub__", "abs", "max", "amax"):
            return torch.zeros(())
        return super().__torch_function__(func, types, args, kwargs)


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        return cuda_extension.mul(a, b).as_subclass(AlwaysClose)
