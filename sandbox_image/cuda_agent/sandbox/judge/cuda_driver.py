"""The few CUDA driver calls the judge makes itself, through ctypes: the outputs' IPC transfer and an
early primary context.

Outputs go from worker to orchestrator through CUDA IPC instead of the channel's pipe. At full task
scale one trial's outputs are hundreds of MB; through the pipe each byte was copied to the host,
hashed, piped and copied back to the device (~0.35 s per trial on the H200 host, most of a cached
evaluation). Instead the worker exports the device allocation that holds the judge's own copy of each
output (`cuIpcGetMemHandle`; the candidate never held a reference to that copy) and keeps it alive until
its next command; the orchestrator maps it, copies the bytes into its own memory, synchronises and unmaps
it before it sends the worker anything else. Handle, offset and size travel in the authenticated frame.

The orchestrator trusts none of them: the byte count comes from the dtype and shape it expects, the range
is checked against the size of the allocation it actually mapped, and any driver error is an undecodable
output (a violation), never a read outside the mapping. The orchestrator exports nothing, so a worker has
no handle to any of the orchestrator's memory. libcuda is loaded by torch already, and no file, socket
or /dev/shm segment is involved.

ctypes releases the GIL around each foreign call, which is what `create_primary_context` is for: torch's
own initialisation holds the GIL for ~0.3 s, so on a thread it would stall the judge's main thread anyway.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from cuda_agent.sandbox.judge import tensors

HANDLE_BYTES = 64
# CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: the only flag cuIpcOpenMemHandle takes.
_LAZY_PEER_ACCESS = 1


class DriverError(Exception):
    """The driver refused a call (or is missing), or an output descriptor does not fit what was mapped."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


class _Driver:
    """The driver entry points the judge uses, with errors raised as DriverError."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self._name = lib.cuGetErrorName
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._get_handle = lib.cuIpcGetMemHandle
        self._get_handle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
        self._range = lib.cuMemGetAddressRange_v2
        self._range.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        self._open = lib.cuIpcOpenMemHandle_v2
        self._open.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
        self._close = lib.cuIpcCloseMemHandle
        self._close.argtypes = [ctypes.c_uint64]
        self._copy = lib.cuMemcpyDtoD_v2
        self._copy.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_size_t]
        self._init = lib.cuInit
        self._init.argtypes = [ctypes.c_uint]
        self._device = lib.cuDeviceGet
        self._device.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self._retain = lib.cuDevicePrimaryCtxRetain
        self._retain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]

    def _check(self, what: str, code: int) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self._name(code, ctypes.byref(name))
            raise DriverError(f"{what}: {(name.value or b'CUDA error').decode()} ({code})")

    def address_range(self, ptr: int) -> tuple[int, int]:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._check("cuMemGetAddressRange", self._range(ctypes.byref(base), ctypes.byref(size), ptr))
        return base.value, size.value

    def export(self, base: int) -> bytes:
        handle = _Handle()
        self._check("cuIpcGetMemHandle", self._get_handle(ctypes.byref(handle), base))
        return bytes(handle)  # all 64 bytes: `handle.reserved` would stop at the first NUL

    def open(self, handle: bytes) -> int:
        ptr = ctypes.c_uint64()
        raw = _Handle.from_buffer_copy(handle)
        self._check("cuIpcOpenMemHandle", self._open(ctypes.byref(ptr), raw, _LAZY_PEER_ACCESS))
        return ptr.value

    def close(self, ptr: int) -> None:
        self._check("cuIpcCloseMemHandle", self._close(ptr))

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self._check("cuMemcpyDtoD", self._copy(dst, src, nbytes))

    def retain_primary_context(self, ordinal: int) -> None:
        self._check("cuInit", self._init(0))
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self._check("cuDeviceGet", self._device(ctypes.byref(device), ordinal))
        self._check("cuDevicePrimaryCtxRetain", self._retain(ctypes.byref(context), device.value))


@functools.cache
def _driver() -> _Driver:
    try:
        return _Driver()
    except (OSError, AttributeError) as exc:
        raise DriverError(f"CUDA driver API unavailable: {exc}") from None


def create_primary_context(ordinal: int = 0) -> None:
    """Initialise the driver and create the device's primary context (the one torch then uses) without
    holding the GIL. Retained for the process's life: released, it would be destroyed again."""
    _driver().retain_primary_context(ordinal)


def export(tensors: list[torch.Tensor]) -> list[dict[str, Any]]:
    """Descriptors for contiguous CUDA tensors (worker side). The caller keeps the tensors alive, and
    their values final (device synchronised), until the orchestrator's next command arrives."""
    if not all(t.is_cuda and t.is_contiguous() for t in tensors):
        raise DriverError("only contiguous CUDA tensors are exported")
    driver = _driver()
    torch.cuda.synchronize()
    descriptors: list[dict[str, Any]] = []
    handles: dict[int, str] = {}  # one handle per allocation: outputs often share one
    for t in tensors:
        if t.numel() == 0:
            descriptors.append({"handle": None, "offset": 0})
            continue
        base, _ = driver.address_range(t.data_ptr())
        if base not in handles:
            handles[base] = driver.export(base).hex()
        descriptors.append({"handle": handles[base], "offset": t.data_ptr() - base})
    return descriptors


@contextmanager
def _mapped(handles: set[bytes], device: torch.device) -> Iterator[dict[bytes, tuple[int, int]]]:
    """Each distinct handle opened once: {handle: (mapped pointer, mapped size)}; all closed on exit,
    after the device has finished every copy out of them."""
    driver = _driver()
    opened: dict[bytes, tuple[int, int]] = {}
    try:
        for handle in handles:
            ptr = driver.open(handle)
            opened[handle] = (ptr, 0)  # recorded before the next call can fail, so it is closed
            opened[handle] = (ptr, driver.address_range(ptr)[1])
        yield opened
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        for ptr, _ in opened.values():
            driver.close(ptr)


def import_outputs(
    descriptors: Any, metas: list[dict[str, Any]], device: torch.device, max_bytes: int
) -> list[torch.Tensor]:
    """The outputs the descriptors point at, copied into this process's memory (orchestrator side).
    Raises ValueError (malformed descriptor or meta) or DriverError (driver refused, range outside the
    mapping); either is an undecodable output for the caller."""
    if not isinstance(descriptors, list) or len(descriptors) != len(metas):
        raise ValueError("output descriptors do not match the outputs")
    plans: list[tuple[torch.dtype, list[int], int, bytes | None, int]] = []
    for desc, meta in zip(descriptors, metas, strict=True):
        dtype, shape, nbytes = tensors.meta_layout(meta)
        if nbytes > max_bytes:
            raise ValueError(f"output of {nbytes} bytes exceeds the largest expected ({max_bytes})")
        if not isinstance(desc, dict) or not isinstance(desc.get("offset"), int) or desc["offset"] < 0:
            raise ValueError("malformed output descriptor")
        handle = None
        if nbytes:
            raw = desc.get("handle")
            handle = bytes.fromhex(raw) if isinstance(raw, str) else b""
            if len(handle) != HANDLE_BYTES:
                raise ValueError("malformed IPC handle")
        plans.append((dtype, shape, nbytes, handle, desc["offset"]))
    driver = _driver()
    outputs: list[torch.Tensor] = []
    with _mapped({h for *_, h, _ in plans if h is not None}, device) as mapped:
        for dtype, shape, nbytes, handle, offset in plans:
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            if handle is not None:
                ptr, size = mapped[handle]
                if offset + nbytes > size:
                    raise DriverError(f"output range {offset}+{nbytes} outside the {size}-byte mapping")
                # Same (legacy default) stream as the torch work that follows; _mapped synchronises.
                driver.copy(dst.data_ptr(), ptr + offset, nbytes)
            outputs.append(dst.view(dtype).reshape(shape))
    return outputs
