"""Shared fixtures of the data-pipeline tests: the probed catalogue (crawled once per session) and the
example tasks as the benchmark set for decontamination."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


@pytest.fixture(scope="session")
def catalogue():  # type: ignore[no-untyped-def]
    from cuda_agent.data.catalogue import build_catalogue

    return build_catalogue(True)


@pytest.fixture(scope="session")
def benchmark():  # type: ignore[no-untyped-def]
    from cuda_agent.data.synth import benchmark_index

    return benchmark_index(str(EXAMPLE_TASKS))
