"""The execution filters inside a sandbox session: a real sandbox server (CPU, the fake judge of the
sandbox tests; the judge is not used here), static filters here, execution.py run by the sandbox's
interpreter next to the task in the session's workspace."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.data.catalogue import Catalogue
from cuda_agent.data.compose import ProgrammaticComposer
from cuda_agent.data.filters import evaluate
from cuda_agent.data.pipeline import filter_samples
from cuda_agent.data.records import FilterConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))
from sandbox_helpers import cleanup, start_server


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Any]:
    running = start_server()
    try:
        yield running
    finally:
        cleanup(running)


def test_execution_filters_run_in_a_sandbox_session(sandbox: Any, catalogue: Catalogue) -> None:
    sample = ProgrammaticComposer(catalogue, seed=3).compose(0)
    config = FilterConfig.for_device(
        "cpu", enabled=("composed", "no_stochastic_ops", "runs_eager", "deterministic", "nontrivial_output")
    )
    (confined,) = filter_samples([sample], config, sandbox_url=sandbox.url)
    local = evaluate(sample, config)
    assert confined.accepted, confined.verdicts
    assert [v.filter for v in confined.verdicts] == [v.filter for v in local.verdicts]
    assert confined.verdicts[-1].filter == "nontrivial_output"
    assert sandbox.client.request("GET", "/v1/sessions")[1].count(b"session_id") == 0  # session deleted
