"""What the candidate's forward actually did, observed from three independent sources (worker side).

1. A TorchDispatchMode records every aten op that reaches the dispatcher, with whether a function of the
   candidate's extension was executing at that moment (from 2).
2. `sys.setprofile` sees each call of a function of the candidate's extension (pybind11 functions are C
   functions: c_call / c_return) and opens a profiler range around it.
3. torch.profiler records op events (RecordFunction: a second op source the candidate cannot pop from
   Python) and, on CUDA, every kernel with its stream, duration and the op or range that launched it.
The worker only observes and reports; the orchestrator turns observations into violations (policy.py).
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_agent.sandbox.judge import kineto

# torch leaves these untyped; bound once as Any so typed judge code can call them.
_RecordFunction: Any = record_function
_memory_snapshot: Any = torch.cuda.memory_snapshot

FORWARD_RANGE = "cuda_agent.judge.forward"
MARKER_RANGE = "cuda_agent.judge.marker"
EXT_RANGE_PREFIX = "cuda_agent.ext::"
IGNORED_NAMESPACES = ("profiler::",)
MAX_KERNEL_RECORDS = 256


class ExtensionRegistry:
    """The candidate's extension functions (by identity) and custom ops (by name)."""

    def __init__(self) -> None:
        self.functions: dict[int, str] = {}
        self._keep: list[Any] = []
        self.modules: set[str] = set()
        self.custom_ops: set[str] = set()
        self._baseline_ops = set(torch._C._dispatch_get_all_op_names())

    def add_module(self, module: types.ModuleType) -> None:
        self.modules.add(module.__name__)
        for name, value in list(vars(module).items()):
            if isinstance(value, types.BuiltinFunctionType):
                self.functions[id(value)] = f"{module.__name__}.{name}"
                self._keep.append(value)

    def refresh_custom_ops(self) -> None:
        """Ops registered since start-up (TORCH_LIBRARY in the candidate's extension) are its own kernels."""
        self.custom_ops = set(torch._C._dispatch_get_all_op_names()) - self._baseline_ops

    def name_of(self, fn: Any) -> str | None:
        hit = self.functions.get(id(fn))
        if hit is not None:
            return hit
        module = getattr(fn, "__module__", None)
        if isinstance(module, str) and module in self.modules:
            return f"{module}.{getattr(fn, '__name__', '?')}"
        return None


@dataclass
class _State:
    registry: ExtensionRegistry
    depth: int = 0
    ext_calls: Counter[str] = field(default_factory=Counter)
    ops: Counter[tuple[str, bool]] = field(default_factory=Counter)
    ranges: list[Any] = field(default_factory=list)


class _OpRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch leaves the base untyped
    def __init__(self, state: _State) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.state = state

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(func._schema.name)
        if name in self.state.registry.custom_ops:
            self.state.ext_calls[name] += 1
            self.state.depth += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.state.depth -= 1
        if not name.startswith(IGNORED_NAMESPACES):
            self.state.ops[(name, self.state.depth > 0)] += 1
        return func(*args, **kwargs)


def _profile_hook(state: _State) -> Callable[[Any, str, Any], None]:
    registry = state.registry

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call":
            name = registry.name_of(arg)
            if name is not None:
                state.depth += 1
                state.ext_calls[name] += 1
                rf = _RecordFunction(EXT_RANGE_PREFIX + name)
                rf.__enter__()
                state.ranges.append(rf)
        elif event in ("c_return", "c_exception") and registry.name_of(arg) is not None and state.ranges:
            state.depth -= 1
            state.ranges.pop().__exit__(None, None, None)

    return hook


def profiler_activities(device: str) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device == "cuda" else [ProfilerActivity.CPU]


@dataclass
class CallRecord:
    """One observed forward call: outputs plus everything the recorders saw."""

    output: Any
    ops: list[tuple[str, bool, int]]
    profiler_ops: list[tuple[str, bool]]
    ext_calls: dict[str, int]
    kernels: list[dict[str, Any]]
    current_stream: int | None
    profiler_error: str | None
    balanced: bool


def observed_call(
    fn: Callable[..., Any],
    inputs: list[Any],
    registry: ExtensionRegistry,
    device: str,
    after: Callable[[Any], None],
) -> CallRecord:
    """Run fn(*inputs) under all three recorders; `after(output)` runs inside the profiling window
    (after the call, before the final full synchronisation) so late device work is still captured."""
    state = _State(registry)
    marker = torch.zeros(1, device=device) if device == "cuda" else None
    prof: Any = profile(activities=profiler_activities(device), record_shapes=False)
    profiler_error = None
    try:
        prof.__enter__()
    except Exception as exc:  # kineto/CUPTI unavailable: the other two sources still run
        profiler_error = f"{type(exc).__name__}: {exc}"
        prof = None
    output: Any = None
    try:
        if marker is not None:
            with _RecordFunction(MARKER_RANGE):
                marker.fill_(1.0)
        hook = _profile_hook(state)
        with _RecordFunction(FORWARD_RANGE), _OpRecorder(state):
            sys.setprofile(hook)
            try:
                output = fn(*inputs)
            finally:
                sys.setprofile(None)
        after(output)
        if device == "cuda":
            torch.cuda.synchronize()
    finally:
        sys.setprofile(None)
        while state.ranges:
            state.ranges.pop().__exit__(None, None, None)
        if prof is not None:
            prof.__exit__(None, None, None)
    profiler_ops: list[tuple[str, bool]] = []
    kernels: list[dict[str, Any]] = []
    current_stream = None
    if prof is not None:
        try:
            profiler_ops, kernels, current_stream = _parse_profile(prof, registry.custom_ops)
        except Exception as exc:
            profiler_error = f"parse: {type(exc).__name__}: {exc}"
    return CallRecord(
        output=output,
        ops=[(name, in_ext, count) for (name, in_ext), count in state.ops.items()],
        profiler_ops=profiler_ops,
        ext_calls=dict(state.ext_calls),
        kernels=kernels,
        current_stream=current_stream,
        profiler_error=profiler_error,
        balanced=state.depth == 0,
    )


def _parse_profile(
    prof: Any, custom_ops: set[str]
) -> tuple[list[tuple[str, bool]], list[dict[str, Any]], int | None]:
    trace = kineto.read_trace(prof)
    forward = trace.ranges(name=FORWARD_RANGE)
    markers = trace.ranges(name=MARKER_RANGE)
    # Ranges where the candidate's own code runs: its pybind11 functions and its registered custom ops.
    ext = [s for s in trace.host if s.name.startswith(EXT_RANGE_PREFIX) or s.name in custom_ops]
    ops = [
        s
        for s in trace.host
        if "::" in s.name
        and s.name not in custom_ops
        and not s.name.startswith(("cuda_agent.", *IGNORED_NAMESPACES))
    ]
    in_forward = [s for s in ops if any(f.contains(s) for f in forward)]
    # Leaves only: composite ops (matmul -> mm) are judged by what they decompose into.
    leaves = [s for s in in_forward if not any(s.contains(o) for o in in_forward)]
    profiler_ops = sorted({(s.name, any(r.contains(s) for r in ext)) for s in leaves})
    kernels: list[dict[str, Any]] = []
    current_stream = None
    for work in trace.device:
        launch = work.launch
        if launch is not None and any(m.contains(launch) for m in markers):
            current_stream = work.stream
            continue
        in_ext = False
        if launch is None:
            origin = "unattributed"
        elif any(f.contains(launch) for f in forward):
            enclosing = [o for o in in_forward if o.contains(launch)]
            in_ext = any(r.contains(launch) for r in ext)
            if enclosing:
                origin = min(enclosing, key=lambda o: o.end - o.start).name
            else:
                origin = "extension" if in_ext else "python"
        elif any(f.overlaps_time(launch) for f in forward):
            origin = "other-thread"
        else:
            continue  # the judge's own work outside the forward window
        if len(kernels) < MAX_KERNEL_RECORDS:
            kernels.append(
                {"name": work.name, "stream": work.stream, "ns": work.ns, "origin": origin, "in_ext": in_ext}
            )
    return profiler_ops, kernels, current_stream


def poison_free_memory(device: str, extra_sizes: Sequence[int]) -> None:
    """Fill freed memory with 0xFF bytes (NaN for every float type) so a candidate that returns an
    uninitialised buffer hands back NaN instead of a stale copy of the reference."""
    sizes = [int(n) for n in extra_sizes if n > 0]
    if device == "cuda":
        for segment in _memory_snapshot():
            for block in segment.get("blocks", []):
                if block.get("state") == "inactive" and len(sizes) < 1024:
                    sizes.append(int(block["size"]))
    held = []
    for n in sizes:
        buffer = torch.empty(n, dtype=torch.uint8, device=device)
        buffer.fill_(0xFF)
        held.append(buffer)
    del held
