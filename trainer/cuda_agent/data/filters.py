"""The filters: named rules, each giving a verdict on a sample, run in FILTER_ORDER (static checks first,
torch.compile last); a sample stops at its first failing filter, which is the one it is rejected by.

- composed: the composer produced code that parses and defines Model, get_inputs, get_init_inputs.
- decontamination: AST similarity (decontam.py) to every benchmark task at most the threshold (0.9).
- no_stochastic_ops: no random or dropout-like operator inside `Model` (get_inputs may draw randomly).
- runs_eager: the model builds and its forward returns a tensor on the target device.
- deterministic: a second forward on the same inputs gives a bitwise-equal output.
- nontrivial_output: the output is finite, not constant, and differs for a second input draw.
- runtime: the median eager forward time lies within [min_runtime_ms, max_runtime_ms].
- runs_compiled: torch.compile(model) runs and matches eager within rtol/atol.

Task code is executed here: call `evaluate` only in a filter worker process (see pipeline.py).
"""

from __future__ import annotations

import ast
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.records import FILTER_ORDER, FilterConfig, FilterName, Sample, Verdict
from cuda_agent.data.taskcode import load_task

# Call names that draw random numbers or drop values at random (matched on the final attribute name).
STOCHASTIC_CALLS = frozenset({
    "dropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout",
    "alpha_dropout", "feature_alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "rrelu", "RReLU",
    "rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "randperm", "bernoulli",
    "multinomial", "normal", "normal_", "uniform_", "poisson", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "random_", "gumbel_softmax", "FractionalMaxPool2d", "FractionalMaxPool3d",
    "fractional_max_pool2d", "fractional_max_pool3d",
})  # fmt: skip


@dataclass
class _Run:
    """What the execution filters share: the loaded task, the model, its inputs and eager output."""

    sample: Sample
    config: FilterConfig
    benchmark: BenchmarkIndex | None
    tree: ast.Module | None = None
    model: Any = None
    inputs: list[Any] = field(default_factory=list)
    output: Any = None
    task: Any = None


def _device(config: FilterConfig) -> Any:
    import torch

    return torch.device(config.device)


def _sync(config: FilterConfig) -> None:
    import torch

    if config.device == "cuda":
        torch.cuda.synchronize()


def _draw_inputs(run: _Run, seed: int) -> list[Any]:
    import torch

    torch.manual_seed(seed)
    device = _device(run.config)
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in run.task.get_inputs()]


def _forward(run: _Run, inputs: list[Any]) -> Any:
    import torch

    with torch.no_grad():
        out = run.model(*inputs)
    _sync(run.config)
    return out


def composed(run: _Run) -> Verdict:
    if not run.sample.code.strip():
        return Verdict(filter="composed", passed=False, detail="no code")
    try:
        run.tree = ast.parse(run.sample.code)
    except SyntaxError as exc:
        return Verdict(filter="composed", passed=False, detail=f"line {exc.lineno}: {exc.msg}")
    defined = {n.name for n in run.tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
    missing = sorted({"Model", "get_inputs", "get_init_inputs"} - defined)
    if missing:
        return Verdict(filter="composed", passed=False, detail=f"does not define {', '.join(missing)}")
    return Verdict(filter="composed", passed=True)


def decontamination(run: _Run) -> Verdict:
    if run.benchmark is None or not len(run.benchmark):
        return Verdict(filter="decontamination", passed=True, detail="no benchmark set given")
    threshold = run.config.similarity_threshold
    match = run.benchmark.closest(run.sample.code)
    if match is None:
        return Verdict(filter="decontamination", passed=True, detail="similarity 0")
    detail = f"closest {match.task} at similarity {match.similarity:.3f}"
    return Verdict(filter="decontamination", passed=match.similarity <= threshold, detail=detail)


def no_stochastic_ops(run: _Run) -> Verdict:
    assert run.tree is not None
    for node in run.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for call in ast.walk(node):
                if not isinstance(call, ast.Call):
                    continue
                func = call.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in STOCHASTIC_CALLS:
                    return Verdict(
                        filter="no_stochastic_ops", passed=False, detail=f"calls {name} (line {call.lineno})"
                    )
    return Verdict(filter="no_stochastic_ops", passed=True)


def runs_eager(run: _Run) -> Verdict:
    import torch

    try:
        run.task = load_task(run.sample.code, run.sample.id.replace("-", "_"))
        torch.manual_seed(run.config.seed)
        run.model = run.task.Model(*run.task.get_init_inputs()).to(_device(run.config))
        run.inputs = _draw_inputs(run, run.config.seed)
        run.output = _forward(run, run.inputs)
    except Exception as exc:  # any error of the task's own code is this filter's verdict
        return Verdict(filter="runs_eager", passed=False, detail=f"{type(exc).__name__}: {exc}"[:300])
    if not isinstance(run.output, torch.Tensor):
        return Verdict(
            filter="runs_eager", passed=False, detail=f"forward returns {type(run.output).__name__}"
        )
    return Verdict(
        filter="runs_eager", passed=True, detail=f"output {tuple(run.output.shape)} {run.output.dtype}"
    )


def deterministic(run: _Run) -> Verdict:
    import torch

    again = _forward(run, [t.clone() if isinstance(t, torch.Tensor) else t for t in run.inputs])
    same = (
        isinstance(again, torch.Tensor) and again.shape == run.output.shape and torch.equal(again, run.output)
    )
    return Verdict(filter="deterministic", passed=bool(same), detail="" if same else "two runs differ")


def nontrivial_output(run: _Run) -> Verdict:
    import torch

    out = run.output
    value = out.float() if not out.is_floating_point() else out
    if not bool(torch.isfinite(value).all()):
        return Verdict(filter="nontrivial_output", passed=False, detail="output has NaN or Inf")
    if value.numel() > 1 and bool((value == value.flatten()[0]).all()):
        return Verdict(filter="nontrivial_output", passed=False, detail="output is constant")
    other = _forward(run, _draw_inputs(run, run.config.seed + 1))
    if other.shape == out.shape and torch.allclose(other.float(), value, rtol=1e-5, atol=1e-6):
        return Verdict(filter="nontrivial_output", passed=False, detail="same output for different inputs")
    return Verdict(filter="nontrivial_output", passed=True)


def runtime(run: _Run) -> Verdict:
    config = run.config
    _forward(run, run.inputs)  # warm-up (allocator, lazy kernels)
    times = []
    for _ in range(config.runtime_repeats):
        start = time.perf_counter()
        _forward(run, run.inputs)
        times.append((time.perf_counter() - start) * 1e3)
    median = statistics.median(times)
    passed = config.min_runtime_ms <= median <= config.max_runtime_ms
    bounds = f"[{config.min_runtime_ms}, {config.max_runtime_ms}] ms"
    return Verdict(
        filter="runtime", passed=passed, detail=f"median {median:.3f} ms on {config.device}, bounds {bounds}"
    )


def runs_compiled(run: _Run) -> Verdict:
    import torch

    config = run.config
    try:
        torch._dynamo.reset()
        compiled = torch.compile(run.model, backend=config.compile_backend)
        with torch.no_grad():
            out = compiled(*run.inputs)  # type: ignore[no-untyped-call]
        _sync(config)
    except Exception as exc:  # a compile or run error of this task is the verdict
        return Verdict(filter="runs_compiled", passed=False, detail=f"{type(exc).__name__}: {exc}"[:300])
    if not isinstance(out, torch.Tensor) or out.shape != run.output.shape:
        return Verdict(filter="runs_compiled", passed=False, detail="compiled output has another shape")
    if out.is_floating_point():
        close = torch.allclose(out, run.output, rtol=config.compile_rtol, atol=config.compile_atol)
    else:
        close = torch.equal(out, run.output)
    detail = "" if close else f"max abs diff {(out.double() - run.output.double()).abs().max().item():.3g}"
    return Verdict(filter="runs_compiled", passed=bool(close), detail=detail)


FILTERS: dict[FilterName, Callable[[_Run], Verdict]] = {
    "composed": composed,
    "decontamination": decontamination,
    "no_stochastic_ops": no_stochastic_ops,
    "runs_eager": runs_eager,
    "deterministic": deterministic,
    "nontrivial_output": nontrivial_output,
    "runtime": runtime,
    "runs_compiled": runs_compiled,
}
# Filters that read what runs_eager left behind, so they cannot run without it.
_NEEDS_EAGER = {"deterministic", "nontrivial_output", "runtime", "runs_compiled"}


def evaluate(sample: Sample, config: FilterConfig, benchmark: BenchmarkIndex | None = None) -> Sample:
    """The sample with a verdict per enabled filter up to the first failure, `accepted` and `rejected_by`.
    A sample already rejected by its composer keeps that verdict."""
    if sample.rejected_by is not None:
        return sample
    run = _Run(sample, config, benchmark)
    enabled: set[str] = set(config.enabled) | {"composed"}
    if enabled & _NEEDS_EAGER:
        enabled.add("runs_eager")
    verdicts: list[Verdict] = []
    for name in FILTER_ORDER:
        if name not in enabled:
            continue
        try:
            verdict = FILTERS[name](run)
        except Exception as exc:  # a task that breaks a check (odd output types) fails that check
            verdict = Verdict(filter=name, passed=False, detail=f"{type(exc).__name__}: {exc}"[:300])
        verdicts.append(verdict)
        if not verdict.passed:
            return sample.model_copy(update={"verdicts": verdicts, "accepted": False, "rejected_by": name})
    return sample.model_copy(update={"verdicts": verdicts, "accepted": True, "rejected_by": None})
