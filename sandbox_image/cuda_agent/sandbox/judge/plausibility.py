"""Physical plausibility of a candidate's time (orchestrator side, trusted; docs/judge.md, "Plausibility").

A time is implausible when the work the task cannot avoid would have to move faster than the device can:
- bytes: every input tensor the output provably depends on is read once from device memory (the L2 is
  flushed before each timed call), and every output byte beyond what the L2 can hold is written once;
- FLOPs: the matmul-family ops (mm, addmm, bmm, baddbmm) the task's reference runs, counted by torch's
  FlopCounterMode. Convolutions are left out on purpose: Winograd and FFT algorithms (cuDNN picks them)
  need fewer multiplications than the direct count, so that count is not a lower bound.
The device's limits are measured once per device and driver, in the trusted phase, and cached in the
judge's cache; measured values are never allowed to undercut the device's specification (a measurement
taken while something else ran would otherwise fail honest candidates for as long as it stays cached).
On CPU the same numbers are computed and reported but not enforced (see `judge_speed`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import platform
import random
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from cuda_agent.api.judge import Roofline
from cuda_agent.sandbox.judge.config import JudgeConfig

# Positions perturbed per input tensor to decide whether the output depends on it.
PROBES = 8
MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm"})
# Dense FLOP per clock per SM by compute capability (vendor datasheets: A100, H100): the fastest matmul
# mode matters, because fp32 accuracy can be emulated on tensor cores (3xTF32, Ozaki) above fp32's rate.
SPEC_FLOP_PER_CLOCK_SM = {(8, 0): 2048, (9, 0): 4096}
CACHE_VERSION = 1


@dataclass(frozen=True)
class TaskBounds:
    """What the task's own reference proves about the work: bytes read and written, matmul FLOPs."""

    input_bytes: int
    output_bytes: int
    matmul_flops: float
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DeviceLimits:
    """One device's measured ceilings, with the specification's where the device reports them."""

    key: str
    device: str
    name: str
    copy_gbs: float  # device-to-device copy, read + write bytes per second / 1e9
    read_gbs: float  # a full-tensor reduction: bytes read per second / 1e9
    spec_gbs: float | None  # memory clock x bus width (GPU only)
    cache_bytes: int  # last-level cache (L2 on a GPU) that outputs may stay in
    tflops: float  # measured peak of a large matmul in the fastest dtype tried
    spec_tflops: float | None

    @property
    def bandwidth_limit_gbs(self) -> float:
        return max(self.copy_gbs, self.read_gbs, self.spec_gbs or 0.0)

    @property
    def tflops_limit(self) -> float:
        return max(self.tflops, self.spec_tflops or 0.0)


@dataclass
class SpeedOutcome:
    roofline: Roofline
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --- the task's side ------------------------------------------------------------------------------------


def _storage_bytes(x: torch.Tensor) -> int:
    """Bytes a tensor's values occupy: an expanded (stride-0) view counts its storage, not its numel."""
    return min(x.numel() * x.element_size(), x.untyped_storage().nbytes())


def _outputs(model: torch.nn.Module, inputs: list[Any]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*inputs)
    leaves = [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]
    return [t.detach().clone() for t in leaves]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape
        and x.dtype == y.dtype
        and bool(torch.equal(x.nan_to_num(7.0), y.nan_to_num(7.0)))
        and bool(torch.equal(x.isnan(), y.isnan()))
        for x, y in zip(a, b, strict=True)
    )


def _influences(model: torch.nn.Module, inputs: list[Any], index: int, base: list[torch.Tensor]) -> bool:
    """Whether every probed element of inputs[index] changes the output when moved far up or down:
    only then is the whole tensor counted as read. Finite changes only: an element whose value matters
    only as NaN (x * 0) need not be read by a correct kernel. A raise counts as a change."""
    x = inputs[index]
    rng = random.Random(index)
    for position in rng.sample(range(x.numel()), min(PROBES, x.numel())):
        changed = False
        for sign in (1.0, -1.0):
            probe = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
            probe[index] = probe[index].contiguous()
            flat = probe[index].view(-1)
            flat[position] += sign * 1e4 * (1.0 + abs(float(flat[position])))
            try:
                changed = not _same(_outputs(model, probe), base)
            except Exception:
                changed = True
            if changed:
                break
        if not changed:
            return False
    return True


def task_bounds(model: torch.nn.Module, inputs: list[Any], device: str) -> TaskBounds:
    """Bytes and matmul FLOPs the reference proves necessary on `inputs` (one draw of the task's own)."""
    notes: list[str] = []
    with FlopCounterMode(display=False) as counter:
        base = _outputs(model, inputs)
    flops = 0.0
    for op, count in counter.get_flop_counts().get("Global", {}).items():
        if str(op).rsplit(".", 1)[-1] in MATMUL_OPS:
            flops += float(count)
    seen: set[int] = set()
    input_bytes = 0
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            continue
        ptr = x.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        if _influences(model, inputs, i, base):
            input_bytes += _storage_bytes(x)
        else:
            notes.append(f"plausibility: input {i} is not provably read in full; not counted")
    output_bytes = sum(t.nbytes for t in base)
    if device == "cuda":
        torch.cuda.synchronize()
    return TaskBounds(input_bytes, output_bytes, flops, notes)


# --- the device's side ----------------------------------------------------------------------------------


def _cuda_driver_version() -> int:
    version = ctypes.c_int(0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    return version.value


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_cache_bytes() -> int:
    """The largest cache level of CPU 0 (sysfs), or 64 MiB when unknown."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        with contextlib.suppress(OSError, ValueError):
            text = path.read_text().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=64 << 20)


def device_identity(device: str) -> tuple[str, str]:
    """(cache key, device name): the name, driver, torch version and device UUID (GPU) or model (CPU)."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name = props.name
        parts = [device, name, str(props.uuid), str(_cuda_driver_version()), torch.__version__]
    else:
        name = _cpu_name()
        parts = [device, name, platform.release(), torch.__version__]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20], name


@contextlib.contextmanager
def _matmul_precision(allow_tf32: bool) -> Iterator[None]:
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.set_float32_matmul_precision("high" if allow_tf32 else "highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def _cuda_ms(fn: Any, reps: int) -> float:
    """Best of three: ms per call of `reps` back-to-back calls between two CUDA events."""
    fn()
    best = float("inf")
    for _ in range(3):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / reps)
    return best


def _cuda_memory_ms(nbytes: int) -> tuple[float, float]:
    """(ms per copy of `nbytes`, ms per full read of them as float32)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    floats = src.view(torch.float32)
    return _cuda_ms(lambda: dst.copy_(src), 5), _cuda_ms(lambda: floats.sum(), 5)


# (dtype, n, TF32 allowed) of the square matmuls timed for the measured peak.
_PEAK_MATMULS = (
    (torch.float32, 4096, False),
    (torch.float32, 4096, True),
    (torch.bfloat16, 8192, False),
    (torch.float16, 8192, False),
)


def _cuda_matmul_tflops(dtype: torch.dtype, n: int, tf32: bool) -> float:
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    with _matmul_precision(tf32):
        ms = _cuda_ms(lambda: torch.mm(a, b), 3)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def _measure_cuda(key: str, name: str) -> DeviceLimits:
    props = torch.cuda.get_device_properties(0)
    nbytes = min(1 << 30, props.total_memory // 16)
    copy_ms, read_ms = _cuda_memory_ms(nbytes)
    tflops = max(_cuda_matmul_tflops(*spec) for spec in _PEAK_MATMULS)
    torch.cuda.empty_cache()
    spec_gbs = None
    if props.memory_clock_rate and props.memory_bus_width:
        spec_gbs = 2 * props.memory_clock_rate * 1e3 * props.memory_bus_width / 8 / 1e9
    per_clock = SPEC_FLOP_PER_CLOCK_SM.get((props.major, props.minor))
    spec_tflops = None
    if per_clock and props.clock_rate:
        spec_tflops = per_clock * props.multi_processor_count * props.clock_rate * 1e3 / 1e12
    return DeviceLimits(
        key=key,
        device="cuda",
        name=name,
        copy_gbs=2 * nbytes / (copy_ms * 1e-3) / 1e9,
        read_gbs=nbytes / (read_ms * 1e-3) / 1e9,
        spec_gbs=spec_gbs,
        cache_bytes=int(props.L2_cache_size),
        tflops=tflops,
        spec_tflops=spec_tflops,
    )


def _cpu_seconds(fn: Any, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _cpu_memory_seconds(nbytes: int) -> tuple[float, float]:
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _cpu_seconds(lambda: dst.copy_(src), 3), _cpu_seconds(lambda: src.sum(), 3)


def _measure_cpu(key: str, name: str) -> DeviceLimits:
    """One thread, as the CPU timing runs (torch.set_num_threads(1))."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cache = _cpu_cache_bytes()
        nbytes = max(256 << 20, 4 * cache)
        copy_s, read_s = _cpu_memory_seconds(nbytes)
        n = 512
        a, b = torch.randn(n, n), torch.randn(n, n)
        mm_s = _cpu_seconds(lambda: torch.mm(a, b), 3)
    finally:
        torch.set_num_threads(threads)
    return DeviceLimits(
        key=key,
        device="cpu",
        name=name,
        copy_gbs=2 * nbytes / copy_s / 1e9,
        read_gbs=nbytes / read_s / 1e9,
        spec_gbs=None,
        cache_bytes=cache,
        tflops=2 * n**3 / mm_s / 1e12,
        spec_tflops=None,
    )


def _load(path: Path, key: str) -> DeviceLimits | None:
    """A cached measurement, or None when missing, of another version, or not sane numbers."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return None
    data.pop("version")
    try:
        limits = DeviceLimits(**data)
    except TypeError:
        return None
    numbers = [limits.copy_gbs, limits.read_gbs, limits.tflops]
    if limits.key != key or not all(isinstance(v, float) and 0 < v < 1e7 for v in numbers):
        return None
    return limits


def device_limits(cache: Path, device: str) -> DeviceLimits:
    """This device's limits from `cache`, measured and stored there on the first call for this device."""
    key, name = device_identity(device)
    path = cache / f"{device}-{key}.json"
    cached = _load(path, key)
    if cached is not None:
        return cached
    limits = _measure_cuda(key, name) if device == "cuda" else _measure_cpu(key, name)
    cache.mkdir(parents=True, exist_ok=True)
    # Not the pid alone: judges in PID namespaces of their own share pids (each is pid 1 in its own).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(6).hex()}")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, **asdict(limits)}, indent=1))
    tmp.replace(path)
    return limits


# --- the verdict ----------------------------------------------------------------------------------------


def judge_speed(
    bounds: TaskBounds, limits: DeviceLimits, timings_ms: Mapping[str, float | None], cfg: JudgeConfig
) -> SpeedOutcome:
    """The roofline numbers of the result, and `implausible-speed` when the candidate's median time
    implies more than `plausibility_slack` x the device's bandwidth or peak FLOP/s.

    Enforced on GPUs only. On a CPU the bytes are not a bound: the 32 MB cache thrash does not empty
    every cache level of every host (server CPUs carry hundreds of MB of L3), there is no specification
    to floor a measurement with, and single-threaded bandwidth on a shared host moves with its load, so
    a cached low measurement would fail honest candidates. The numbers are still reported there.
    A bound that eager or torch.compile themselves break is wrong for this task (an input not read in
    full, say) and is not applied."""
    slack = cfg.profile.plausibility_slack
    min_bytes = bounds.input_bytes + max(0, bounds.output_bytes - limits.cache_bytes)
    outcome = SpeedOutcome(
        Roofline(
            min_bytes=min_bytes,
            min_flops=bounds.matmul_flops or None,
            device_bandwidth_gbs=round(limits.copy_gbs, 1),
            device_tflops=round(limits.tflops, 2),
            enforced=cfg.device == "cuda",
        ),
        notes=list(bounds.notes),
    )
    roof = outcome.roofline

    def implied(ms: float | None) -> tuple[float, float] | None:
        if ms is None or ms <= 0:
            return None
        return min_bytes / (ms * 1e-3) / 1e9, bounds.matmul_flops / (ms * 1e-3) / 1e12

    cand = implied(timings_ms.get("candidate"))
    if cand is None:
        return outcome
    roof.candidate_gbs = round(cand[0], 2)
    roof.bandwidth_fraction = round(cand[0] / limits.copy_gbs, 4)
    roof.flops_fraction = round(cand[1] / limits.tflops, 4) if bounds.matmul_flops else None
    eager = implied(timings_ms.get("eager"))
    if eager is not None:
        roof.eager_bandwidth_fraction = round(eager[0] / limits.copy_gbs, 4)
    gbs_limit, tflops_limit = slack * limits.bandwidth_limit_gbs, slack * limits.tflops_limit
    for baseline in ("eager", "compile"):
        seen = implied(timings_ms.get(baseline))
        if seen is not None and (seen[0] > gbs_limit or seen[1] > tflops_limit):
            roof.enforced = False
            outcome.notes.append(
                f"plausibility bound not applied: {baseline} itself implies {seen[0]:.0f} GB/s, "
                f"{seen[1]:.1f} TFLOP/s (limits {gbs_limit:.0f}, {tflops_limit:.1f})"
            )
            return outcome
    over = []
    if cand[0] > gbs_limit:
        over.append(
            f"{min_bytes} bytes in {timings_ms['candidate']:.4g} ms is {cand[0]:.0f} GB/s, above "
            f"{slack} x the device's {limits.bandwidth_limit_gbs:.0f} GB/s"
        )
    if cand[1] > tflops_limit:
        over.append(
            f"{bounds.matmul_flops:.3g} matmul FLOP in {timings_ms['candidate']:.4g} ms is {cand[1]:.1f} "
            f"TFLOP/s, above {slack} x the device's {limits.tflops_limit:.1f}"
        )
    if over:
        text = "; ".join(over)
        if roof.enforced:
            outcome.violations.append(f"implausible-speed: {text} ({limits.name})")
        else:
            outcome.notes.append(f"plausibility (reported only on {cfg.device}): {text}")
    return outcome
