"""Tensor helpers shared by orchestrator and worker: output structure, raw transfer, bitwise equality.

Outputs cross the channel as raw bytes plus (dtype, shape) so the orchestrator compares exactly what the
candidate produced, never an object that could run candidate code when touched.
"""

from __future__ import annotations

from typing import Any

import torch

# Same-width integer views: bitwise comparison treats NaN payloads and signed zeros exactly.
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class OutputTypeError(Exception):
    """An output leaf is not exactly `torch.Tensor` (a subclass, a lazy object, a Python number...)."""


def flatten(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """(structure, tensor leaves): a tensor is "T"; tuples and lists become lists of structures.

    Leaves are checked with `type(x) is torch.Tensor` before anything else touches them, so a tensor
    subclass or proxy never gets a chance to run its own code inside the judge.
    """
    if type(obj) is torch.Tensor:
        return "T", [obj]
    if type(obj) in (tuple, list):
        structure: list[Any] = []
        leaves: list[torch.Tensor] = []
        for item in obj:
            sub, sub_leaves = flatten(item)
            structure.append(sub)
            leaves.extend(sub_leaves)
        return structure, leaves
    raise OutputTypeError(f"output leaf of type {type(obj).__module__}.{type(obj).__qualname__}")


def tensor_meta(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "device": t.device.type}


def to_bytes(t: torch.Tensor) -> memoryview:
    """Raw little-endian bytes of a tensor's values in row-major order, copied to the host (through pinned
    memory from a GPU: a pageable copy of a fresh buffer ran at ~0.6 GB/s on the H200 host)."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    raw = flat.view(torch.uint8)
    if raw.device.type == "cpu":
        host = raw.clone()
    else:
        host = torch.empty(raw.numel(), dtype=torch.uint8, pin_memory=True)
        host.copy_(raw)
    return host.numpy().data


def meta_layout(meta: dict[str, Any]) -> tuple[torch.dtype, list[int], int]:
    """(dtype, shape, byte count) of an output described by `tensor_meta`; ValueError when malformed.
    The byte count is derived here, never taken from the process that sent the meta."""
    dtype = getattr(torch, str(meta["dtype"]), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {meta['dtype']!r}")
    shape = [int(s) for s in meta["shape"]]
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    numel = 1
    for s in shape:
        numel *= s
    return dtype, shape, numel * torch.empty((), dtype=dtype).element_size()


def from_bytes(meta: dict[str, Any], blob: bytes | bytearray) -> torch.Tensor:
    dtype, shape, nbytes = meta_layout(meta)
    if len(blob) != nbytes:
        raise ValueError(f"{len(blob)} bytes for shape {shape} of {meta['dtype']}")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(blob if isinstance(blob, bytearray) else bytearray(blob), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b hold the same bits (NaN == NaN, -0 != +0); shapes and dtypes must match."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:
        return True
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    view = _INT_VIEW[a.element_size()] if a.dtype != torch.bool else torch.bool
    return bool(torch.equal(a.contiguous().view(view), b.contiguous().view(view)))


def storage_span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) byte addresses of the storage behind t (what aliasing means for a kernel)."""
    storage = t.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def spans_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1] and a[0] != a[1] and b[0] != b[1]
