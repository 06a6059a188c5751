"""KernelBench-format tasks: loading, secret per-trial seeds, input generation, precision policy.

Orchestrator and worker both call `make_inputs(task, seed, variant, device)`: inputs are generated from
the trial seed on the target device (on the CPU where the task's get_inputs() cannot run there), so the
worker regenerates bit-identical inputs from a seed it receives only when the trial starts, and the
orchestrator's reference matches them exactly. Generating 100M-element inputs on the host cost seconds
per trial on the H200 host; on the device it costs milliseconds.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import random
import sys
import types
from typing import Any

import torch

TASK_MODULE_NAME = "cuda_agent_judge_task"
# Input distributions cycled over trials. "task": the task's own get_inputs() under the secret seed;
# "uniform": each float tensor redrawn uniformly over its own [min, max] (keeps sign and range, breaks
# structure); "scaled": multiplied by a random factor in [1/4, 4] (keeps structure, changes magnitude).
VARIANTS = ("task", "uniform", "scaled")


class TaskError(Exception):
    """The task itself failed (import, construction, inputs or forward): not the candidate's fault."""


def load_task(source: str, path: str) -> types.ModuleType:
    """Execute the task's source as a fresh module (the worker never imports the task file by path)."""
    module = types.ModuleType(TASK_MODULE_NAME)
    module.__file__ = path
    sys.modules[TASK_MODULE_NAME] = module  # dataclasses and pickling look classes up here
    try:
        exec(compile(source, path, "exec"), module.__dict__)
    except Exception as exc:
        raise TaskError(f"{path}: {type(exc).__name__}: {exc}") from exc
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, name):
            raise TaskError(f"{path}: defines no {name}")
    if not (isinstance(module.Model, type) and issubclass(module.Model, torch.nn.Module)):
        raise TaskError(f"{path}: Model is not an nn.Module subclass")
    return module


def derive_seed(master: bytes, label: str) -> int:
    """A 63-bit seed for one purpose, unpredictable without the master secret."""
    digest = hmac.new(master, label.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % (1 << 32))


def _redraw(x: torch.Tensor, variant: str, gen: torch.Generator) -> torch.Tensor:
    if variant == "task" or not x.is_floating_point() or x.numel() == 0:
        return x
    base = x.detach().to(torch.float64)
    if variant == "uniform":
        lo, hi = float(base.min()), float(base.max())
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
            return x
        fresh = torch.rand(base.shape, generator=gen, dtype=torch.float64, device=x.device) * (hi - lo) + lo
    elif variant == "scaled":
        u = float(torch.rand((), generator=gen, dtype=torch.float64, device=x.device))
        fresh = base * math.exp(math.log(0.25) + u * math.log(16.0))
    else:
        raise ValueError(f"unknown input variant {variant!r}")
    return fresh.to(dtype=x.dtype)


def _task_inputs(task: types.ModuleType, seed: int, device: str) -> list[Any]:
    """Seeded get_inputs() with tensor factories defaulting to `device`; a task whose get_inputs() cannot
    run that way (a CPU generator, numpy) runs on the CPU instead, the same way in every process."""
    if device != "cpu":
        seed_everything(seed)
        try:
            with torch.device(device):
                return _checked_list(task.get_inputs())
        except TaskError:
            raise
        except Exception:
            pass
    seed_everything(seed)
    try:
        raw = task.get_inputs()
    except Exception as exc:
        raise TaskError(f"get_inputs() raised {type(exc).__name__}: {exc}") from exc
    return _checked_list(raw)


def _checked_list(raw: Any) -> list[Any]:
    if not isinstance(raw, (list, tuple)):
        raise TaskError(f"get_inputs() returned {type(raw).__name__}, expected a list")
    return list(raw)


def make_inputs(task: types.ModuleType, seed: int, variant: str, device: str) -> list[Any]:
    """The task's inputs for one trial: seeded get_inputs(), the variant's redraw, on `device`."""
    # One generator shared by all tensors in order, so two same-shaped inputs get independent redraws.
    gen = torch.Generator(device=device).manual_seed(seed ^ 0x5DEECE66D)
    inputs: list[Any] = []
    for x in _task_inputs(task, seed, device):
        if isinstance(x, torch.Tensor):
            x = _redraw(x.detach().to(device), variant, gen)
        inputs.append(x)
    return inputs


# Position weights of the device-side checksum: a 31-bit prime modulus keeps every product below 2**62.
_CHECKSUM_MODULUS = 2147483629


def _device_checksum(flat: torch.Tensor) -> bytes:
    """Sum and position-weighted sum of the raw 32-bit words (8-bit for odd sizes), computed where the
    tensor lives: 16 bytes cross to the host instead of the whole tensor."""
    raw = flat.view(torch.uint8)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw
    values = words.to(torch.int64)
    weights = torch.arange(1, values.numel() + 1, device=flat.device, dtype=torch.int64) % _CHECKSUM_MODULUS
    total, weighted = int(values.sum()), int((values * weights).sum())
    return total.to_bytes(16, "little", signed=True) + weighted.to_bytes(16, "little", signed=True)


def values_digest(values: list[Any]) -> str:
    """Fingerprint of a list of values, computed where the tensors live. Used to check that the worker
    regenerated the orchestrator's inputs (reproducibility, not a defence: the worker runs candidate
    code) and to spot a candidate returning an earlier trial's outputs."""
    digest = hashlib.sha256()
    for x in values:
        if isinstance(x, torch.Tensor):
            digest.update(f"{x.dtype}{tuple(x.shape)}{x.device.type}".encode())
            flat = x.detach().contiguous().reshape(-1)
            if not flat.numel():
                continue
            if flat.device.type == "cpu":
                digest.update(flat.view(torch.uint8).numpy().tobytes())
            else:
                digest.update(_device_checksum(flat))
        else:
            digest.update(repr(x).encode())
    return digest.hexdigest()


def build_model(task: types.ModuleType, cls: type, weight_seed: int, device: str) -> torch.nn.Module:
    """Instantiate `cls` with the task's init inputs; weights come from the secret weight seed.

    Model and ModelNew are both built right after seeding with the same seed, so a ModelNew that
    declares the same parameters in the same order gets the same weights (KernelBench convention).
    """
    seed_everything(weight_seed)
    init = task.get_init_inputs()
    if not isinstance(init, (list, tuple)):
        raise TaskError(f"get_init_inputs() returned {type(init).__name__}, expected a list")
    model = cls(*init)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{cls.__name__}(...) is not an nn.Module")
    return model.to(device)


def apply_precision(policy: str) -> None:
    """One precision policy for reference, candidate, eager and compile (a TF32 baseline vs an FP32 one
    would be a 7x gap from a flag alone: MEASUREMENTS.md, "Precision")."""
    allow = policy == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    torch.set_float32_matmul_precision("high" if allow else "highest")


def precision_state() -> dict[str, Any]:
    """The global numerics switches a candidate might flip to speed itself up or slow the baselines."""
    return {
        "cuda.matmul.allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": bool(
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": bool(
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "default_dtype": str(torch.get_default_dtype()),
        "num_threads": torch.get_num_threads(),
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
        "cudnn.enabled": bool(torch.backends.cudnn.enabled),
        "cudnn.benchmark": bool(torch.backends.cudnn.benchmark),
    }
