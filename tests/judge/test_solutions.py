"""The example tasks and their legitimate solutions.

Tasks are plain KernelBench files: they must run at the CPU ("small") scale, switch shapes with
CUDA_AGENT_TASK_SCALE and reject a bad value clearly. Every CPU solution, judged through the real CLI,
must earn reward >= 1 with correct=true (CUDA solutions are judged by tests/gpu/judge_gpu.py).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import pytest
import torch
from fixture_catalog import (
    TASKS_DIR,
    RunJudge,
    Solution,
    judge_solution_verdict,
    load_solutions,
    task_at_scale,
)

TASKS = sorted(TASKS_DIR.glob("*.py"))
CPU_SOLUTIONS = load_solutions("cpu")


def _load_task(path: Path, scale: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("CUDA_AGENT_TASK_SCALE", scale)
    spec = importlib.util.spec_from_file_location(f"task_{path.stem}_{scale}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("task_path", TASKS, ids=[p.stem for p in TASKS])
def test_task_runs_at_small_scale(task_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    task = _load_task(task_path, "small", monkeypatch)
    torch.manual_seed(0)
    model = task.Model(*task.get_init_inputs())
    inputs = task.get_inputs()
    assert inputs and all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in inputs)
    assert sum(t.numel() for t in inputs) <= 1 << 21, "small scale must stay cheap for CPU tests"
    with torch.no_grad():
        out = model(*inputs)
    assert isinstance(out, torch.Tensor) and torch.isfinite(out).all()


@pytest.mark.parametrize("task_path", TASKS, ids=[p.stem for p in TASKS])
def test_task_scale_switches_shapes(task_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = _load_task(task_path, "small", monkeypatch)
    full = _load_task(task_path, "full", monkeypatch)
    small_numel = sum(math.prod(t.shape) for t in small.get_inputs())
    full_numel = sum(math.prod(t.shape) for t in full.get_inputs())
    assert full_numel >= 8 * small_numel
    with pytest.raises(ValueError, match="CUDA_AGENT_TASK_SCALE must be one of"):
        _load_task(task_path, "huge", monkeypatch)


def test_task_at_scale_needs_no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The GPU script's full-scale copies must hold their shapes in a worker that sees no env vars."""
    monkeypatch.delenv("CUDA_AGENT_TASK_SCALE", raising=False)
    copy = task_at_scale(TASKS_DIR / "relu_mul_add.py", "full", tmp_path)
    spec = importlib.util.spec_from_file_location("relu_mul_add_full", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.ROWS, module.COLS) == (4096, 4096)


def test_tiny_softmax_is_tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task exists to make all-zero outputs pass an absolute tolerance: its outputs must stay tiny."""
    task = _load_task(TASKS_DIR / "tiny_softmax.py", "small", monkeypatch)
    out = task.Model()(*task.get_inputs())
    assert out.abs().max() < 1e-3
    assert out.pow(2).mean().sqrt() < 1e-4


def test_solution_coverage() -> None:
    solutions = load_solutions()
    tasks = {p.stem for p in TASKS}
    assert len(tasks) >= 12
    for device in ("cpu", "cuda"):
        covered = {s.task for s in solutions if s.device == device}
        assert covered == tasks, f"tasks without a {device} solution: {sorted(tasks - covered)}"
    variants = [s.variant for s in solutions]
    assert variants.count("cpu_ws") >= 1 and variants.count("cuda_ws") >= 2


@pytest.mark.slow
@pytest.mark.parametrize("solution", CPU_SOLUTIONS, ids=[s.name for s in CPU_SOLUTIONS])
def test_cpu_solution_earns_a_reward(solution: Solution, run_judge: RunJudge) -> None:
    run = run_judge(solution.task_path, solution.candidate, "cpu")
    verdict = judge_solution_verdict(run.report)
    assert verdict is None, f"{solution.name}: {verdict}"
    assert run.report["compiled"] is True and not run.report["violations"]
