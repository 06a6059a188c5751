"""`cuda-agent demo` end to end, shortened: its own local control plane, a real MinIO, the operator with the
local executor, a real sandbox server, examples/trainingrun-local.yaml (renamed so the stand-in finishes),
the `kubectl get tr` table and progress while it runs, and the summary.

The trainer is the stand-in of test_local_executor.py (tests/operator/standin_trainer.py, through the demo's
--trainer-command): the real trainer on SmolLM2 takes minutes of CPU, which `make demo` spends, not CI."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(__file__).with_name("standin_trainer.py")

pytestmark = [pytest.mark.cluster, pytest.mark.minio, pytest.mark.slow]


def test_demo_runs_the_local_run_to_the_end_and_summarises_it(tmp_path: Path) -> None:
    if shutil.which("go") is None:
        pytest.skip("`go` is not on PATH: the control plane and MinIO are built from Go modules")
    documents = list(yaml.safe_load_all((REPO_ROOT / "examples" / "trainingrun-local.yaml").read_text()))
    run = next(doc for doc in documents if doc["kind"] == "TrainingRun")
    run["metadata"]["name"] = "finish-demo"  # the stand-in exits 0 after three steps for finish-* runs
    run["spec"]["algorithm"]["steps"] = 3
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump_all(documents))
    command = [
        sys.executable, "-m", "cuda_agent.cli", "demo", "--name", f"demo-{secrets.token_hex(3)}",
        "--workdir", str(tmp_path / "work"), "--run", str(run_file), "--timeout", "300",
        "--trainer-command", f"{sys.executable} {STANDIN} -f {{run_yaml}}",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT, env={**os.environ}
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "NAME" in output and "PHASE" in output and "PASS RATE" in output  # the kubectl get tr table
    assert "step 3/3" in output  # the progress bar reached the end
    progress = [line.rsplit("  [", 1)[0] for line in result.stdout.splitlines() if "/3  " in line]
    phases = [line.split("] ", 1)[1].split()[0] for line in progress]
    assert phases[-1] == "Succeeded" and len(set(phases)) >= 2, progress  # the phase, as it changed
    assert "] Succeeded step 3/3" in progress[-1], progress
    # Off a terminal a line is printed when phase, step or condition change, never twice the same in a row.
    assert all(a != b for a, b in itertools.pairwise(progress)), progress
    assert "phase: Succeeded" in output
    assert "2.000 at step 3" in output  # the last mean reward, in the summary (earlier steps may go unseen)
    trainer_log = tmp_path / "work" / "runs" / "default" / "finish-demo" / "trainer.log"
    assert "stand-in trainer: step 3" in trainer_log.read_text()
