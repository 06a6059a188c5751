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

The first three are static (this module); the others execute the task and live in execution.py, which
needs only torch so that it can run inside a sandbox session. `evaluate` runs the task's code in the
calling process: call it only in a filter worker (see pipeline.py).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cuda_agent.data import execution
from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.records import FilterConfig, FilterName, Sample, Verdict

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
class _Static:
    """What the static filters share: the sample, the parsed tree, the benchmark set."""

    sample: Sample
    config: FilterConfig
    benchmark: BenchmarkIndex | None
    tree: ast.Module | None = None


def composed(run: _Static) -> Verdict:
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


def decontamination(run: _Static) -> Verdict:
    if run.benchmark is None or not len(run.benchmark):
        return Verdict(filter="decontamination", passed=True, detail="no benchmark set given")
    threshold = run.config.similarity_threshold
    match = run.benchmark.closest(run.sample.code)
    if match is None:
        return Verdict(filter="decontamination", passed=True, detail="similarity 0")
    detail = f"closest {match.task} at similarity {match.similarity:.3f}"
    return Verdict(
        filter="decontamination", passed=match.similarity <= threshold, detail=detail, value=match.similarity
    )


def no_stochastic_ops(run: _Static) -> Verdict:
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


STATIC_FILTERS: dict[FilterName, Callable[[_Static], Verdict]] = {
    "composed": composed,
    "decontamination": decontamination,
    "no_stochastic_ops": no_stochastic_ops,
}


def execution_settings(config: FilterConfig) -> dict[str, Any]:
    """The settings execution.run_filters reads (plain JSON, for a worker or a sandbox session)."""
    return config.model_dump(mode="json")


def static_verdicts(sample: Sample, config: FilterConfig, benchmark: BenchmarkIndex | None) -> list[Verdict]:
    """Verdicts of the static filters (always `composed`, then the enabled ones) up to the first failure."""
    run = _Static(sample, config, benchmark)
    verdicts: list[Verdict] = []
    for name, check in STATIC_FILTERS.items():
        if name != "composed" and name not in config.enabled:
            continue
        verdicts.append(check(run))
        if not verdicts[-1].passed:
            break
    return verdicts


def conclude(sample: Sample, verdicts: list[Verdict]) -> Sample:
    """The sample with its verdicts; rejected by the first failing one, accepted when none failed."""
    failed = next((v.filter for v in verdicts if not v.passed), None)
    return sample.model_copy(update={"verdicts": verdicts, "accepted": failed is None, "rejected_by": failed})


def evaluate(sample: Sample, config: FilterConfig, benchmark: BenchmarkIndex | None = None) -> Sample:
    """The sample with a verdict per enabled filter up to the first failure, `accepted` and `rejected_by`.
    Runs the task's code in this process. A sample already rejected by its composer keeps that verdict."""
    if sample.rejected_by is not None:
        return sample
    verdicts = static_verdicts(sample, config, benchmark)
    if all(v.passed for v in verdicts):
        executed = execution.run_filters(sample.code, execution_settings(config), config.enabled)
        verdicts += [Verdict.model_validate(v) for v in executed]
    return conclude(sample, verdicts)
