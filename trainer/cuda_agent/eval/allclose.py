"""A plain KernelBench-style correctness harness, for comparison with our judge only (never a reward).

    python -m cuda_agent.eval.allclose TASK MODEL_NEW [--device cuda] [--atol 1e-2] [--rtol 1e-2]

It does what a plain harness does and nothing more: import the task and the candidate's ModelNew (which
builds its load_inline extension), seed, build Model and ModelNew with the same init inputs, and compare
outputs with torch.allclose over a few seeded input draws. Candidate code runs in this process with no
confinement at all (no screen, no Landlock, no seccomp, the caller's user and network), which is why the
report's allclose comparison is opt-in (`--compare-allclose`): use it only on candidates you would run
yourself. The verdict is the last stdout line, prefixed so that candidate prints cannot be mistaken for it.

Standard library and torch only: it also runs where the trainer's packages are not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

MARKER = "cuda-agent-allclose: "


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _on(value: Any, device: str) -> Any:
    import torch

    return value.to(device) if isinstance(value, torch.Tensor) else value


def compare(
    task_path: Path, candidate: Path, device: str, atol: float, rtol: float, trials: int
) -> dict[str, Any]:
    import torch

    task = _load(task_path, "cuda_agent_allclose_task")
    new = _load(candidate, "model_new")
    init = [_on(x, device) for x in task.get_init_inputs()]
    torch.manual_seed(42)
    model = task.Model(*init).to(device)
    torch.manual_seed(42)
    model_new = new.ModelNew(*init).to(device)
    worst = 0.0
    for trial in range(trials):
        torch.manual_seed(1000 + trial)
        inputs = [_on(x, device) for x in task.get_inputs()]
        with torch.no_grad():
            ref = model(*inputs)
            out = model_new(*inputs)
        refs = ref if isinstance(ref, tuple | list) else (ref,)
        outs = out if isinstance(out, tuple | list) else (out,)
        if len(refs) != len(outs):
            return {
                "accepted": False,
                "max_abs_err": None,
                "detail": f"{len(outs)} outputs, expected {len(refs)}",
            }
        for r, o in zip(refs, outs, strict=True):
            if tuple(o.shape) != tuple(r.shape):
                return {
                    "accepted": False,
                    "max_abs_err": None,
                    "detail": f"shape {tuple(o.shape)} != {tuple(r.shape)}",
                }
            err = float((o.float() - r.float()).abs().max()) if r.numel() else 0.0
            worst = max(worst, err)
            if not torch.allclose(o.float(), r.float(), atol=atol, rtol=rtol):
                return {"accepted": False, "max_abs_err": err, "detail": f"trial {trial}: outputs differ"}
    return {
        "accepted": True,
        "max_abs_err": worst,
        "detail": f"{trials} trials within atol={atol}, rtol={rtol}",
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuda_agent.eval.allclose")
    parser.add_argument("task", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--atol", type=float, default=1e-2)
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args(argv)
    try:
        verdict = compare(args.task, args.candidate, args.device, args.atol, args.rtol, args.trials)
    except BaseException as exc:  # any failure of candidate code is the harness rejecting it
        verdict = {
            "accepted": False,
            "max_abs_err": None,
            "detail": f"{type(exc).__name__}: {str(exc)[:300]}",
        }
    sys.stdout.write("\n" + MARKER + json.dumps(verdict) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
