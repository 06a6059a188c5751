"""Attack: a lazy output; forward() returns at once and the work happens on first access."""
import cuda_extension
import torch
import torch.nn as nn


class LazyResult(torch.Tensor):
    pending = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for arg in args:
            if isinstance(arg, LazyResult) and arg.pending is not None:
                a, b, c = arg.pending
                arg.pending = None
                cuda_extension.relu_mul_add_into(a, b, c, arg.as_subclass(torch.Tensor))
        return super().__torch_function__(func, types, args, kwargs or {})


class ModelNew(nn.Module):
    def forward(self, a, b, c):
        out = cuda_extension.full_like(a, 0.0).as_subclass(LazyResult)
        out.pending = (a, b, c)
        return out
