"""Fixtures for the judge's attack and solution tests: run the real `cuda-agent judge` CLI as a subprocess.

Nothing is mocked: each call is a fresh judge process from the venv's entry point, exactly as the session
server runs it. Builds go to the judge's own content-addressed cache (~/.cache/cuda-agent/judge-build or
$CUDA_AGENT_JUDGE_CACHE), so a warm machine re-judges without compiling.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixture_catalog import JudgeCliRun, RunJudge, parse_single_json

# A cold C++ build on two shared cores takes minutes; the judge has its own per-phase limits inside this.
JUDGE_PROCESS_TIMEOUT_S = 1500


def _tail(text: str, limit: int = 3000) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


@pytest.fixture(scope="session")
def judge_command() -> list[str]:
    """The venv's `cuda-agent judge` entry point (the one CI and developers install with `make venv`)."""
    entry_point = Path(sys.executable).with_name("cuda-agent")
    if not entry_point.exists():
        pytest.fail(f"{entry_point} is missing: run `make venv` (pip install -e .) first")
    return [str(entry_point), "judge"]


@pytest.fixture
def run_judge(judge_command: list[str], tmp_path: Path) -> RunJudge:
    """Judge TASK against CANDIDATE; asserts exit code 0 and exactly one JSON object on stdout."""

    def run(task: Path, candidate: Path, device: str = "cpu", *extra: str) -> JudgeCliRun:
        # No torch.compile baseline on two CPU cores (5-60 s per evaluation): reward is then at most 2,
        # which every check here tolerates; tests/gpu/judge_gpu.py judges with the full baseline.
        command = [
            *judge_command,
            str(task),
            str(candidate),
            "--device",
            device,
            "--json",
            "--compile-mode",
            "none",
        ]
        command += extra
        env = {**os.environ, "CUDA_AGENT_TASK_SCALE": "small"}
        start = time.monotonic()
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=JUDGE_PROCESS_TIMEOUT_S,
            env=env,
            cwd=tmp_path,
            check=False,
        )
        seconds = time.monotonic() - start
        where = f"`{' '.join(command)}`"
        assert proc.returncode == 0, (
            f"{where} exited {proc.returncode} (judging must complete with exit 0)\n"
            f"stdout: {_tail(proc.stdout)}\nstderr: {_tail(proc.stderr)}"
        )
        try:
            report = parse_single_json(proc.stdout)
        except ValueError as exc:
            pytest.fail(f"{where}: {exc}\nstderr: {_tail(proc.stderr)}")
        return JudgeCliRun(report=report, stdout=proc.stdout, stderr=proc.stderr, seconds=seconds)

    return run
