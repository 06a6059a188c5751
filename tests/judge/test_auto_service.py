"""`cuda-agent judge` reuses a warm judge service of its own (issue 30, part 3): the first call with
CUDA_AGENT_JUDGE_AUTO_SERVICE=1 (what a terminal gets by default) starts one in the background and judges
in-process; the next call is forked from the service's warm zygote, with the same verdict. Through the
real CLI and the real service on CPU."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fixture_catalog import SOLUTIONS_DIR, TASKS_DIR, parse_single_json

from cuda_agent.sandbox.judge import build, local_service
from cuda_agent.sandbox.judge.config import default_cache_dir


def _judge(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    entry = Path(sys.executable).with_name("cuda-agent")
    task, candidate = TASKS_DIR / "relu_mul_add.py", SOLUTIONS_DIR / "relu_mul_add" / "cpu"
    command = [str(entry), "judge", str(task), str(candidate), "--device", "cpu", "--json"]
    command += ["--compile-mode", "none", "--trials", "3"]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=900, check=False)


def _service_pid(path: Path, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
            pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            return int(pid)
        except OSError:
            time.sleep(1.0)
        finally:
            sock.close()
    return None


@pytest.mark.slow
def test_the_cli_starts_and_then_reuses_its_own_service(tmp_path: Path) -> None:
    # A short directory: a Unix socket's path is limited to 107 bytes, and pytest's tmp_path is long.
    runtime = Path(tempfile.mkdtemp(prefix="ca-", dir="/tmp"))
    env = {
        **os.environ,
        "XDG_RUNTIME_DIR": str(runtime),
        "CUDA_AGENT_JUDGE_AUTO_SERVICE": "1",
        # The judge's shared build cache, as every other judge test: what this test asserts (the service
        # starts, is reused, gives the same verdict, stays off when asked) does not depend on a cold
        # build, and a private cache rebuilt the precompiled header and the candidate on each run.
        "CUDA_AGENT_JUDGE_CACHE": str(default_cache_dir()),
        "CUDA_AGENT_TASK_SCALE": "small",
    }
    env.pop(local_service.SERVICE_ENV, None)
    socket_path = runtime / "cuda-agent" / f"judge-service-{local_service.judge_digest()[:16]}.sock"
    first = _judge(env, tmp_path)
    pid = None
    try:
        assert first.returncode == 0, first.stderr[-3000:]
        assert "started a warm judge service" in first.stderr
        pid = _service_pid(socket_path, 300)
        assert pid is not None, (
            socket_path.with_suffix(".log").read_text()
            if socket_path.with_suffix(".log").exists()
            else "no log"
        )
        second = _judge(env, tmp_path)
        assert second.returncode == 0, second.stderr[-3000:]
        assert "judged by the judge service" in second.stderr
        one, two = parse_single_json(first.stdout), parse_single_json(second.stdout)
        assert one["reward"] >= 1 and two["reward"] == one["reward"] and two["correct"] is True
        # Off means off: no service is asked.
        third = _judge({**env, "CUDA_AGENT_JUDGE_AUTO_SERVICE": "0"}, tmp_path)
        assert "judge service" not in third.stderr
    finally:
        if pid is not None:
            os.kill(pid, 15)
        shutil.rmtree(runtime, ignore_errors=True)


def test_auto_service_only_at_a_terminal_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(local_service.AUTO_ENV, "0")
    assert not local_service.auto_service_enabled()
    monkeypatch.setenv(local_service.AUTO_ENV, "1")
    assert local_service.auto_service_enabled()
    monkeypatch.delenv(local_service.AUTO_ENV)
    assert local_service.auto_service_enabled() == (os.isatty(0) and os.isatty(2))  # pytest: not a terminal
    assert local_service.judge_digest()[:16] in local_service.auto_socket_path().name


def test_image_seed_is_used_only_when_root_owned_and_root_writable(tmp_path: Path) -> None:
    seed = tmp_path / "judge-seed"
    seed.mkdir()
    # Under /tmp (world-writable): refused, whoever owns the seed itself.
    assert build.image_seed(str(seed)) is None
    assert build.image_seed(str(tmp_path / "missing")) is None
    root = os.stat("/")
    if root.st_uid == 0 and not root.st_mode & 0o022:  # a root-owned chain of go-w directories is trusted
        assert build.image_seed("/") == "/"
