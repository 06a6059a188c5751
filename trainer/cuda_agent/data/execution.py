"""The filters that execute a task: runs_eager, deterministic, nontrivial_output, runtime, runs_compiled.

Standard library and torch only, no project imports: the same file runs in a local filter worker and,
copied into a sandbox session's workspace, as a script inside the sandbox pool, where code written by an
LLM composer is confined like agent code:

    python data_filter.py SETTINGS.json TASK.py      -> one JSON line: [{"filter", "passed", "detail"}...]

Settings (FilterConfig's fields): device, seed, min_runtime_ms, max_runtime_ms, runtime_repeats,
compile_backend, compile_rtol, compile_atol, timeout_s. Filters run in EXECUTION_FILTERS order and stop
at the first failure.

`measure(code, settings)` times a task the way the runtime filter does and reports its peak memory: the
composer's calibration (calibrate.py) sizes tasks with it before they are filtered.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXECUTION_FILTERS = ("runs_eager", "deterministic", "nontrivial_output", "runtime", "runs_compiled")
Verdict = dict[str, Any]


def load_task(code: str, name: str = "task") -> types.ModuleType:
    """Execute task source as a fresh module. Only where running the task's code is acceptable: a filter
    worker process or a sandbox session, never the control plane."""
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(code, f"<{name}>", "exec"), module.__dict__)
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise ValueError(f"task {name} defines no {required}")
    return module


class _Run:
    """What the filters share: the loaded task, the model, its inputs and eager output."""

    def __init__(self, code: str, settings: dict[str, Any]) -> None:
        self.code = code
        self.settings = settings
        self.task: Any = None
        self.model: Any = None
        self.inputs: list[Any] = []
        self.output: Any = None

    def sync(self) -> None:
        import torch

        if self.settings["device"] == "cuda":
            torch.cuda.synchronize()

    def draw_inputs(self, seed: int) -> list[Any]:
        import torch

        torch.manual_seed(seed)
        device = torch.device(self.settings["device"])
        # Drawn on the target device (the task's torch.randn follows the default device): a GPU-sized
        # input drawn on the host and copied over takes seconds per draw.
        with device:
            inputs = self.task.get_inputs()
        return [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]

    def build(self) -> Any:
        import torch

        torch.manual_seed(self.settings["seed"])
        device = torch.device(self.settings["device"])
        with device:  # parameters initialised where they will live, for the same reason
            model = self.task.Model(*self.task.get_init_inputs())
        return model.to(device)

    def forward(self, inputs: list[Any]) -> Any:
        import torch

        with torch.no_grad():
            out = self.model(*inputs)
        self.sync()
        return out


def _verdict(name: str, passed: bool, detail: str = "", value: float | None = None) -> Verdict:
    return {"filter": name, "passed": bool(passed), "detail": detail[:300], "value": value}


def runs_eager(run: _Run) -> Verdict:
    import torch

    try:
        run.task = load_task(run.code)
        run.model = run.build()
        run.inputs = run.draw_inputs(run.settings["seed"])
        run.output = run.forward(run.inputs)
    except Exception as exc:  # any error of the task's own code is this filter's verdict
        return _verdict("runs_eager", False, f"{type(exc).__name__}: {exc}")
    if not isinstance(run.output, torch.Tensor):
        return _verdict("runs_eager", False, f"forward returns {type(run.output).__name__}")
    return _verdict("runs_eager", True, f"output {tuple(run.output.shape)} {run.output.dtype}")


def deterministic(run: _Run) -> Verdict:
    import torch

    again = run.forward([t.clone() if isinstance(t, torch.Tensor) else t for t in run.inputs])
    same = isinstance(again, torch.Tensor) and again.shape == run.output.shape
    if same and again.is_floating_point():
        # Bitwise, except that NaN equals NaN: a NaN output is nontrivial_output's to reject.
        same = torch.allclose(again, run.output, rtol=0.0, atol=0.0, equal_nan=True)
    elif same:
        same = torch.equal(again, run.output)
    return _verdict("deterministic", same, "" if same else "two runs on the same inputs differ")


def nontrivial_output(run: _Run) -> Verdict:
    import torch

    out = run.output
    value = out if out.is_floating_point() else out.float()
    if not bool(torch.isfinite(value).all()):
        return _verdict("nontrivial_output", False, "output has NaN or Inf")
    if value.numel() > 1 and bool((value == value.flatten()[0]).all()):
        return _verdict("nontrivial_output", False, "output is constant")
    other = run.forward(run.draw_inputs(run.settings["seed"] + 1))
    if other.shape == out.shape and torch.allclose(other.float(), value.float(), rtol=1e-5, atol=1e-6):
        return _verdict("nontrivial_output", False, "same output for different inputs")
    return _verdict("nontrivial_output", True)


def _median_ms(run: _Run) -> float:
    """Median wall time of `runtime_repeats` synchronized eager forwards after one warm-up."""
    run.forward(run.inputs)  # warm-up (allocator, lazy kernel loading)
    times = []
    for _ in range(run.settings["runtime_repeats"]):
        start = time.perf_counter()
        run.forward(run.inputs)  # synchronizes on CUDA, so wall time is device time plus launch
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def runtime(run: _Run) -> Verdict:
    settings = run.settings
    median = _median_ms(run)
    low, high = settings["min_runtime_ms"], settings["max_runtime_ms"]
    passed = low <= median <= high
    detail = f"median {median:.3f} ms on {settings['device']}, bounds [{low}, {high}] ms"
    return _verdict("runtime", passed, detail, median)


def runs_compiled(run: _Run) -> Verdict:
    import torch

    settings = run.settings
    try:
        torch._dynamo.reset()
        compiled = torch.compile(run.model, backend=settings["compile_backend"])
        with torch.no_grad():
            out = compiled(*run.inputs)  # type: ignore[no-untyped-call]
        run.sync()
    except Exception as exc:  # a compile or run error of this task is the verdict
        return _verdict("runs_compiled", False, f"{type(exc).__name__}: {exc}")
    if not isinstance(out, torch.Tensor) or out.shape != run.output.shape:
        return _verdict("runs_compiled", False, "compiled output has another shape")
    if out.is_floating_point():
        close = torch.allclose(out, run.output, rtol=settings["compile_rtol"], atol=settings["compile_atol"])
    else:
        close = torch.equal(out, run.output)
    detail = "" if close else f"max abs diff {(out.double() - run.output.double()).abs().max().item():.3g}"
    return _verdict("runs_compiled", close, detail)


FILTERS: dict[str, Callable[[_Run], Verdict]] = {
    "runs_eager": runs_eager,
    "deterministic": deterministic,
    "nontrivial_output": nontrivial_output,
    "runtime": runtime,
    "runs_compiled": runs_compiled,
}


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in this thread after `seconds` (SIGALRM; main thread only, else no limit).
    A timer already set (pytest-timeout's) is put back with what was left of it."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"the task's filters ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    started = time.monotonic()
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - started), 0.001))


def run_filters(code: str, settings: dict[str, Any], enabled: Sequence[str]) -> list[Verdict]:
    """Verdicts of the enabled execution filters, in order, up to and including the first failure.
    runs_eager always runs when any of them is enabled: the others read what it leaves behind. A task
    that runs past settings["timeout_s"] fails the filter it was in (Python-level code is interrupted;
    a single long native op finishes first)."""
    wanted = [name for name in EXECUTION_FILTERS if name in enabled]
    if not wanted:
        return []
    if "runs_eager" not in wanted:
        wanted.insert(0, "runs_eager")
    run = _Run(code, settings)
    verdicts: list[Verdict] = []
    with _deadline(float(settings.get("timeout_s", 0))):
        for name in wanted:
            try:
                verdict = FILTERS[name](run)
            except Exception as exc:  # a task that breaks a check (odd output types, time) fails it
                verdict = _verdict(name, False, f"{type(exc).__name__}: {exc}")
            verdicts.append(verdict)
            if not verdict["passed"]:
                break
    return verdicts


def _tensor_bytes(values: Any) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))


def measure(code: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The median eager forward time (as the runtime filter times it) and the peak memory of a task,
    for the composer's calibration (calibrate.py); not a filter: the runtime filter re-times the task
    the calibration settles on. On cuda `peak_bytes` is the allocator's peak while the task was built
    and run; on cpu it is the bytes of inputs, parameters and output (a lower bound). `device_bytes`
    is the device's total memory (cuda) or the host's (cpu). A task that fails reports `error`."""
    import torch

    cuda = settings["device"] == "cuda"
    result: dict[str, Any] = {"ms": None, "peak_bytes": None, "device_bytes": None, "error": ""}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
        result["device_bytes"] = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    else:
        result["device_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    run = _Run(code, settings)
    try:
        with _deadline(float(settings.get("timeout_s", 0))):
            built = runs_eager(run)
            if not built["passed"]:
                result["error"] = built["detail"]
                return result
            result["ms"] = _median_ms(run)
        if cuda:
            result["peak_bytes"] = torch.cuda.max_memory_allocated() - baseline
        else:
            params = [*run.model.parameters(), *run.model.buffers()]
            result["peak_bytes"] = _tensor_bytes([*run.inputs, *params, run.output])
    except Exception as exc:  # out of memory, a timeout, an error in the task: no measurement
        result["ms"], result["error"] = None, f"{type(exc).__name__}: {exc}"[:300]
    finally:
        del run
        if cuda:  # give the cached blocks back: the next task (or filter) measures from a clean device
            gc.collect()
            torch.cuda.empty_cache()
    return result


def main(argv: Sequence[str]) -> int:
    settings = json.loads(Path(argv[0]).read_text())
    code = Path(argv[1]).read_text()
    print(json.dumps(run_filters(code, settings, settings["enabled"])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
