"""Interleaved, repeatable timing of candidate, eager and torch.compile (worker side).

CUDA: the reward uses device time per call = the sum of the durations of all device activities (kernels,
memcpy, memset, on every stream) launched inside that call's profiler range, after an L2 flush. This is the
method MEASUREMENTS.md found to repeat within 0.4 % (host launch overhead is not in it; work on a side
stream is). Per-call CUDA-event latency (host overhead included) is measured in a second loop and
reported as `latency_ms`; a third loop brackets K calls with full device synchronisations for the
host-side cross-check. CPU: wall clock per call around each call, after a cache-thrashing write.
All three functions run interleaved in a shuffled order per trial, under one precision policy.
Timer functions are bound here, at import, before any candidate code exists in the process.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from cuda_agent.sandbox.judge import kineto

_perf_counter_ns = time.perf_counter_ns
_cuda_synchronize = torch.cuda.synchronize
_CudaEvent: Any = torch.cuda.Event
_RecordFunction: Any = record_function

TIMED_PREFIX = "cuda_agent.judge.timed:"
FLUSH_RANGE = "cuda_agent.judge.flush"


def summarize(samples_ms: list[float]) -> dict[str, float | None]:
    """Median and coefficient of variation, the first (cold) trial dropped."""
    kept = samples_ms[1:] if len(samples_ms) > 1 else samples_ms
    if not kept:
        return {"median": None, "cv": None}
    mean = statistics.fmean(kept)
    cv = statistics.pstdev(kept) / mean if mean > 0 and len(kept) > 1 else 0.0
    return {"median": statistics.median(kept), "cv": cv}


def _orders(names: list[str], trials: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    orders = []
    for _ in range(trials):
        order = names[:]
        rng.shuffle(order)
        orders.append(order)
    return orders


def cuda_device_times(
    fns: dict[str, Callable[..., Any]], inputs: list[Any], trials: int, flush_bytes: int, seed: int
) -> dict[str, Any]:
    """Device time per call (ms) for each function, attributed through profiler ranges."""
    flush = torch.empty(max(flush_bytes, 1), dtype=torch.uint8, device="cuda")
    names = list(fns)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False) as prof:
        for k, order in enumerate(_orders(names, trials, seed)):
            for name in order:
                with _RecordFunction(FLUSH_RANGE):
                    flush.fill_(k & 0xFF)
                with _RecordFunction(f"{TIMED_PREFIX}{name}:{k}"):
                    fns[name](*inputs)
        _cuda_synchronize()
    trace = kineto.read_trace(prof)
    ranges = trace.ranges(prefix=TIMED_PREFIX) + trace.ranges(name=FLUSH_RANGE)
    device_ns: dict[str, int] = {}
    kernel_count: dict[str, int] = {}
    unattributed_ns = 0
    for work in trace.device:
        launch = work.launch
        label = next((r.name for r in ranges if launch is not None and r.contains(launch)), None)
        if label is None:
            unattributed_ns += work.ns
        elif label != FLUSH_RANGE:
            device_ns[label] = device_ns.get(label, 0) + work.ns
            kernel_count[label] = kernel_count.get(label, 0) + 1
    result: dict[str, Any] = {"unattributed_ms": unattributed_ns / 1e6}
    for name in names:
        samples = [device_ns.get(f"{TIMED_PREFIX}{name}:{k}", 0) / 1e6 for k in range(trials)]
        counts = [kernel_count.get(f"{TIMED_PREFIX}{name}:{k}", 0) for k in range(trials)]
        result[name] = {**summarize(samples), "kernels_per_call": statistics.median(counts) if counts else 0}
    return result


def cuda_event_latency(
    fns: dict[str, Callable[..., Any]], inputs: list[Any], trials: int, flush_bytes: int, seed: int
) -> dict[str, dict[str, float | None]]:
    """Host-inclusive latency per call: CUDA events on the current stream around each call (KernelBench)."""
    flush = torch.empty(max(flush_bytes, 1), dtype=torch.uint8, device="cuda")
    names = list(fns)
    pairs: dict[str, list[tuple[Any, Any]]] = {n: [] for n in names}
    for k, order in enumerate(_orders(names, trials, seed + 1)):
        for name in order:
            flush.fill_(k & 0xFF)
            start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
            start.record()
            fns[name](*inputs)
            end.record()
            pairs[name].append((start, end))
    _cuda_synchronize()
    return {n: summarize([s.elapsed_time(e) for s, e in pairs[n]]) for n in names}


def host_per_call_ms(
    fns: dict[str, Callable[..., Any]], inputs: list[Any], calls: int, rounds: int
) -> dict[str, float]:
    """Wall time per call of K back-to-back calls between two full device synchronisations (min of rounds):
    hidden work anywhere on the device, or on the host, shows up here even if no profiler range saw it."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            _cuda_synchronize()
            t0 = _perf_counter_ns()
            for _ in range(calls):
                fn(*inputs)
            _cuda_synchronize()
            per_call = (_perf_counter_ns() - t0) / 1e6 / calls
            best[name] = min(best.get(name, per_call), per_call)
    return best


def cpu_wall_times(
    fns: dict[str, Callable[..., Any]], inputs: list[Any], trials: int, thrash_bytes: int, seed: int
) -> dict[str, dict[str, float | None]]:
    """Wall-clock ms per call on the CPU, interleaved, after writing a cache-sized buffer."""
    thrash = torch.empty(max(thrash_bytes, 1), dtype=torch.uint8)
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for k, order in enumerate(_orders(names, trials, seed)):
        for name in order:
            thrash.fill_(k & 0xFF)
            t0 = _perf_counter_ns()
            fns[name](*inputs)
            samples[name].append((_perf_counter_ns() - t0) / 1e6)
    return {n: summarize(samples[n]) for n in names}
