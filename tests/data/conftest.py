"""Shared fixtures of the data-pipeline tests: the probed catalogue (crawled once per session) and the
example tasks as the benchmark set for decontamination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuda_agent.data.catalogue import Catalogue, build_catalogue
from cuda_agent.data.decontam import BenchmarkIndex
from cuda_agent.data.synth import benchmark_index

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture(scope="session")
def catalogue() -> Catalogue:
    return build_catalogue(True)


@pytest.fixture(scope="session")
def benchmark() -> BenchmarkIndex:
    index = benchmark_index(str(EXAMPLE_TASKS))
    assert index is not None
    return index
