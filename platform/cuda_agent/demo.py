"""`cuda-agent demo` (what `make demo` runs): the platform doing its main job on this machine, no GPU needed.

Brings up the local control plane (etcd + kube-apiserver + controllers + kwok GPU nodes), a local MinIO for
artifacts, and `cuda-agent operator --executor local`; applies examples/trainingrun-local.yaml (a CPU
SandboxPool and a small TrainingRun); then shows `kubectl get tr` with PHASE / STEP / REWARD / PASS RATE as
the trainer moves them, and a summary at the end. Everything is torn down afterwards (`--keep` leaves the
cluster, MinIO and the operator running and prints how to reach them and the commands that tear them down).

The run's `pvc://` URIs resolve under a local directory the operator hands the trainer as its PVC root:
`pvc://models/smollm2-135m-instruct` is the offline SmolLM2 package, `pvc://examples/...` this repository's
examples/ directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from cuda_agent.localcluster.binaries import BuildError, GoMissingError
from cuda_agent.localcluster.cli import bring_up
from cuda_agent.localcluster.cluster import (
    ClusterConfig,
    ClusterError,
    KubectlError,
    LocalCluster,
    default_workdir,
)
from cuda_agent.localcluster.minio import LocalMinio
from cuda_agent.storage.claims import prepare_pvc_root

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_RUN_FILE = REPO_ROOT / "examples" / "trainingrun-local.yaml"
NAMESPACE = "default"
ARTIFACTS_SECRET = "cuda-agent-artifacts"  # the operator's default --artifacts-secret
ARTIFACTS_BUCKET = "cuda-agent"  # the operator's default --artifacts-bucket
TERMINAL_PHASES = ("Succeeded", "Failed")
POLL_SECONDS = 2.0
BAR_WIDTH = 30


class DemoError(RuntimeError):
    """A step of the demo could not be done; the message says which and why."""


@dataclass
class Observation:
    """What the demo saw of its run while polling."""

    rewards: list[tuple[int, float]] = field(default_factory=list)  # (step, mean reward) per new step
    pass_rates: list[tuple[int, float]] = field(default_factory=list)
    last_row: str = ""
    timed_out: bool = False


def run_documents(path: Path) -> list[dict[str, Any]]:
    """The SandboxPool and TrainingRun of the run file, in file order."""
    try:
        documents = [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]
    except (OSError, yaml.YAMLError) as error:
        raise DemoError(f"{path}: {error}") from error
    kinds = [doc.get("kind") for doc in documents]
    if kinds.count("TrainingRun") != 1:
        raise DemoError(f"{path}: expected exactly one TrainingRun, found kinds {kinds}")
    return documents


def start_operator(kubeconfig: Path, workdir: Path, trainer_command: str | None) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "cuda_agent.cli", "operator", "--executor", "local",
        "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--sync-period", "5",
        "--run-dir", str(workdir / "runs"), "--pvc-root", str(workdir / "pvc"),
    ]  # fmt: skip
    if trainer_command:
        command += ["--trainer-command", trainer_command]
    with (workdir / "operator.log").open("wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )


def create_artifacts(cluster: LocalCluster, minio: LocalMinio) -> None:
    """The run's artifact bucket in MinIO and the Secret through which the operator and trainer reach it."""
    from cuda_agent.storage.config import StorageConfig
    from cuda_agent.storage.s3 import S3Store

    S3Store(StorageConfig.from_env(minio.secret_data())).ensure_bucket(f"s3://{ARTIFACTS_BUCKET}/")
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": ARTIFACTS_SECRET, "namespace": NAMESPACE},
        "stringData": minio.secret_data(),
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))


def get_run(cluster: LocalCluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.get_json("trainingrun", name, "-n", NAMESPACE)
    return found


def live_condition(status: dict[str, Any]) -> str:
    """The first condition that holds, as `Type: Reason message` (what the operator says it is doing)."""
    live = next((c for c in status.get("conditions") or () if c.get("status") == "True"), None)
    if live is None:
        return ""
    return f"{live.get('type')}: {live.get('reason', '')} {live.get('message', '')}".strip()


def progress_line(run: dict[str, Any]) -> str:
    """`[#####-----] Training  step 2/3  Provisioned: Running local sandbox server at ...`."""
    steps = int(run["spec"].get("algorithm", {}).get("steps", 150))
    status = run.get("status") or {}
    step = int(status.get("step") or 0)
    done = round(BAR_WIDTH * min(step, steps) / steps)
    phase, condition = status.get("phase") or "Pending", live_condition(status)[:90]
    return f"[{'#' * done}{'-' * (BAR_WIDTH - done)}] {phase:<9} step {step}/{steps}  {condition}"


class RunProgress:
    """The run's progress for a person. On a terminal: a tqdm bar redrawn in place, its label the phase, its
    count the steps done of spec.algorithm.steps (with tqdm's rate and time left), after it the live
    condition and the trainer's latest line; it fits the terminal's width. Elsewhere (a log, CI, a pipe):
    one line each time the phase, the step or the live condition changes, never one per poll."""

    def __init__(self, run: dict[str, Any], tty: bool, started: float, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self.started = started
        self._last = ""
        self._bar: Any = None
        if tty:
            from tqdm import tqdm  # the trainer's dependency; the demo runs the trainer on this machine

            steps = int(run["spec"].get("algorithm", {}).get("steps", 150))
            self._bar = tqdm(
                total=steps,
                unit="step",
                file=self.stream,
                dynamic_ncols=True,
                desc=f"{'Pending':<9}",
                bar_format="{desc} |{bar:20}| step {n}/{total} [{elapsed}<{remaining}]{postfix}",
            )

    def row(self, text: str) -> None:
        """A line above the bar (a changed `kubectl get tr` row)."""
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def update(self, run: dict[str, Any], news: str = "") -> None:
        status = run.get("status") or {}
        if self._bar is not None:
            self._bar.set_description_str(f"{status.get('phase') or 'Pending':<9}", refresh=False)
            self._bar.n = min(int(status.get("step") or 0), self._bar.total)
            condition = live_condition(status)
            self._bar.set_postfix_str(f"{condition}" + (f" | {news}" if news else ""), refresh=False)
            self._bar.refresh()
            return
        line = progress_line(run)
        if line != self._last:
            self._last = line
            print(f"{line}  [{time.monotonic() - self.started:.0f}s]", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def trainer_news(log: Path) -> str:
    """The trainer's latest INFO line (stage, kept trajectories, ...), from its log in the run directory."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 16384))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    found = [line.split(": ", 1)[1] for line in lines if " INFO cuda_agent." in line and ": " in line]
    return found[-1] if found else ""


def watch(cluster: LocalCluster, name: str, timeout: float, started: float, run_dir: Path) -> Observation:
    """Print `kubectl get tr` whenever its row changes and the run's progress, until the run ends."""
    seen = Observation()
    header_printed = False
    progress: RunProgress | None = None
    try:
        while True:
            table = cluster.kubectl("get", "trainingrun", name, "-n", NAMESPACE).stdout.splitlines()
            run = get_run(cluster, name)
            status = run.get("status") or {}
            if progress is None:
                progress = RunProgress(run, sys.stdout.isatty(), started)
            if not header_printed and table:
                progress.row(f"\n$ kubectl get tr {name}\n{table[0]}")
                header_printed = True
            row = table[1].rsplit(maxsplit=1)[0] if len(table) > 1 else ""  # AGE ticks: not a change
            if row and row != seen.last_row:
                seen.last_row = row
                progress.row(table[1])
            _record(seen, status)
            progress.update(run, trainer_news(run_dir / "trainer.log"))
            if status.get("phase") in TERMINAL_PHASES:
                return seen
            if time.monotonic() - started > timeout:
                progress.row(f"\nthe run did not finish within {timeout:.0f} s (phase {status.get('phase')})")
                seen.timed_out = True
                return seen
            time.sleep(POLL_SECONDS)
    finally:
        if progress is not None:
            progress.close()


def _record(seen: Observation, status: dict[str, Any]) -> None:
    step, metrics = status.get("step"), status.get("metrics") or {}
    if step is None:
        return
    if metrics.get("meanReward") is not None and (not seen.rewards or seen.rewards[-1][0] != step):
        seen.rewards.append((int(step), float(metrics["meanReward"])))
    if metrics.get("passRate") is not None and (not seen.pass_rates or seen.pass_rates[-1][0] != step):
        seen.pass_rates.append((int(step), float(metrics["passRate"])))


def summary(run: dict[str, Any], seen: Observation, run_dir: Path, minio: LocalMinio | None) -> str:
    """What happened, in words: the end state, whether reward rose, and where the artifacts are."""
    status = run.get("status") or {}
    lines = ["", "Summary", "-------", f"phase: {status.get('phase')}   steps: {status.get('step')}"]
    for condition in status.get("conditions") or ():
        if condition.get("status") == "True":
            lines.append(f"{condition['type']}: {condition.get('reason')} {condition.get('message', '')}")
    lines.append(_trend("mean reward", seen.rewards))
    lines.append(_trend("pass rate", seen.pass_rates))
    lines += _trainer_report(run_dir)
    if status.get("lastCheckpoint"):
        lines.append(f"last checkpoint: {status['lastCheckpoint']}")
    lines.append(f"run directory: {run_dir} (run.yaml, trainer.log, sandbox.log and what the trainer wrote)")
    lines += [f"  {path.relative_to(run_dir)}" for path in sorted(run_dir.rglob("*.png"))]
    trainer_log = run_dir / "trainer.log"
    if status.get("phase") == "Failed" and trainer_log.exists():
        tail = trainer_log.read_text(errors="replace").splitlines()[-15:]
        lines += [f"last lines of {trainer_log}:", *(f"  {line}" for line in tail)]
    if minio is not None:
        lines += _artifacts(minio, run)
    return "\n".join(lines)


def _trainer_report(run_dir: Path) -> list[str]:
    """The trainer's own verdict (summary.json in the run directory): the trend test over PPO steps and how
    far the warm-up stages moved their fits. The lines above are only what the demo saw in status."""
    path = run_dir / "summary.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return [f"trainer report: {path} not written (the trainer did not finish)"]
    lines = [f"PPO reward trend (trainer's test over its steps): {report['ppo_reward_trend']['verdict']}"]
    for stage, fit in report.get("warmup", {}).items():
        moved = ", ".join(f"{k} {v:.4g}" for k, v in fit.items())
        lines.append(f"warm-up {stage}: {moved}")
    lines.append(f"reward curve: {run_dir / 'curves.png'}")
    return lines


def _trend(name: str, reports: Sequence[tuple[int, float]]) -> str:
    # Step 0 reports come from warm-up, which trains on demonstrations: their reward is the
    # demonstrations', not the policy's, so the trend is taken over PPO steps only.
    warmup = [value for step, value in reports if step == 0]
    points = [(step, value) for step, value in reports if step > 0]
    prefix = f"{name}: warm-up (demonstrations) {warmup[-1]:.3f}; " if warmup else f"{name}: "
    if not points:
        return f"{prefix}PPO never reported"
    name = prefix + "PPO"
    first, last = points[0], points[-1]
    if len(points) == 1:
        return f"{name} {last[1]:.3f} at step {last[0]} (one report: no trend)"
    return f"{name} {first[1]:.3f} at step {first[0]} -> {last[1]:.3f} at step {last[0]}"


def _artifacts(minio: LocalMinio, run: dict[str, Any]) -> list[str]:
    from cuda_agent.storage.config import StorageConfig
    from cuda_agent.storage.errors import StorageError
    from cuda_agent.storage.s3 import S3Store

    prefix = f"s3://{ARTIFACTS_BUCKET}/{NAMESPACE}/{run['metadata']['name']}/"
    try:
        objects = list(S3Store(StorageConfig.from_env(minio.secret_data())).list_objects(prefix))
    except StorageError as error:
        return [f"artifacts in MinIO ({prefix}): not listed: {error}"]
    lines = [f"artifacts in MinIO ({minio.url}, {prefix}): {len(objects)} objects"]
    lines += [f"  {item.uri} ({item.size} bytes)" for item in objects[:20]]
    return lines


def stop(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM lets the operator stop its local trainer and sandbox server before it exits."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def cuda_agent_command() -> str:
    """How to run `cuda-agent` from a shell that may not have this virtualenv on its PATH."""
    script = Path(sys.executable).parent / "cuda-agent"
    if script.is_file():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m cuda_agent.cli"


def left_running(
    cluster: ClusterConfig,
    kubeconfig: Path,
    workdir: Path,
    operator: subprocess.Popen[bytes] | None,
    minio: LocalMinio | None,
) -> str:
    """What `--keep` leaves running, how to reach it, and the exact commands that tear it all down: the
    operator first (on SIGTERM it stops its trainer and sandbox server; waited for, so nothing is left
    writing to the apiserver or MinIO), then MinIO, then the control plane."""
    operator_pid = operator.pid if operator is not None and operator.poll() is None else None
    minio_pid = (
        minio.process.pid if minio is not None and minio.process and minio.process.poll() is None else None
    )
    q = shlex.quote
    lines = [
        "",
        "Left running (--keep):",
        f"  export KUBECONFIG={q(str(kubeconfig))}   # kubectl get tr; kubectl describe tr",
    ]
    if operator_pid is not None:
        lines.append(f"  operator: pid {operator_pid}, log {workdir / 'operator.log'}")
    if minio is not None and minio_pid is not None:
        lines.append(
            f"  MinIO: {minio.url}, pid {minio_pid} (its keys: kubectl get secret {ARTIFACTS_SECRET} -o yaml)"
        )
    lines += ["", "To tear everything down:"]
    if operator_pid is not None:
        lines.append(f"  kill {operator_pid}; while kill -0 {operator_pid} 2>/dev/null; do sleep 1; done")
    if minio_pid is not None:
        lines.append(f"  kill {minio_pid}")
    where = "" if cluster.workdir == default_workdir() else f" --workdir {q(str(cluster.workdir))}"
    lines.append(f"  {cuda_agent_command()} cluster --name {cluster.name}{where} down")
    runs = " ".join(q(str(workdir / part)) for part in ("runs", "minio", "pvc", "operator.log"))
    lines.append(f"  rm -rf {runs}   # optional: run directories, MinIO data, PVC root, operator log")
    return "\n".join(lines)


def run_demo(args: argparse.Namespace, cluster: LocalCluster) -> int:
    started = time.monotonic()
    workdir: Path = args.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    documents = run_documents(args.run)
    name = next(doc for doc in documents if doc["kind"] == "TrainingRun")["metadata"]["name"]

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {message}", flush=True)

    say("starting the local control plane (etcd, kube-apiserver, controllers, kwok GPU nodes)")
    if not bring_up(cluster, args.crds):
        raise DemoError(f"no CustomResourceDefinitions in {args.crds}/*.yaml: run `make crds` first")
    kubeconfig = cluster.kubeconfig_path()
    minio: LocalMinio | None = None
    operator: subprocess.Popen[bytes] | None = None
    try:
        say("starting MinIO for the run's artifacts")
        # A demo starts from nothing: no earlier demo's objects, run directories or logs.
        for stale in (workdir / "minio", workdir / "runs"):
            shutil.rmtree(stale, ignore_errors=True)
        minio = LocalMinio(workdir / "minio" / "data")
        minio.start()
        create_artifacts(cluster, minio)
        prepare_pvc_root(workdir / "pvc")
        say(f"starting `cuda-agent operator --executor local` (log: {workdir / 'operator.log'})")
        operator = start_operator(kubeconfig, workdir, args.trainer_command)
        say(f"kubectl apply -f {args.run}")
        cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump_all(documents))
        seen = watch(cluster, name, args.timeout, started, workdir / "runs" / NAMESPACE / name)
        run = get_run(cluster, name)
        print(summary(run, seen, workdir / "runs" / NAMESPACE / name, minio))
        say("stopped at the time limit (--timeout)" if seen.timed_out else "done")
        return 0 if (run.get("status") or {}).get("phase") == "Succeeded" else 1
    finally:
        if not args.keep:
            stop(operator)
            if minio is not None:
                minio.stop()
        else:
            print(left_running(cluster.config, kubeconfig, workdir, operator, minio), flush=True)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="cuda-agent demo", description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave cluster, MinIO and operator running")
    parser.add_argument("--name", default="cuda-agent-demo", help="cluster name (default: %(default)s)")
    parser.add_argument("--crds", type=Path, default=REPO_ROOT / "crds")
    parser.add_argument("--run", type=Path, default=DEFAULT_RUN_FILE, help="SandboxPool + TrainingRun YAML")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path.home() / ".cache" / "cuda-agent" / "demo",
        help="operator log, run directories, MinIO data, PVC root (default: %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument(
        "--trainer-command", help="trainer command line for the operator (default: the real one)"
    )
    args = parser.parse_args(argv)

    cluster = LocalCluster(ClusterConfig(name=args.name, nodes=4))
    if not args.keep and args.workdir.exists():
        shutil.rmtree(args.workdir / "runs", ignore_errors=True)
    try:
        return run_demo(args, cluster)
    except (DemoError, ClusterError, KubectlError, GoMissingError, BuildError, RuntimeError) as err:
        print(f"cuda-agent demo: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ncuda-agent demo: interrupted; stopping everything it started", file=sys.stderr)
        return 130
    finally:
        if not args.keep:
            cluster.down()
