"""Tamper evidence inside the worker: fingerprints taken before any candidate code runs, re-checked after.

Everything a candidate could monkey-patch to fool the judge (timers, synchronisation, comparison and
copy functions, builtins, nn.Module dispatch, the task's Model, the judge's own modules) is recorded as
(id, code identity); global switches (precision, grad mode, threads) and interception points (torch
function/dispatch mode stacks, global module hooks) are recorded by value. Any difference is
`judge-tampered` (or `precision` for numerics switches). The judge also binds what it calls as local
references first, so a patched function is reported, never used.
"""

from __future__ import annotations

import builtins
import hashlib
import sys
import time
from typing import Any

import torch
import torch.nn.modules.module as nn_module_impl

from cuda_agent.api.judge_files import JUDGE_CONTRACT_MODULES
from cuda_agent.sandbox.judge import backend_state
from cuda_agent.sandbox.judge import task as task_lib

JUDGE_PACKAGE = "cuda_agent.sandbox.judge"
# The modules of cuda_agent.api the judge runs (its shared types, its file contract): watched like its own.
JUDGE_CONTRACT_NAMES = frozenset(
    "cuda_agent.api." + name.removesuffix(".py") for name in JUDGE_CONTRACT_MODULES if name != "__init__.py"
)
PRECISION_KEYS = frozenset(
    {
        "cuda.matmul.allow_tf32",
        "cudnn.allow_tf32",
        "float32_matmul_precision",
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
    }
)


def _identity(value: Any) -> tuple[int, str]:
    code = getattr(value, "__code__", None)
    if code is None and isinstance(value, (staticmethod, classmethod)):
        code = getattr(value.__func__, "__code__", None)
    if code is None:
        return id(value), ""
    return id(value), f"{id(code)}:{hashlib.sha256(code.co_code).hexdigest()[:16]}"


def _namespaces(task_module: Any) -> dict[str, Any]:
    spaces: dict[str, Any] = {
        "builtins": builtins,
        "time": time,
        "sys": sys,
        "torch": torch,
        "torch.Tensor": torch.Tensor,
        "torch.TensorBase": torch._C.TensorBase,
        "torch.nn.Module": torch.nn.Module,
        "torch.nn.functional": torch.nn.functional,
        "torch.autograd.profiler": torch.autograd.profiler,
        "torch.profiler": torch.profiler,
        "torch.utils.cpp_extension": sys.modules.get("torch.utils.cpp_extension"),
        "torch.cuda": torch.cuda,
        "torch.cuda.Event": torch.cuda.Event,
        "torch.cuda.Stream": torch.cuda.Stream,
        "torch.backends.cuda": torch.backends.cuda,
    }
    if task_module is not None:
        spaces["task"] = task_module
        spaces["task.Model"] = task_module.Model
    for name, module in list(sys.modules.items()):
        if (name.startswith(JUDGE_PACKAGE) or name in JUDGE_CONTRACT_NAMES) and module is not None:
            spaces[name] = module
    return {k: v for k, v in spaces.items() if v is not None}


def _snapshot(spaces: dict[str, Any]) -> dict[str, tuple[int, str]]:
    prints: dict[str, tuple[int, str]] = {}
    for label, space in spaces.items():
        prints[label] = (id(space), "")
        for name, value in list(vars(space).items()):
            # Data attributes change legitimately (lazy init flags); callables and classes must not.
            if callable(value) or isinstance(value, (type, staticmethod, classmethod, property)):
                prints[f"{label}.{name}"] = _identity(value)
    return prints


def _interceptors() -> dict[str, int]:
    hooks = {
        name: len(getattr(nn_module_impl, name))
        for name in dir(nn_module_impl)
        if name.startswith("_global_") and isinstance(getattr(nn_module_impl, name), dict)
    }
    hooks["torch_function_mode_stack"] = torch._C._len_torch_function_stack()
    hooks["torch_dispatch_mode_stack"] = torch._C._len_torch_dispatch_stack()
    return hooks


def backend_violations(moved: list[tuple[str, Any, Any]], where: str = "") -> list[str]:
    """Violation strings for process-wide settings that moved (numerics switches are `precision`)."""
    found = []
    for key, before, now in moved:
        code = (
            "precision"
            if any(w in key for w in ("tf32", "precision", "fp16_accumulation"))
            else "judge-tampered"
        )
        found.append(f"{code}: process-wide setting {key} changed from {before!r} to {now!r}{where}")
    return found


class Fingerprints:
    """Taken once, before the candidate is imported; `changes()` lists what differs now."""

    def __init__(self, task_module: Any, backend: backend_state.Snapshot | None = None) -> None:
        self._task_module = task_module
        # Every process-wide backend setting, enumerated from torch before any candidate code (the worker
        # takes it before loading the candidate's extensions): never rebaselined (the judge's own
        # compile changes none of them).
        self.backend = backend if backend is not None else backend_state.Snapshot()
        self.rebaseline()

    def rebaseline(self) -> None:
        """Accept the current state as the reference (after the judge's own torch.compile, which patches
        nn.Module itself; the caller checks `changes()` right before)."""
        self._labels = list(_namespaces(self._task_module))
        self._prints = _snapshot(_namespaces(self._task_module))
        self._interceptors = _interceptors()
        self._precision = task_lib.precision_state()
        self._profile_hook = sys.getprofile()
        self._trace_hook = sys.gettrace()

    def changes(self) -> list[str]:
        """Violation strings ("judge-tampered: ..." / "precision: ..."), empty when nothing moved."""
        found: list[str] = []
        now = _snapshot({k: v for k, v in _namespaces(self._task_module).items() if k in self._labels})
        for key, before in self._prints.items():
            after = now.get(key)
            if after != before:
                found.append(f"judge-tampered: {key} was {'removed' if after is None else 'replaced'}")
        for key, count in _interceptors().items():
            if count != self._interceptors.get(key, 0):
                found.append(f"judge-tampered: {key} changed ({self._interceptors.get(key, 0)} -> {count})")
        state = task_lib.precision_state()
        for key, value in state.items():
            if value != self._precision[key]:
                code = "precision" if key in PRECISION_KEYS else "judge-tampered"
                found.append(
                    f"{code}: global setting {key} changed from {self._precision[key]!r} to {value!r}"
                )
        found += backend_violations(self.backend.changes())
        if sys.getprofile() is not self._profile_hook or sys.gettrace() is not self._trace_hook:
            found.append("judge-tampered: a Python profile/trace hook was installed")
        return found[:20]
