"""Reading torch.profiler (kineto) results: which host call launched each piece of device work.

Every device activity (kernel, memcpy, memset) shares its CUPTI correlation id with the runtime/driver
API call that launched it (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch...); that call has a host
thread and timestamp, so the judge's own profiler ranges (forward, extension call, timed call) attribute
device work by containment. The op-level link kineto also offers exists only when an aten op encloses
the launch, which is not the case for a kernel launched directly from extension code (seen on the H200).
Device-side copies of user annotations (`gpu_user_annotation`) are spans, not work, and are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch._C._autograd import DeviceType

RUNTIME_API = re.compile(r"^cu(?:da)?[A-Z]\w*$")


@dataclass(frozen=True)
class Span:
    """A host-side interval on one thread: an op, a record_function range or a runtime API call."""

    name: str
    start: int
    end: int
    thread: int

    def contains(self, other: Span) -> bool:
        return (
            self.thread == other.thread
            and self.start <= other.start
            and other.end <= self.end
            and self != other
        )

    def overlaps_time(self, other: Span) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class DeviceWork:
    """One device activity and the runtime call that launched it (None when the profiler lost it)."""

    name: str
    stream: int
    ns: int
    launch: Span | None


@dataclass
class Trace:
    host: list[Span]  # frontend ops and record_function ranges (no runtime calls)
    device: list[DeviceWork]

    def ranges(self, name: str | None = None, prefix: str | None = None) -> list[Span]:
        return [
            s
            for s in self.host
            if (name is not None and s.name == name) or (prefix is not None and s.name.startswith(prefix))
        ]


def read_trace(prof: Any) -> Trace:
    """Host spans and attributed device work from a finished torch.profiler.profile."""
    events = prof.profiler.kineto_results.events()
    host: list[Span] = []
    runtime: dict[int, Span] = {}
    annotations: set[str] = set()
    for e in events:
        if e.device_type() != DeviceType.CPU:
            continue
        span = Span(e.name(), e.start_ns(), e.end_ns(), e.start_thread_id())
        if RUNTIME_API.match(e.name()):
            runtime[e.correlation_id()] = span
        else:
            host.append(span)
            if e.is_user_annotation():
                annotations.add(e.name())
    device = [
        DeviceWork(e.name(), e.device_resource_id(), e.duration_ns(), runtime.get(e.correlation_id()))
        for e in events
        if e.device_type() == DeviceType.CUDA and not e.is_user_annotation() and e.name() not in annotations
    ]
    return Trace(host, device)
