#!/usr/bin/env python3
"""Evaluations per GPU-hour of `cuda-agent eval` on one H200, today's way and a sandbox pod's way, one call.

    OUT=/some/dir python3 bench/eval_throughput_gpu.py --deps /tmp/site

The task set is the one of docs/eval.md's 467/h run: the 12 example CUDA solutions (examples/solutions,
`--device cuda`) at full task scale, 12 local judge processes in flight (`--jobs 12`), strict FP32,
torch.compile mode default. Each configuration is one `python -m cuda_agent.cli eval` of its own, with its own
empty build cache (which holds the judges' inductor and triton caches, `<cache>/baseline`):

  baseline  as the 467/h figure was measured (tests/gpu/eval_gpu.py): no judge service, no judge seed (the
            variable names a missing directory, so the image's seed is not picked up either); every judge
            imports torch itself and the first judge of each flag set compiles the precompiled header.
  pod       as a sandbox pod runs it today: the judge seed built ahead as sandbox_image/Dockerfile builds it
            (/opt/cuda-agent/judge-seed, root-owned, GPU hidden; the judges find it by themselves), a warm
            `cuda-agent judge-service` started ahead, and eval's judge processes handing their evaluations
            to it (CUDA_AGENT_JUDGE_SERVICE). The seed build and the service start are not timed.
  pod-known-tasks  (diagnostic, optional) the pod again on its build cache with every build removed
            (pch/, obj/, ext/): only the torch.compile baseline cache of the pod run (`baseline/`: inductor,
            triton) and the measured device limits stay: new builds, tasks this pod has compiled before.

Only evaluations with a verdict count. The rewards of every task must agree between configurations (reward
integrity); a difference is printed as MISMATCH and the exit status is 1. Logs, results.jsonl and report.json
of each run are packed into $OUT/eval_throughput_logs.tar.gz; a JSON summary is $OUT/eval_throughput.json.
The last lines printed are the table: config, evaluations, wall s, evaluations/GPU-hour, ratio to the
baseline, mean reward.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
IMAGE_SEED = Path("/opt/cuda-agent/judge-seed")
# Steps for the breakdown: the build, then what runs under the device lock (orchestrator.judge_candidate),
# the worker's torch.compile baseline among them (inside the verify phase's wait for "imported").
BREAKDOWN = ("build", "references", "worker.compile_baseline", "candidate_import", "trials.worker")


def base_env(deps: Path | None) -> dict[str, str]:
    paths = [str(REPO / "platform"), str(REPO / "trainer"), str(REPO / "sandbox_image")]
    if deps is not None:
        paths.insert(0, str(deps))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_AGENT_JUDGE")}
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        CUDA_AGENT_TASK_SCALE="full",
        PYTHONUNBUFFERED="1",
        CUDA_AGENT_JUDGE_AUTO_SERVICE="0",  # only the service a configuration names
    )
    return env


def run_eval(
    label: str, env: dict[str, str], work: Path, logs: Path, jobs: int, deadline: float
) -> dict[str, Any]:
    """One `cuda-agent eval` over the example CUDA solutions; its rows, report and wall time."""
    out = work / f"eval-{label}"
    command = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "eval",
        "--solutions",
        str(REPO / "examples" / "solutions"),
    ]
    command += ["--tasks", str(REPO / "examples" / "tasks"), "--device", "cuda", "--out", str(out)]
    command += ["--jobs", str(jobs), "--no-progress"]
    start = time.monotonic()
    with (logs / f"{label}.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            code = proc.wait(timeout=deadline)
        except subprocess.TimeoutExpired:
            proc.terminate()
            code = proc.wait()
            log.write(f"\neval_throughput: deadline {deadline:.0f} s reached\n")
    wall = time.monotonic() - start
    rows: dict[str, dict[str, Any]] = {}
    results = out / "results.jsonl"
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["key"]] = row
        shutil.copy(results, logs / f"{label}.results.jsonl")
    report: dict[str, Any] | None = None
    if (out / "report.json").exists():
        report = json.loads((out / "report.json").read_text())
        shutil.copy(out / "report.json", logs / f"{label}.report.json")
    judged = [r for r in rows.values() if r["status"] == "judged"]
    # The eval's own wall (its report: judging start to end, as in the 467/h figure); this script's timer
    # (which adds the eval process's start) when it wrote no report.
    hours = float((report or {}).get("wall_s") or wall) / 3600.0
    return {
        "label": label,
        "exit": code,
        "wall_s": round(wall, 2),
        "rows": rows,
        "judged": len(judged),
        "per_gpu_hour": round(len(judged) / hours, 1) if judged else 0.0,
        "report_per_gpu_hour": (report or {}).get("evaluations_per_gpu_hour"),
        "report_wall_s": (report or {}).get("wall_s"),
        "mean_reward": round(statistics.fmean(r["reward"] for r in judged), 3) if judged else None,
        "via_service": sum(1 for r in judged if r.get("judge_service")),
    }


def build_seed(env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    """The image's seed, as sandbox_image/Dockerfile builds it: GPU hidden, then root-owned and go-w."""
    shutil.rmtree(IMAGE_SEED, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "cuda_agent.sandbox.judge.seed",
        "--out",
        str(IMAGE_SEED),
        "--device",
        "cuda",
    ]
    with (logs / "seed.log").open("wb") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**env, "CUDA_VISIBLE_DEVICES": ""}
        )


def start_service(env: dict[str, str], sock: Path, logs: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "cuda_agent.sandbox.server.judge_service", "--socket", str(sock)]
    log = (logs / "service.log").open("wb")
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def service_answers(sock: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(sock))
        return True
    except OSError:
        return False
    finally:
        probe.close()


def breakdown(result: dict[str, Any]) -> str:
    """Medians and sums over the judged rows of where an evaluation's time went."""
    judged = [r for r in result["rows"].values() if r["status"] == "judged"]
    if not judged:
        return f"{result['label']}: no judged rows"

    def stat(values: list[float]) -> str:
        return f"p50 {statistics.median(values):5.1f} max {max(values):5.1f} sum {sum(values):6.1f}"

    lines = [f"{result['label']} (seconds over {len(judged)} evaluations):"]
    lines.append(f"  {'evaluation wall':<28} {stat([r['seconds'] for r in judged])}")
    lines.append(
        f"  {'build-cache lock wait (PCH)':<28} {stat([r.get('build_lock_wait_s') or 0.0 for r in judged])}"
    )
    lines.append(f"  {'device lock wait':<28} {stat([r.get('lock_wait_s') or 0.0 for r in judged])}")
    for phase in ("build", "verify", "profile"):
        lines.append(
            f"  {'phase ' + phase:<28} {stat([(r.get('phase_s') or {}).get(phase, 0.0) for r in judged])}"
        )
    for step in BREAKDOWN:
        lines.append(
            f"  {'step ' + step:<28} {stat([(r.get('steps_s') or {}).get(step, 0.0) for r in judged])}"
        )
    held = [
        (r.get("phase_s") or {}).get("verify", 0.0)
        + (r.get("phase_s") or {}).get("profile", 0.0)
        + (r.get("steps_s") or {}).get("device_limits", 0.0)
        for r in judged
    ]
    lines.append(f"  {'device lock held (approx.)':<28} {stat(held)}  (device_limits + verify + profile)")
    return "\n".join(lines)


def rows_table(results: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """Per task: reward, speedups and seconds in each configuration; the keys whose rewards differ."""
    keys = sorted({k for r in results for k in r["rows"]})
    head = f"{'candidate':<26}" + "".join(
        f" | {r['label'][:15]:<15} rwd  eager compile    s" for r in results
    )
    lines, mismatched = [head], []
    for key in keys:
        line, rewards = f"{key:<26}", set()
        for result in results:
            row = result["rows"].get(key)
            if row is None:
                line += f" | {'-':<15} {'-':>3} {'-':>6} {'-':>7} {'-':>5}"
                continue
            rewards.add(row["reward"] if row["status"] == "judged" else row["status"])
            eager = f"{row['speedup_eager']:.2f}" if row.get("speedup_eager") else "-"
            comp = f"{row['speedup_compile']:.2f}" if row.get("speedup_compile") else "-"
            line += (
                f" | {row['status'][:15]:<15} {row['reward']:>3} {eager:>6} {comp:>7} {row['seconds']:>5.1f}"
            )
        if len(rewards) > 1:
            mismatched.append(key)
            line += "  MISMATCH"
        lines.append(line)
    return "\n".join(lines), mismatched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deps", type=Path, default=None, help="extra PYTHONPATH directory (pydantic)")
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--configs", default="baseline,pod,pod-known-tasks")
    parser.add_argument("--deadline", type=float, default=200.0, help="seconds for one eval run")
    parser.add_argument(
        "--budget", type=float, default=540.0, help="skip a configuration that could not end by then"
    )
    args = parser.parse_args()
    begun = time.monotonic()
    top = Path(os.environ.get("OUT", "eval_throughput_out"))
    logs = top / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = base_env(args.deps.resolve() if args.deps else None)
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, pydantic, cuda_agent.eval.cli; print(torch.__version__, "
         "torch.cuda.get_device_name(0), 'host cores', __import__('os').cpu_count())"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    print(probe.stdout.strip() or probe.stderr.strip()[-2000:], flush=True)
    if probe.returncode != 0:
        return 2
    configs = args.configs.split(",")
    results: list[dict[str, Any]] = []
    service: subprocess.Popen[bytes] | None = None
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="eval-thru-") as tmp:
        work = Path(tmp)
        try:
            if "baseline" in configs:
                baseline_env = {
                    **env,
                    "CUDA_AGENT_JUDGE_CACHE": str(work / "cache-baseline"),
                    "CUDA_AGENT_JUDGE_SEED": str(work / "no-seed-here"),
                }
                results.append(run_eval("baseline", baseline_env, work, logs, args.jobs, args.deadline))
                print(f"[baseline] {time.monotonic() - begun:.0f} s", flush=True)
            pods = [c for c in configs if c.startswith("pod")]
            if pods:
                ahead = time.monotonic()
                sock = work / "run" / "judge.sock"
                seed = build_seed(env, logs)
                service = start_service(env, sock, logs)
                seed_code = seed.wait(timeout=400)
                subprocess.run(["chmod", "-R", "go-w", str(IMAGE_SEED)], check=False)
                seed_s = time.monotonic() - ahead
                while not service_answers(sock) and service.poll() is None and time.monotonic() - ahead < 400:
                    time.sleep(0.5)
                notes.append(
                    f"ahead of the pod runs (untimed): seed exit {seed_code} in {seed_s:.1f} s (GPU hidden); "
                    f"service answering after {time.monotonic() - ahead:.1f} s"
                )
                print(notes[-1], flush=True)
                pod_env = {**env, "CUDA_AGENT_JUDGE_SERVICE": str(sock)}
                if "pod" in pods:
                    pod_env["CUDA_AGENT_JUDGE_CACHE"] = str(work / "cache-pod")
                    results.append(run_eval("pod", pod_env, work, logs, args.jobs, args.deadline))
                    print(f"[pod] {time.monotonic() - begun:.0f} s", flush=True)
                if "pod-known-tasks" in pods:
                    last_wall = results[-1]["wall_s"] if results else args.deadline
                    if time.monotonic() - begun + last_wall * 1.3 > args.budget:
                        notes.append("pod-known-tasks skipped: it would not end within --budget")
                    else:
                        # The pod's own cache with every build removed (paths unchanged, so inductor finds
                        # its entries where it wrote them); baseline/ and device-limits/ stay.
                        for part in ("pch", "obj", "ext", "tmp"):
                            shutil.rmtree(work / "cache-pod" / part, ignore_errors=True)
                        results.append(
                            run_eval("pod-known-tasks", pod_env, work, logs, args.jobs, args.deadline)
                        )
                        print(f"[pod-known-tasks] {time.monotonic() - begun:.0f} s", flush=True)
        finally:
            if service is not None:
                service.terminate()
                try:
                    service.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    service.kill()
    table, mismatched = rows_table(results)
    details = "\n\n".join(breakdown(r) for r in results)
    (logs / "tables.txt").write_text(table + "\n\n" + details + "\n")
    summary = [{k: v for k, v in r.items() if k != "rows"} for r in results]
    (top / "eval_throughput.json").write_text(json.dumps({"results": summary, "notes": notes}, indent=2))
    shutil.make_archive(str(top / "eval_throughput_logs"), "gztar", root_dir=logs)
    print(table)
    print()
    print(details)
    print()
    for note in notes:
        print(note)
    for r in results:
        print(
            f"{r['label']}: eval exit {r['exit']}, {r['via_service']}/{r['judged']} judged through the "
            f"service; eval's report: {r['report_per_gpu_hour']}/GPU-hour over {r['report_wall_s']} s "
            f"(process wall {r['wall_s']} s)"
        )
    if mismatched:
        print(f"MISMATCH: rewards differ between configurations for {', '.join(mismatched)}")
    base = next((r for r in results if r["label"] == "baseline"), None)
    print()
    print(f"| {'config':<16} | evaluations | wall s | evaluations/GPU-hour | ratio | mean reward |")
    for r in results:
        ratio = f"{r['per_gpu_hour'] / base['per_gpu_hour']:.2f}x" if base and base["per_gpu_hour"] else "-"
        print(
            f"| {r['label']:<16} | {r['judged']:>11} | {r['report_wall_s'] or r['wall_s']:>6.1f} "
            f"| {r['per_gpu_hour']:>20.0f} "
            f"| {ratio:>5} | {r['mean_reward']} |"
        )
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
