"""Fixtures of the install tests: the real `helm` binary, built from its pinned Go module like the control
plane's binaries (tests/fixtures/cluster.py provides the control plane itself)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from install_helpers import Helm

from cuda_agent.localcluster import binaries


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    if not (binaries.bin_dir() / "helm").exists() and shutil.which("go") is None:
        pytest.skip("`go` is not on PATH: helm is built from its Go module")
    return binaries.ensure("helm")


@pytest.fixture(scope="session")
def helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary, tmp_path_factory.mktemp("helm-home"))
