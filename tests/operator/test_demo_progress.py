"""The demo's progress and its `--keep` notice, without a cluster.

Progress: fed the TrainingRun objects a poll would read, off a terminal it prints one line each time the
phase, step or live condition changes (not one per poll); on a terminal it is a tqdm bar labelled with the
phase. `--keep`: the printed teardown commands, run in bash, stop what was left running; `sleep` processes
stand in for the operator and MinIO (the real ones need the local control plane: test_demo.py runs those),
and the `cluster down` line runs the real command against a cluster directory of the test's."""

from __future__ import annotations

import io
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from cuda_agent.demo import RunProgress, left_running
from cuda_agent.localcluster.cluster import ClusterConfig
from cuda_agent.localcluster.minio import LocalMinio


def run(phase: str | None, step: int | None, condition: tuple[str, str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if step is not None:
        status["step"] = step
    if condition is not None:
        kind, reason, message = condition
        status["conditions"] = [{"type": kind, "status": "True", "reason": reason, "message": message}]
    return {"spec": {"algorithm": {"steps": 3}}, "status": status}


PROVISIONED = ("Provisioned", "Running", "local sandbox server at http://127.0.0.1:1; trainer running, pid 7")
POLLS = [
    run(None, None),
    run(None, None),
    run("Provisioning", None),
    run("WarmingUp", 0, PROVISIONED),
    run("WarmingUp", 0, PROVISIONED),
    run("Training", 1, PROVISIONED),
    run("Training", 1, PROVISIONED),
    run("Training", 2, PROVISIONED),
    run("Succeeded", 3, ("Succeeded", "Completed", "3 steps")),
]


def test_off_a_terminal_a_line_per_change_with_phase_and_step() -> None:
    stream = io.StringIO()
    progress = RunProgress(POLLS[0], tty=False, started=time.monotonic(), stream=stream)
    for polled in POLLS:
        progress.update(polled, news="trainer: something new every poll")
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 6, lines  # 9 polls, 6 distinct (phase, step, condition)
    shown = [line.split("] ", 1)[1].split()[:3] for line in lines]
    assert shown == [
        ["Pending", "step", "0/3"],
        ["Provisioning", "step", "0/3"],
        ["WarmingUp", "step", "0/3"],
        ["Training", "step", "1/3"],
        ["Training", "step", "2/3"],
        ["Succeeded", "step", "3/3"],
    ]
    assert "Provisioned: Running local sandbox server" in lines[2]
    assert "[##########--------------------]" in lines[3]  # a third of the bar at step 1 of 3


def test_on_a_terminal_a_bar_labelled_with_the_phase() -> None:
    stream = io.StringIO()
    progress = RunProgress(POLLS[0], tty=True, started=time.monotonic(), stream=stream)
    progress.update(POLLS[5], news="ppo step 1: reward -1.0")
    progress.row("finish-demo   Training   1")
    progress.update(POLLS[7])
    progress.close()
    text = stream.getvalue()
    frames = [frame for frame in text.replace("\n", "\r").split("\r") if frame.strip()]
    assert any(f.startswith("Training ") and "step 1/3" in f and "reward -1.0" in f for f in frames), frames
    assert any(f.startswith("Training ") and "step 2/3" in f and "Provisioned: Running" in f for f in frames)
    assert "finish-demo   Training   1" in frames


def test_keep_prints_teardown_commands_that_stop_everything(tmp_path: Path) -> None:
    operator = subprocess.Popen(["sleep", "600"])
    minio = LocalMinio(tmp_path / "minio" / "data")
    minio.process = subprocess.Popen(["sleep", "600"])
    try:
        cluster = ClusterConfig(name="kept-demo", workdir=tmp_path / "kwok")
        notice = left_running(cluster, tmp_path / "kubeconfig.yaml", tmp_path / "work", operator, minio)
        assert f"operator: pid {operator.pid}, log {tmp_path / 'work' / 'operator.log'}" in notice
        assert f"MinIO: {minio.url}, pid {minio.process.pid}" in notice
        assert f"export KUBECONFIG={tmp_path / 'kubeconfig.yaml'}" in notice
        commands = notice.split("To tear everything down:\n", 1)[1].splitlines()
        assert commands[0].strip().startswith(f"kill {operator.pid};")
        assert commands[1].strip() == f"kill {minio.process.pid}"
        assert commands[2].strip().endswith(f"cluster --name kept-demo --workdir {tmp_path / 'kwok'} down")
        # After a real --keep the demo has exited and init reaps its orphans; here this process is their
        # parent, so it reaps them (a zombie would answer `kill -0` forever).
        reapers = [threading.Thread(target=p.wait, daemon=True) for p in (operator, minio.process)]
        for reaper in reapers:
            reaper.start()
        script = "set -e\n" + "\n".join(commands[:3])  # the optional rm -rf is not run
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        for reaper in reapers:
            reaper.join(timeout=10)
        assert (operator.returncode, minio.process.returncode) == (-15, -15)  # SIGTERM, and gone
        assert "cluster 'kept-demo' is down" in done.stdout
    finally:
        for process in (operator, minio.process):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_keep_after_the_operator_exited_names_only_what_is_left(tmp_path: Path) -> None:
    operator = subprocess.Popen(["true"])
    operator.wait()
    notice = left_running(ClusterConfig(name="cuda-agent-demo"), tmp_path / "k", tmp_path, operator, None)
    assert "kill" not in notice and "operator: pid" not in notice
    assert "cluster --name cuda-agent-demo down" in notice and "--workdir" not in notice  # the default one
