"""The local executor end to end: `cuda-agent operator --executor local` against the real control plane
starts, per TrainingRun, a real sandbox server (`cuda-agent sandbox serve`, judging on this CPU) and a
trainer process; the trainer's status writes move the run's phase and step; deletion stops the processes;
a crashing trainer is restarted with backoff and then fails the run with its exit reason.

The trainer here is a stand-in (tests/operator/standin_trainer.py, configured with --trainer-command): it
gets exactly what the real `cuda-agent train` gets and writes status through the API like it, but trains
nothing, which keeps this test to seconds. The demo (`cuda-agent demo`) runs the real trainer."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from operator_harness import Namespace, OperatorProcess, pool_manifest, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_run_cluster import artifacts_secret

from cuda_agent.api.sandbox import machine_gpus

STANDIN = Path(__file__).with_name("standin_trainer.py")


def local_run(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "cuda-agent.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"base": "/models/tiny"},
            "dataset": {"uri": "/data/tasks"},
            "sandboxPoolRef": {"name": "pool"},
            "algorithm": {"steps": 3},
            "checkpoint": {"everySteps": 1},
            "resources": {"trainerGpus": 1, "rolloutGpus": 0},
            "reward": {
                "precision": "tf32",
                "tolerance": {"atol": 0.003, "rtol": 0.004},
                "speedupMargin": 0.2,
            },
        },
    }


def start_local_operator(factory: Callable[..., OperatorProcess], run_dir: Path) -> OperatorProcess:
    return factory(
        "--executor", "local", "--run-dir", str(run_dir), "--restart-backoff", "0.2",
        "--suspend-checkpoint-timeout", "60",
        "--trainer-command", f"{sys.executable} {STANDIN} -f {{run_yaml}}",
    )  # fmt: skip


def status(ns: Namespace, name: str) -> dict[str, Any]:
    return dict((ns.get_or_none("trainingrun", name) or {}).get("status") or {})


def trainer_pid(run_dir: Path) -> int:
    """The stand-in trainer's pid (0 while the file is being written)."""
    text = (run_dir / "standin.pid").read_text().strip()
    return int(text) if text else 0


def serving_pid(run_dir: Path) -> int:
    """The pid of the sandbox server that started last (its "serving" line in the run's sandbox.log)."""
    lines = (run_dir / "sandbox.log").read_text().splitlines()
    return int(json.loads([line for line in lines if '"serving"' in line][-1])["pid"])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_local_run_reports_progress_suspends_resumes_and_stops_on_deletion(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    namespace.apply(pool_manifest("pool", 1))
    namespace.apply(artifacts_secret())
    start_local_operator(operator_factory, tmp_path / "runs")
    namespace.apply(local_run("learn"))

    wait_for(lambda: status(namespace, "learn").get("step") == 3, "step 3 written by the trainer")
    wait_for(lambda: status(namespace, "learn").get("phase") == "Running", "phase Running", timeout=30)
    run_dir = tmp_path / "runs" / namespace.name / "learn"
    assert status(namespace, "learn")["metrics"] == {"meanReward": 2.0, "passRate": 0.75}
    assert "stand-in trainer: step 3" in (run_dir / "trainer.log").read_text()
    configmap = namespace.get("configmap", "learn-config")
    assert (run_dir / "run.yaml").read_text() == configmap["data"]["run.yaml"]
    # The episode settings the trainer got: the run's spec.reward, and the device of what the pool's
    # server judges on here (the pool asks for one GPU; this machine's server has what the machine has).
    handed = json.loads((run_dir / "episode.json").read_text())
    device = "cuda" if machine_gpus() else "cpu"
    assert (handed["episode"]["device"], handed["session_device"]) == (device, device)
    judge = handed["episode"]["judge"]
    assert (judge["precision"], judge["atol"], judge["rtol"], judge["margin"]) == ("tf32", 0.003, 0.004, 0.2)
    pid, sandbox_pid = trainer_pid(run_dir), serving_pid(run_dir)
    assert alive(pid) and alive(sandbox_pid)
    assert namespace.items("pods", "-l", "cuda-agent.io/training-run=learn") == []  # no pods in this mode

    # Suspension: the trainer reports a checkpoint and exits 0, which is not the end of the run; the
    # sandbox server stops too. Resuming starts a new trainer (from that checkpoint), which reports again.
    namespace.kubectl("patch", "trainingrun", "learn", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: status(namespace, "learn").get("phase") == "Suspended", "phase Suspended")
    wait_for(lambda: not alive(pid) and not alive(sandbox_pid), "both processes to stop on suspension")
    # Under the prefix the operator derived inside the namespace's storage (bucket/namespace/run/uid).
    uid = namespace.get("trainingrun", "learn")["metadata"]["uid"]
    checkpoint = f"s3://cuda-agent/{namespace.name}/learn/{uid}/checkpoints/step-3"
    assert status(namespace, "learn")["lastCheckpoint"] == checkpoint
    suspended = namespace.condition("trainingrun/learn", "Suspended")
    assert suspended is not None and f"resumes from {checkpoint}" in suspended["message"]
    namespace.kubectl("patch", "trainingrun", "learn", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    wait_for(lambda: trainer_pid(run_dir) != pid, "a new trainer after resuming")
    wait_for(lambda: status(namespace, "learn").get("phase") == "Running", "phase Running again")
    pid, sandbox_pid = trainer_pid(run_dir), serving_pid(run_dir)
    assert alive(pid) and alive(sandbox_pid)

    namespace.kubectl("delete", "trainingrun", "learn", "--wait=true")
    wait_for(lambda: not alive(pid), "the trainer to stop after the run's deletion", timeout=60)
    wait_for(lambda: not alive(sandbox_pid), "the sandbox server to stop after the run's deletion")


def test_crashing_trainer_fails_the_run_with_its_exit_reason_and_a_finished_one_succeeds(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    namespace.apply(pool_manifest("pool", 1))
    namespace.apply(artifacts_secret())
    start_local_operator(operator_factory, tmp_path / "runs")
    namespace.apply(local_run("crash-run"))
    namespace.apply(local_run("finish-run"))

    wait_for(lambda: status(namespace, "crash-run").get("phase") == "Failed", "the crashing run to fail")
    failed = namespace.condition("trainingrun/crash-run", "Failed")
    # runPolicy.backoffLimit 3 (the default): the fourth crash ends it; the log's tail is in the message.
    assert failed is not None and failed["reason"] == "BackoffLimitExceeded"
    assert "4 times" in failed["message"] and "exit code 3" in failed["message"]
    assert "crashing on purpose" in failed["message"]
    wait_for(lambda: status(namespace, "finish-run").get("phase") == "Succeeded", "the finished run")
    assert status(namespace, "finish-run")["step"] == 3


def test_only_storage_settings_of_the_artifacts_secret_reach_the_local_trainer(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    """The Secret is the run author's; the trainer runs as the operator's user, on the machine that holds
    the control plane's credentials: keys such as PYTHONWARNINGS or BROWSER (which together ran a shell
    command at every trainer start) must not become its environment. Storage settings pass, by name."""
    namespace.apply(pool_manifest("pool", 1))
    secret = artifacts_secret()
    secret["stringData"] |= {
        "AWS_REGION": "eu-west-1",
        "PYTHONWARNINGS": "ignore::antigravity.x",
        "BROWSER": f"touch {tmp_path / 'pwned'}",
        "LD_PRELOAD": "/nonexistent/preload.so",
        "CUDA_AGENT_PVC_ROOT": "/",  # the operator's own setting (--pvc-root), never the Secret's
    }
    namespace.apply(secret)
    start_local_operator(operator_factory, tmp_path / "runs")
    namespace.apply(local_run("learn"))
    wait_for(lambda: status(namespace, "learn").get("step") == 3, "step 3 written by the trainer")
    env = json.loads((tmp_path / "runs" / namespace.name / "learn" / "standin.env.json").read_text())
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and env["AWS_ACCESS_KEY_ID"] == "a"
    assert env["AWS_REGION"] == "eu-west-1"
    for name in ("PYTHONWARNINGS", "BROWSER", "LD_PRELOAD", "CUDA_AGENT_PVC_ROOT"):
        assert name not in env, name
    assert not (tmp_path / "pwned").exists()
    # What the trainer needs from the operator besides the Secret: a port of its own for /metrics (the
    # operator's own CUDA_AGENT_* settings never pass), scraped here from the running process.
    port = int(env["CUDA_AGENT_METRICS_PORT"])
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    steps = {s.labels["stage"]: s.value for s in families["cuda_agent_trainer_step"].samples}
    assert steps == {"ppo": 3.0}
    assert [s.value for s in families["cuda_agent_trainer_pass_rate"].samples] == [0.75]


def test_a_suspend_while_the_pool_is_gone_still_checkpoints_and_stops_the_processes(
    namespace: Namespace, operator_factory: Callable[..., OperatorProcess], tmp_path: Path
) -> None:
    namespace.apply(pool_manifest("pool", 1))
    namespace.apply(artifacts_secret())
    start_local_operator(operator_factory, tmp_path / "runs")
    namespace.apply(local_run("learn"))
    wait_for(lambda: status(namespace, "learn").get("phase") == "Running", "phase Running")
    run_dir = tmp_path / "runs" / namespace.name / "learn"
    pid, sandbox_pid = trainer_pid(run_dir), serving_pid(run_dir)

    namespace.kubectl("delete", "sandboxpool", "pool")
    wait_for(
        lambda: (
            (namespace.condition("trainingrun/learn", "Provisioning") or {}).get("reason")
            == "SandboxPoolNotFound"
        ),
        "the missing pool to be reported",
    )
    assert status(namespace, "learn")["phase"] == "Running"  # what runs, not Pending
    namespace.kubectl("patch", "trainingrun", "learn", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    wait_for(lambda: status(namespace, "learn").get("phase") == "Suspended", "phase Suspended", timeout=60)
    assert status(namespace, "learn")["lastCheckpoint"].endswith("/step-3")  # the trainer's checkpoint
    wait_for(lambda: not alive(pid) and not alive(sandbox_pid), "both processes to stop on suspension")
