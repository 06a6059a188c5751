"""Forked workers: they exist from the orchestrator's first step (before the task is even imported), wait
for a key without a deadline, and must die with the orchestrator however it ends, or every killed judge
would leak two idle processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).parents[2] / "examples"


def _pids_running(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


def test_spare_workers_die_with_a_killed_orchestrator(tmp_path: Path) -> None:
    # A task whose import blocks: the orchestrator sits in load_task while its two spares wait.
    task = tmp_path / "blocking_task_for_fork_test.py"
    task.write_text("import time\ntime.sleep(300)\n" + (EXAMPLES / "tasks" / "relu_mul_add.py").read_text())
    candidate = EXAMPLES / "solutions" / "relu_mul_add" / "cpu"
    command = [
        sys.executable,
        "-m",
        "cuda_agent.sandbox.judge.cli",
        str(task),
        str(candidate),
        "--device",
        "cpu",
    ]
    orchestrator = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(_pids_running(task.name)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        family = _pids_running(task.name)
        assert orchestrator.pid in family and len(family) == 3, family  # orchestrator + judge + collect
    finally:
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait()
    deadline = time.monotonic() + 20
    while _pids_running(task.name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _pids_running(task.name) == []
