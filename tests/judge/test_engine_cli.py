"""End to end through the real CLI (`python -m cuda_agent.cli judge`), one judge process per run, on CPU.

A tiny task, a legitimate load_inline solution (which also prints, to show the output never reaches
stdout) and a wrong one built from the same extension source, so the whole module compiles once per
machine (the judge's shared build cache).
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.sandbox.judge import local_service

TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
"""

BROKEN_TASK = TASK.replace("return [torch.randn(64, 256)]", "raise RuntimeError('dataset bug')")

EXTENSION = '''
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor relu2(torch::Tensor x, double slope) {
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
  auto out = torch::empty_like(x);
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) o[i] = in[i] > 0.f ? float(slope) * in[i] : 0.f;
  return out;
}
"""
ext = load_inline(
    name="judge_engine_cli_relu2", cpp_sources=[source], functions=["relu2"], extra_cflags=["-O2"]
)
print("CANDIDATE-SAYS reward 3 at import")


class ModelNew(nn.Module):
    def forward(self, x):
        print('{"reward": 3}')
        return ext.relu2(x, SLOPE)
'''

CONTRACT_KEYS = {
    "reward", "compiled", "correct", "violations", "error", "timings_ms", "speedup", "cv", "precision",
    "device", "build_log", "seconds",
}  # fmt: skip


def judge(
    task: Path, candidate: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "judge",
        str(task),
        str(candidate),
        "--device",
        "cpu",
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=1500, check=False, env=env)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {
        "task": tmp_path / "task.py",
        "broken_task": tmp_path / "broken_task.py",
        "legit": tmp_path / "legit" / "model_new.py",
        "wrong": tmp_path / "wrong.py",
    }
    paths["legit"].parent.mkdir()
    paths["task"].write_text(TASK)
    paths["broken_task"].write_text(BROKEN_TASK)
    paths["legit"].write_text(EXTENSION.replace("SLOPE", "2.0"))
    paths["wrong"].write_text(EXTENSION.replace("SLOPE", "2.5"))
    return paths


FAST = ("--json", "--compile-mode", "none", "--profile-trials", "10")


@pytest.mark.slow
def test_legitimate_solution_is_rewarded_and_the_json_follows_the_contract(files: dict[str, Path]) -> None:
    proc = judge(files["task"], files["legit"].parent, *FAST)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "CANDIDATE-SAYS" not in proc.stdout
    report = json.loads(proc.stdout)
    assert set(report) >= CONTRACT_KEYS
    assert report["reward"] in (1, 2, 3), report
    assert report["compiled"] is True and report["correct"] is True
    assert report["violations"] == [] and report["error"] is None
    assert set(report["timings_ms"]) == set(report["cv"]) == {"candidate", "eager", "compile"}
    assert set(report["speedup"]) == {"eager", "compile"}
    assert set(report["seconds"]) == {"build", "verify", "profile"}
    assert report["timings_ms"]["candidate"] > 0 and report["timings_ms"]["compile"] is None
    assert report["precision"] == "strict-fp32" and report["device"] == "cpu"
    assert report["timing_method"] == "cpu-wall-clock" and report["layout"] == "inline"
    assert report["isolation"]["judge_dumpable"] == "on"


@pytest.mark.slow
def test_margin_decides_the_reward_tier(files: dict[str, Path]) -> None:
    """`--margin` (a TrainingRun's spec.reward.speedupMargin, through the session's judge options) is the
    reward's: no speedup beats a margin of 1000, so a correct candidate gets 1 (correct, not faster)."""
    proc = judge(files["task"], files["legit"].parent, *FAST, "--margin", "1000")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["correct"], report["reward"]) == (True, 1), report


@pytest.mark.slow
def test_wrong_solution_gets_minus_one_with_a_located_error(files: dict[str, Path]) -> None:
    proc = judge(files["task"], files["wrong"], *FAST)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["reward"] == -1 and report["compiled"] is True and report["correct"] is False
    assert report["error"].startswith("wrong result: trial 1 (model-first): max abs err")
    assert "rel-norm err" in report["error"]


def test_task_errors_and_usage_errors_exit_2(files: dict[str, Path], tmp_path: Path) -> None:
    proc = judge(files["broken_task"], files["wrong"], "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(
        "cuda-agent judge: task error: get_inputs() raised RuntimeError: dataset bug"
    )
    missing = judge(tmp_path / "nope.py", files["wrong"], "--json")
    assert missing.returncode == 2 and "TASK" in missing.stderr and missing.stdout == ""
    bad = judge(files["task"], files["wrong"], "--trials", "0")
    assert bad.returncode == 2 and "invalid trials" in bad.stderr


def test_static_violations_stop_before_any_build(files: dict[str, Path], tmp_path: Path) -> None:
    candidate = tmp_path / "threaded.py"
    candidate.write_text("import threading\n" + EXTENSION.replace("SLOPE", "2.0"))
    proc = judge(files["task"], candidate, "--json")
    report = json.loads(proc.stdout)
    assert report["reward"] == -1 and report["compiled"] is False
    assert report["violations"] == ["static.thread: imports threading at model_new.py:1"]


@pytest.mark.slow
def test_the_cli_hands_its_evaluation_to_a_warm_judge_service(files: dict[str, Path], tmp_path: Path) -> None:
    """`cuda-agent judge-service` forks judges from a zygote; the CLI uses it only when told to."""
    socket_path = tmp_path / "service" / "judge.sock"
    service = subprocess.Popen(
        [sys.executable, "-m", "cuda_agent.cli", "judge-service", "--socket", str(socket_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert service.stdout is not None
        lines = [service.stdout.readline() for _ in range(2)]
        assert lines[1].strip() == f"export {local_service.SERVICE_ENV}={socket_path}", lines
        assert stat.S_IMODE(socket_path.parent.stat().st_mode) == 0o700
        env = {**os.environ, local_service.SERVICE_ENV: str(socket_path)}
        proc = judge(files["task"], files["legit"].parent, *FAST, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "judged by the judge service" in proc.stderr
        report = json.loads(proc.stdout)
        assert report["reward"] in (1, 2, 3) and report["correct"] is True, report
        # A request that could make the service's judge use a service again is declined.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(socket_path))
            request = {"argv": ["t.py", "c.py"], "cwd": "/", "env": {}, "judge_digest": "x"}
            client.sendall(json.dumps(request).encode() + b"\n")
            reply = json.loads(client.makefile().readline())
        assert reply["accepted"] is False and "--no-service" in reply["reason"]
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=60)
    assert not socket_path.exists()


def test_without_an_answering_service_the_cli_judges_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    errors = io.StringIO()
    monkeypatch.setenv(local_service.SERVICE_ENV, str(tmp_path / "nobody.sock"))
    assert local_service.judge_via_service(["t.py", "c.py"], stderr=errors) is None
    assert "no judge service answers" in errors.getvalue()
    monkeypatch.delenv(local_service.SERVICE_ENV)
    assert local_service.judge_via_service(["t.py", "c.py"], stderr=errors) is None
