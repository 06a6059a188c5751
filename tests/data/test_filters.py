"""Composer output passes every filter; each filter rejects a task crafted to break its rule;
decontamination drops a near-copy of a benchmark task and keeps a distinct one."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from cuda_agent.data.catalogue import Catalogue
from cuda_agent.data.compose import ProgrammaticComposer
from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.filters import evaluate
from cuda_agent.data.records import FILTER_ORDER, FilterConfig, FilterName, Sample

STATIC_AND_EAGER: tuple[FilterName, ...] = tuple(f for f in FILTER_ORDER if f != "runs_compiled")


def _task(forward: str, init: str = "", inputs: str = "torch.randn(8, 64)") -> Sample:
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    init_body = textwrap.indent(textwrap.dedent(init).strip(), " " * 8) if init else ""
    code = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        f"{init_body}\n\n    def forward(self, x):\n{body}\n\n\n"
        f"def get_inputs():\n    return [{inputs}]\n\n\ndef get_init_inputs():\n    return []\n"
    )
    return Sample(id="crafted-0", ops=["crafted"], data_source="torch#1", code=code)


def test_composed_tasks_pass_every_filter(catalogue: Catalogue, benchmark: BenchmarkIndex) -> None:
    """Two composed tasks through all eight filters: one under inductor (C++ on CPU), one under
    aot_eager (the same Dynamo capture, no code generation), to keep CI time down."""
    composer = ProgrammaticComposer(catalogue, seed=3)
    for index, backend in enumerate(("inductor", "aot_eager")):
        config = FilterConfig.for_device("cpu", compile_backend=backend)
        sample = evaluate(composer.compose(index), config, benchmark)
        assert sample.accepted, (sample.code, sample.verdicts)
        assert [v.filter for v in sample.verdicts] == list(FILTER_ORDER)
        assert all(v.passed for v in sample.verdicts)


def test_many_composed_tasks_pass_the_eager_filters(catalogue: Catalogue, benchmark: BenchmarkIndex) -> None:
    composer = ProgrammaticComposer(catalogue, seed=11)
    config = FilterConfig.for_device("cpu", enabled=STATIC_AND_EAGER)
    results = [evaluate(composer.compose(i), config, benchmark) for i in range(24)]
    rejected = [(s.ops, s.verdicts[-1]) for s in results if not s.accepted]
    # Random op chains can legitimately end in a degenerate output (e.g. sign -> amax); most must pass.
    assert len(rejected) <= 3, rejected


def test_decontamination_drops_near_copy_keeps_distinct(
    catalogue: Catalogue, benchmark: BenchmarkIndex
) -> None:
    # examples/tasks/residual_mlp.py with renamed layers and variables, other sizes, no scale switch.
    near_copy = _task(
        "return x + self.proj_out(torch.relu(self.proj_in(x)))",
        init="self.proj_in = nn.Linear(64, 96)\nself.proj_out = nn.Linear(96, 64)",
    )
    config = FilterConfig.for_device("cpu", enabled=("composed", "decontamination"))
    dropped = evaluate(near_copy, config, benchmark)
    assert dropped.rejected_by == "decontamination"
    assert "residual_mlp.py" in dropped.verdicts[-1].detail
    distinct = _task("return torch.logsumexp(torch.tanh(x) * 3.0, dim=-1)")
    kept = evaluate(distinct, config, benchmark)
    assert kept.accepted, kept.verdicts
    match = benchmark.closest(distinct.code)
    assert match is None or match.similarity <= 0.9


CRAFTED: dict[str, tuple[Sample, dict[str, Any]]] = {
    "composed": (
        Sample(id="c", ops=["x"], data_source="torch#1", code="import torch\nclass Model: pass\n"),
        {},
    ),
    "no_stochastic_ops": (_task("return F.dropout(x, p=0.5, training=True)"), {}),
    "runs_eager": (_task("return x @ torch.ones(3, 3)"), {}),
    # Not detectable statically: the output depends on how often forward ran.
    "deterministic": (_task("self.calls += 1\nreturn x * self.calls", init="self.calls = 0"), {}),
    "nontrivial_output": (_task("return x * 0.0"), {}),
    # Same output whatever the input: only the shape is used.
    "nontrivial_output:inputs": (_task("return torch.ones_like(x).cumsum(-1)"), {}),
    # A trivially cheap task under the paper's [1, 100] ms window.
    "runtime": (_task("return x + 1.0"), {"min_runtime_ms": 1.0, "max_runtime_ms": 100.0}),
    # Never returns: stopped by the per-task deadline.
    "runs_eager:hangs": (_task("while True:\n    x = x + 1.0\nreturn x"), {"timeout_s": 0.5}),
    # Computes something else once compiled (is_compiling() is True while Dynamo traces).
    "runs_compiled": (
        _task("return x + float(torch.compiler.is_compiling())"),
        {"compile_backend": "aot_eager"},
    ),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_each_filter_rejects_its_crafted_task(case: str) -> None:
    sample, overrides = CRAFTED[case]
    expected = case.split(":")[0]
    config = FilterConfig.for_device("cpu", **overrides)
    result = evaluate(sample, config)
    assert result.rejected_by == expected, result.verdicts
    assert not result.accepted
    assert result.verdicts[-1].filter == expected and result.verdicts[-1].detail
    assert all(v.passed for v in result.verdicts[:-1])
