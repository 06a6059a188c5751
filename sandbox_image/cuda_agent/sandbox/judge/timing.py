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

import bisect
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
_clone = torch.Tensor.clone
_copy = torch.Tensor.copy_

TIMED_PREFIX = "cuda_agent.judge.timed:"
FLUSH_RANGE = "cuda_agent.judge.flush"
# Refills and output checks between timed calls: their device work is neither timed nor "unattributed".
UNTIMED_RANGE = "cuda_agent.judge.untimed"


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


# A "near repeat" changes this many positions per float input of an earlier trial's values.
NEAR_REPEAT_POSITIONS = 64
# What one timed trial's values are drawn from: a seed (fresh values), or [earlier seed, salt] (a near
# repeat: the earlier trial's values with a few positions changed, which a cache keyed on a sample of
# the input values mistakes for a repeat and answers with a stale output).
Draw = int | list[int]


def near_repeat(values: list[Any], salt: int) -> list[Any]:
    """`values` with up to NEAR_REPEAT_POSITIONS positions of each float tensor overwritten by values
    from other positions of the same tensor (same distribution); reproducible from `salt` anywhere."""
    gen = torch.Generator(device="cpu").manual_seed(salt)
    changed: list[Any] = []
    for x in values:
        if type(x) is torch.Tensor and x.is_floating_point() and x.numel() > 1:
            x = _clone(x, memory_format=torch.contiguous_format)
            flat = x.view(-1)
            n = min(NEAR_REPEAT_POSITIONS, flat.numel())
            where = torch.unique(torch.randint(flat.numel(), (n,), generator=gen)).to(flat.device)
            source = torch.randint(flat.numel(), (where.numel(),), generator=gen).to(flat.device)
            flat[where] = flat[source]
        changed.append(x)
    return changed


def draw_values(make: Callable[[int], list[Any]], draw: Draw) -> list[Any]:
    """One trial's values (orchestrator and worker alike, so checked calls have exact references)."""
    if isinstance(draw, int):
        return make(draw)
    base, salt = draw
    return near_repeat(make(int(base)), int(salt))


class Feed:
    """Fresh input values for every timed trial, written in place into the one set of buffers all three
    functions are called with: pointer-keyed caches see new data, value-keyed caches never hit, and a
    sample of the calls is checked against the orchestrator's references for exactly those values.

    `make(seed)` draws a trial's values (the task's get_inputs under that seed); `refill()` copies them
    into the buffers, outside every timed window. With `per_call` (the task mutates its inputs) the
    buffers are refilled before each function's call, so every call sees the trial's values."""

    def __init__(self, make: Callable[[int], list[Any]], seed: int, per_call: bool) -> None:
        self.make: Callable[[Draw], list[Any]] = lambda draw: draw_values(make, draw)
        self.per_call = per_call
        self.values = make(seed)
        self.inputs = [_clone(x) if type(x) is torch.Tensor else x for x in self.values]
        # False while the buffers hold other values than `values` (host loop: checked after the window).
        self.current = True

    def load(self, draw: Draw) -> None:
        """Draw the next trial's values and write them into the buffers."""
        self.values = self.make(draw)
        self.current = True
        self.refill()

    def refill(self) -> None:
        for x, new in zip(self.inputs, self.values, strict=True):
            if type(x) is torch.Tensor:
                _copy(x, new)

    def before_call(self, first: bool) -> None:
        if self.per_call and not first:
            self.refill()


# Called after every timed call with (function name, trial index, output), outside the timed window.
AfterCall = Callable[[str, int, Any], None]
# Called before every call with (function name, loop, trial index), outside the timed window: the worker's
# baseline guard verifies and restores every process-wide setting there (worker.BaselineGuard).
BeforeCall = Callable[[str, str, int], None]


def _no_guard(name: str, loop: str, k: int) -> None:
    return None


class _Ranges:
    """The first of `spans` (in their order) containing a launch. The judge's own ranges follow each
    other without overlap, so one binary search finds it; should any overlap (ranges of the same names
    opened inside a call), every span is scanned in order, exactly as a plain search would."""

    def __init__(self, spans: list[kineto.Span]) -> None:
        self.spans = spans
        self.ordered = sorted(spans, key=lambda r: (r.start, r.end))
        self.starts = [r.start for r in self.ordered]
        self.nested = any(b.start <= a.end for a, b in zip(self.ordered, self.ordered[1:], strict=False))

    def first_containing(self, launch: kineto.Span | None) -> kineto.Span | None:
        if launch is None:
            return None
        if self.nested:
            return next((r for r in self.spans if r.contains(launch)), None)
        i = bisect.bisect_right(self.starts, launch.start) - 1
        return self.ordered[i] if i >= 0 and self.ordered[i].contains(launch) else None


def cuda_device_times(
    fns: dict[str, Callable[..., Any]],
    feed: Feed,
    seeds: list[Draw],
    flush_bytes: int,
    seed: int,
    after: AfterCall,
    before: BeforeCall = _no_guard,
) -> dict[str, Any]:
    """Device time per call (ms) for each function, attributed through profiler ranges. Trial k's values
    are loaded before its calls (own range, not timed); the L2 flush comes after them."""
    flush = torch.empty(max(flush_bytes, 1), dtype=torch.uint8, device="cuda")
    names = list(fns)
    trials = len(seeds)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False) as prof:
        for k, order in enumerate(_orders(names, trials, seed)):
            with _RecordFunction(UNTIMED_RANGE):
                feed.load(seeds[k])
            for i, name in enumerate(order):
                with _RecordFunction(UNTIMED_RANGE):
                    feed.before_call(i == 0)
                    before(name, "device", k)
                with _RecordFunction(FLUSH_RANGE):
                    flush.fill_(k & 0xFF)
                with _RecordFunction(f"{TIMED_PREFIX}{name}:{k}"):
                    out = fns[name](*feed.inputs)
                with _RecordFunction(UNTIMED_RANGE):
                    after(name, k, out)
                del out
        _cuda_synchronize()
    trace = kineto.read_trace(prof)
    ranges = _Ranges(trace.ranges(prefix=TIMED_PREFIX) + trace.ranges(name=FLUSH_RANGE))
    untimed = _Ranges(trace.ranges(name=UNTIMED_RANGE))
    device_ns: dict[str, int] = {}
    kernel_count: dict[str, int] = {}
    unattributed_ns = 0
    for work in trace.device:
        launch = work.launch
        owner = ranges.first_containing(launch)
        label = owner.name if owner is not None else None
        if label is None:
            if untimed.first_containing(launch) is None:
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
    fns: dict[str, Callable[..., Any]],
    feed: Feed,
    seeds: list[Draw],
    flush_bytes: int,
    seed: int,
    after: AfterCall,
    before: BeforeCall = _no_guard,
) -> dict[str, dict[str, float | None]]:
    """Host-inclusive latency per call: CUDA events on the current stream around each call (KernelBench),
    fresh values per trial as in `cuda_device_times`."""
    flush = torch.empty(max(flush_bytes, 1), dtype=torch.uint8, device="cuda")
    names = list(fns)
    pairs: dict[str, list[tuple[Any, Any]]] = {n: [] for n in names}
    for k, order in enumerate(_orders(names, len(seeds), seed + 1)):
        feed.load(seeds[k])
        for i, name in enumerate(order):
            feed.before_call(i == 0)
            before(name, "latency", k)
            flush.fill_(k & 0xFF)
            start, end = _CudaEvent(enable_timing=True), _CudaEvent(enable_timing=True)
            start.record()
            out = fns[name](*feed.inputs)
            end.record()
            pairs[name].append((start, end))
            after(name, k, out)
            del out
    _cuda_synchronize()
    return {n: summarize([s.elapsed_time(e) for s, e in pairs[n]]) for n in names}


def _snapshot(output: Any) -> Any:
    """Copies of an output's tensors (async, on the current stream), so a candidate that reuses one
    buffer for every call is checked on what this call returned; anything else is passed on as is."""
    if type(output) is torch.Tensor:
        return _clone(output, memory_format=torch.contiguous_format)
    if type(output) in (tuple, list) and all(type(x) is torch.Tensor for x in output):
        return type(output)(_clone(x, memory_format=torch.contiguous_format) for x in output)
    return output


def host_per_call_ms(
    fns: dict[str, Callable[..., Any]],
    feed: Feed,
    seeds: list[list[Draw]],
    after: AfterCall,
    checked: set[int],
    before: BeforeCall = _no_guard,
) -> dict[str, float]:
    """Wall time per call of K back-to-back calls between two full device synchronisations (min of rounds):
    hidden work anywhere on the device, or on the host, shows up here even if no profiler range saw it.

    Every call gets fresh values too (round r's K value sets, drawn before the first sync; each function
    sees each set once), copied in place right before the call, inside the measured window. What that
    refill costs is measured alone the same way (`refill` in the result) and subtracted, so the allowance
    the cross-check derives from eager's gap does not grow by it. The candidate's outputs of the
    `checked` calls are copied right after the call (the next call may reuse the buffer)."""
    best: dict[str, float] = {}
    for r, round_seeds in enumerate(seeds):
        pool = [feed.make(s) for s in round_seeds]
        for name, fn in [("refill", None), *fns.items()]:
            before(name, "host", r)
            _cuda_synchronize()
            t0 = _perf_counter_ns()
            outs = []
            for j, values in enumerate(pool):
                for x, new in zip(feed.inputs, values, strict=True):
                    if type(x) is torch.Tensor:
                        _copy(x, new)
                if fn is not None:
                    out = fn(*feed.inputs)
                    # Unchecked plain-tensor outputs are dropped at once, as an ordinary caller would,
                    # so the allocator recycles them exactly as in the other loops.
                    if name == "candidate" and r * len(pool) + j in checked:
                        outs.append(_snapshot(out))
                    else:
                        outs.append(None if type(out) is torch.Tensor else out)
                    del out
            _cuda_synchronize()
            per_call = (_perf_counter_ns() - t0) / 1e6 / max(len(pool), 1)
            best[name] = min(best.get(name, per_call), per_call)
            # Checked only after the window; each output was produced from pool[j], the values of call j.
            for j, kept in enumerate(outs):
                if kept is not None:
                    feed.values, feed.current = pool[j], j == len(pool) - 1
                    after(name, r * len(pool) + j, kept)
            feed.current = True
            del outs
        del pool
    refill = best.pop("refill", 0.0)
    result = {name: max(ms - refill, 0.0) for name, ms in best.items()}
    result["refill"] = refill
    return result


def cpu_wall_times(
    fns: dict[str, Callable[..., Any]],
    feed: Feed,
    seeds: list[Draw],
    thrash_bytes: int,
    seed: int,
    after: AfterCall,
    before: BeforeCall = _no_guard,
) -> dict[str, dict[str, float | None]]:
    """Wall-clock ms per call on the CPU, interleaved, after writing a cache-sized buffer; fresh values per
    trial, loaded before the thrash write."""
    thrash = torch.empty(max(thrash_bytes, 1), dtype=torch.uint8)
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for k, order in enumerate(_orders(names, len(seeds), seed)):
        feed.load(seeds[k])
        for i, name in enumerate(order):
            feed.before_call(i == 0)
            before(name, "wall", k)
            thrash.fill_(k & 0xFF)
            t0 = _perf_counter_ns()
            out = fns[name](*feed.inputs)
            samples[name].append((_perf_counter_ns() - t0) / 1e6)
            after(name, k, out)
            del out
    return {n: summarize(samples[n]) for n in names}
