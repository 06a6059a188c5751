"""The outputs' CUDA IPC transfer (judge/cuda_driver.py) and the worker's benchmark gate.

This machine has no GPU and no libcuda, so the transfer's checks run against a stand-in driver that maps
"handles" to host buffers (a mock, for that reason only). The real driver path runs on the H200 in
tests/gpu/judge_gpu.py, where every solution and attack hands its outputs over this way.
"""

from __future__ import annotations

import ctypes
from typing import Any

import pytest
import torch

from cuda_agent.sandbox.judge import cuda_driver, worker

HANDLE_A = bytes([1]) * cuda_driver.HANDLE_BYTES
HANDLE_B = bytes([2]) * cuda_driver.HANDLE_BYTES


class HostDriver:
    """Stand-in for libcuda: each handle "maps" a host buffer; records opens and closes."""

    def __init__(self, buffers: dict[bytes, ctypes.Array[ctypes.c_char]]) -> None:
        self.buffers = buffers
        self.opened: list[bytes] = []
        self.closed: list[int] = []

    def open(self, handle: bytes) -> int:
        if handle not in self.buffers:
            raise cuda_driver.DriverError("cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (1)")
        self.opened.append(handle)
        return ctypes.addressof(self.buffers[handle])

    def address_range(self, ptr: int) -> tuple[int, int]:
        for buffer in self.buffers.values():
            if ctypes.addressof(buffer) == ptr:
                return ptr, ctypes.sizeof(buffer)
        raise cuda_driver.DriverError("cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND (500)")

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def close(self, ptr: int) -> None:
        self.closed.append(ptr)


def host_buffer(values: torch.Tensor) -> ctypes.Array[ctypes.c_char]:
    raw = values.contiguous().view(torch.uint8).numpy().tobytes()
    return ctypes.create_string_buffer(raw, len(raw))


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> HostDriver:
    first = torch.arange(12, dtype=torch.float32)
    second = torch.tensor([7, -7], dtype=torch.int64)
    stand_in = HostDriver(
        {HANDLE_A: host_buffer(torch.cat([first, first * 2])), HANDLE_B: host_buffer(second)}
    )
    monkeypatch.setattr(cuda_driver, "_driver", lambda: stand_in)
    return stand_in


def meta(dtype: str, shape: list[int]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "device": "cuda"}


def test_each_output_is_copied_out_of_its_mapping_and_every_mapping_closed(driver: HostDriver) -> None:
    descriptors = [
        {"handle": HANDLE_A.hex(), "offset": 0},
        {"handle": HANDLE_A.hex(), "offset": 48},  # the second half of the same allocation
        {"handle": HANDLE_B.hex(), "offset": 0},
        {"handle": None, "offset": 0},
    ]
    metas = [meta("float32", [3, 4]), meta("float32", [12]), meta("int64", [2]), meta("float32", [0, 5])]
    outputs = cuda_driver.import_outputs(descriptors, metas, torch.device("cpu"), 1 << 20)
    assert torch.equal(outputs[0], torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert torch.equal(outputs[1], torch.arange(12, dtype=torch.float32) * 2)
    assert torch.equal(outputs[2], torch.tensor([7, -7]))
    assert outputs[3].shape == (0, 5)
    assert sorted(driver.opened) == [HANDLE_A, HANDLE_B]  # a shared allocation is mapped once
    assert len(driver.closed) == 2
    # The copies are this process's own memory: changing the "worker's" buffer changes nothing here.
    ctypes.memset(driver.buffers[HANDLE_B], 0, 16)
    assert torch.equal(outputs[2], torch.tensor([7, -7]))


def test_a_range_past_the_mapping_is_refused_and_the_mapping_still_closed(driver: HostDriver) -> None:
    descriptors = [{"handle": HANDLE_B.hex(), "offset": 8}]  # 16-byte allocation, 16 bytes from offset 8
    with pytest.raises(cuda_driver.DriverError, match="outside the 16-byte mapping"):
        cuda_driver.import_outputs(descriptors, [meta("int64", [2])], torch.device("cpu"), 1 << 20)
    assert driver.opened == [HANDLE_B] and len(driver.closed) == 1


def test_a_handle_nobody_exported_is_a_driver_error(driver: HostDriver) -> None:
    descriptors = [{"handle": (b"\x03" * 64).hex(), "offset": 0}]
    with pytest.raises(cuda_driver.DriverError, match="cuIpcOpenMemHandle"):
        cuda_driver.import_outputs(descriptors, [meta("int64", [2])], torch.device("cpu"), 1 << 20)
    assert driver.closed == []


@pytest.mark.parametrize(
    ("descriptors", "metas", "message"),
    [
        ([{"handle": HANDLE_A.hex()[:-2], "offset": 0}], [meta("float32", [2])], "malformed IPC handle"),
        ([{"handle": "zz" * 64, "offset": 0}], [meta("float32", [2])], "non-hexadecimal"),
        ([{"handle": HANDLE_A.hex(), "offset": -4}], [meta("float32", [2])], "malformed output descriptor"),
        ([{"handle": HANDLE_A.hex(), "offset": "0"}], [meta("float32", [2])], "malformed output descriptor"),
        ([{"handle": HANDLE_A.hex(), "offset": 0}], [meta("pickle", [2])], "unknown dtype"),
        ([{"handle": HANDLE_A.hex(), "offset": 0}], [meta("float32", [-2])], "negative dimension"),
        ([{"handle": HANDLE_A.hex(), "offset": 0}], [meta("float32", [1 << 40])], "exceeds the largest"),
        ([], [meta("float32", [2])], "do not match the outputs"),
        ({"handle": HANDLE_A.hex()}, [meta("float32", [2])], "do not match the outputs"),
    ],
)
def test_malformed_descriptors_are_refused_before_anything_is_mapped(
    driver: HostDriver, descriptors: Any, metas: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cuda_driver.import_outputs(descriptors, metas, torch.device("cpu"), 1 << 20)
    assert driver.opened == []


def test_export_takes_only_cuda_tensors() -> None:
    with pytest.raises(cuda_driver.DriverError, match="only contiguous CUDA tensors"):
        cuda_driver.export([torch.zeros(4)])


def test_the_gate_holds_every_inductor_benchmark_and_the_wrappers_are_removed() -> None:
    from torch._inductor.runtime import benchmarking

    cls = type(benchmarking.benchmarker)
    before = {c: dict(vars(c)) for c in cls.__mro__}
    gate_calls: list[str] = []
    wrapped = worker._wrap_benchmarks(lambda: gate_calls.append("gate"))
    assert {name for _, name, _ in wrapped} >= {"benchmark_cpu", "benchmark_gpu"}
    timing = benchmarking.benchmarker.benchmark_cpu(lambda: None, warmup=1, rep=1)
    assert gate_calls and timing >= 0
    for owner, name, original in wrapped:
        setattr(owner, name, original)
    assert {c: dict(vars(c)) for c in cls.__mro__} == before


class QueuedEndpoint:
    """The orchestrator's side of the channel, reduced to the frames it has sent (no process needed)."""

    def __init__(self, frames: list[dict[str, Any]]) -> None:
        self.frames = frames

    def receive(self, deadline: float | None = None) -> tuple[dict[str, Any], list[bytearray]]:
        return self.frames.pop(0), []


def gate_worker(tmp_path: Any, mode: str, frames: list[dict[str, Any]]) -> worker.Worker:
    config = {"device": "cpu", "home": str(tmp_path), "candidate_dir": str(tmp_path), "mode": "judge"}
    return worker.Worker(QueuedEndpoint(frames), config | {"compile_mode": mode})  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["max-autotune", "none"])
def test_modes_that_may_benchmark_while_compiling_wait_for_the_command_first(
    tmp_path: Any, mode: str
) -> None:
    load = {"type": "load"}
    w = gate_worker(tmp_path, mode, [load])
    with w.gated():
        assert w.pending is load  # received before the compile starts
    assert w.next_command() is load


def test_the_default_mode_compiles_at_once_and_waits_only_at_a_benchmark(tmp_path: Any) -> None:
    from torch._inductor.runtime import benchmarking

    load = {"type": "load"}
    w = gate_worker(tmp_path, "default", [load])
    with w.gated():
        assert w.pending is None
        benchmarking.benchmarker.benchmark_cpu(lambda: None, warmup=1, rep=1)
        assert w.pending is load
    assert w.next_command() is load
