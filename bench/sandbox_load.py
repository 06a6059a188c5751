"""Load benchmark of the sandbox server on loopback.

    python bench/sandbox_load.py                                # 64 sessions, 30 s, CPU, fake judge
    python bench/sandbox_load.py --sessions 64 --duration 60 --judge real
    python bench/sandbox_load.py --mode gpu-throughput --gpus 1 --runs 4   # on a GPU host (H200)
    python bench/sandbox_load.py --mode gpu-throughput --gpus 1 --server-uid 65532   # restricted mode

`tools` mode: N concurrent sessions loop over write / edit / read / grep / bash / (every few rounds)
`verify` for a bounded time and request count, and the table reports tool-call latency p50/p99 and
errors. For bash, "overhead" is the round trip minus the command's own wall time, i.e. what the server,
HTTP and the isolation launcher add. Target: 0 errors and p50 overhead <= 20 ms.

`gpu-throughput` mode: judge throughput on one GPU with 8 concurrent sessions versus 1 session (the
same CUDA example solution, build cached after a warm-up run), and their ratio.

The benchmark starts its own server (as a subprocess on 127.0.0.1) unless --url is given, and stops by
itself; every request goes to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cuda_agent.sandbox.client import SandboxClient, SandboxError
from cuda_agent.sandbox.server.models import JudgeOptions

REPO = Path(__file__).resolve().parents[1]
FAKE_JUDGE = REPO / "tests" / "sandbox" / "fake_judge" / "fake_judge.py"
REAL_JUDGE_DIR = REPO / "sandbox_image" / "cuda_agent" / "sandbox" / "judge"
TASK = REPO / "examples" / "tasks" / "relu_mul_add.py"
SOLUTIONS = REPO / "examples" / "solutions" / "relu_mul_add"


@dataclass
class Stats:
    latency: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    overhead: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: int = 0


def start_server(args: argparse.Namespace, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    judge = (
        [sys.executable, str(FAKE_JUDGE)]
        if args.judge == "fake"
        else [
            sys.executable,
            "-m",
            "cuda_agent.sandbox.judge.cli",
        ]  # the default: judges forked by the zygote
    )
    judge_dir = FAKE_JUDGE.parent if args.judge == "fake" else REAL_JUDGE_DIR
    command = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "sandbox",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(root / "state"),
        "--max-sessions",
        str(max(args.sessions, 8)),
        "--judge-command",
        shlex.join(judge),
        "--judge-dir",
        str(judge_dir),
        "--frozen-dir",
        str(REAL_JUDGE_DIR / "frozen"),
        "--uid-base",
        str(args.uid_base),
        "--max-concurrent-judges",
        str(args.judges),
        "--log-level",
        "WARNING",
    ]
    if args.gpus is not None:
        command += ["--gpus", str(args.gpus)]
    if args.shared_judge_cache:
        command += ["--shared-judge-cache", "true"]
    log = open(root / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, **as_server_uid(args, root))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"{"):
        proc.kill()
        raise SystemExit(f"server did not start: {(root / 'server.log').read_text()[-2000:]}")
    return proc, json.loads(line)["url"]


def as_server_uid(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Popen arguments that start the server as `--server-uid` (a pool pod's uid 65532: restricted mode,
    every session and judge under that one uid), with a state directory and HOME it owns; none when the
    server runs as this process's user (root: root mode)."""
    if args.server_uid is None:
        return {}
    root.chmod(0o755)  # the restricted server lists its state directory's parents for Landlock's rules
    home = root / "home"
    for path in (root / "state", home):
        path.mkdir(mode=0o700)
        os.chown(path, args.server_uid, args.server_uid)
    env = {**os.environ, "HOME": str(home), "USER": "sandbox", "LOGNAME": "sandbox"}
    return {"user": args.server_uid, "group": args.server_uid, "extra_groups": [], "env": env}


async def timed(stats: Stats, tool: str, call: object) -> object:
    start = time.perf_counter()
    try:
        result = await call  # type: ignore[misc]
    except (TimeoutError, SandboxError, OSError) as exc:
        stats.errors.append(f"{tool}: {exc}")
        return None
    elapsed = time.perf_counter() - start
    stats.latency[tool].append(elapsed)
    stats.requests += 1
    if tool == "bash":
        stats.overhead.append(max(0.0, elapsed - result.duration_s))
    if getattr(result, "is_error", False):
        stats.errors.append(f"{tool}: {result.output[:200]}")
    return result


async def agent_loop(
    client: SandboxClient, stats: Stats, index: int, deadline: float, args: argparse.Namespace
) -> None:
    info = await timed(stats, "create_session", client.create_session(TASK.read_text(), name=f"load{index}"))
    if info is None:
        return
    sid = info.session_id  # type: ignore[attr-defined]
    solution = (SOLUTIONS / "cpu" / "model_new.py").read_text()
    rounds = 0
    rng = random.Random(index)

    async def think() -> None:
        # A real agent waits for its LLM between tool calls; 0 makes the loop closed (worst case).
        if args.think_ms > 0:
            await asyncio.sleep(args.think_ms / 1000 * rng.uniform(0.5, 1.5))

    while time.monotonic() < deadline and stats.requests < args.max_requests:
        rounds += 1
        await think()
        await timed(
            stats, "write", client.tool(sid, "write", {"file_path": "model_new.py", "content": solution})
        )
        await timed(
            stats,
            "edit",
            client.tool(sid, "edit", {"file_path": "model_new.py", "old_string": "-O3", "new_string": "-O2"}),
        )
        await think()
        await timed(stats, "read", client.tool(sid, "read", {"file_path": "model_new.py", "limit": 40}))
        await timed(stats, "grep", client.tool(sid, "grep", {"pattern": "relu", "output_mode": "count"}))
        await timed(
            stats, "bash", client.tool(sid, "bash", {"command": "ls -la kernels && wc -l model_new.py"})
        )
        if rounds % args.judge_every == 0:
            await timed(
                stats, "bash(verify)", client.tool(sid, "bash", {"command": "verify", "timeout": 600_000})
            )
    await timed(stats, "delete_session", client.delete_session(sid))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def print_tools_table(stats: Stats, wall: float, args: argparse.Namespace) -> None:
    rows = [
        (tool, len(v), percentile(v, 0.5), percentile(v, 0.99)) for tool, v in sorted(stats.latency.items())
    ]
    # Tool calls excluding the command's own run time: bash counts its overhead, other tools their round trip.
    plain = [
        x
        for tool, v in stats.latency.items()
        if tool not in ("bash", "bash(verify)") and "session" not in tool
        for x in v
    ]
    overall = plain + stats.overhead
    print(
        f"\nsandbox load: {args.sessions} sessions, think {args.think_ms:g} ms, {wall:.1f} s, "
        f"judge={args.judge}, {stats.requests} requests ({stats.requests / wall:.0f}/s), "
        f"{len(stats.errors)} errors"
    )
    for err in stats.errors[:5]:
        print(f"  error: {err}")
    print(f"\n| {'call':<16} | {'count':>6} | {'p50 ms':>8} | {'p99 ms':>8} |")
    print(f"|{'-' * 18}|{'-' * 8}|{'-' * 10}|{'-' * 10}|")
    for tool, count, p50, p99 in rows:
        print(f"| {tool:<16} | {count:>6} | {p50 * 1e3:>8.1f} | {p99 * 1e3:>8.1f} |")
    p50, p99 = percentile(stats.overhead, 0.5), percentile(stats.overhead, 0.99)
    print(f"| {'bash overhead':<16} | {len(stats.overhead):>6} | {p50 * 1e3:>8.1f} | {p99 * 1e3:>8.1f} |")
    print(
        f"| {'ALL tool calls*':<16} | {len(overall):>6} | {percentile(overall, 0.5) * 1e3:>8.1f} | "
        f"{percentile(overall, 0.99) * 1e3:>8.1f} |"
    )
    print("* excluding the command's own run time (bash: overhead; verify excluded)")


async def run_tools(url: str, args: argparse.Namespace) -> None:
    stats = Stats()
    start = time.monotonic()
    deadline = start + args.duration
    async with SandboxClient(url, timeout_s=args.duration + 900) as client:
        await asyncio.gather(*(agent_loop(client, stats, i, deadline, args) for i in range(args.sessions)))
    print_tools_table(stats, time.monotonic() - start, args)


async def judge_throughput(
    client: SandboxClient, concurrency: int, runs: int, device: Literal["cpu", "cuda"]
) -> float:
    """Judge runs per second with `concurrency` sessions each judging `runs` times after a warm-up."""
    solution = (SOLUTIONS / ("cuda" if device == "cuda" else "cpu") / "model_new.py").read_text()
    opts = JudgeOptions(trials=2, profile_trials=20)
    sessions = [
        await client.create_session(TASK.read_text(), device=device, judge=opts) for _ in range(concurrency)
    ]
    for s in sessions:
        await client.tool(s.session_id, "write", {"file_path": "model_new.py", "content": solution})
    warm_start = time.monotonic()
    await asyncio.gather(*(client.judge(s.session_id, "profile") for s in sessions))  # builds, caches
    print(
        f"  {concurrency} session(s): warm-up judge runs took {time.monotonic() - warm_start:.1f} s",
        flush=True,
    )

    async def loop(sid: str) -> None:
        for _ in range(runs):
            run = await client.judge(sid, "profile")
            if run.result is None or run.result.reward < 1:
                raise SystemExit(f"judge run failed: {run.error or run.result}")

    start = time.monotonic()
    await asyncio.gather(*(loop(s.session_id) for s in sessions))
    elapsed = time.monotonic() - start
    for s in sessions:
        await client.delete_session(s.session_id)
    rate = concurrency * runs / elapsed
    print(
        f"  {concurrency} session(s): {concurrency * runs} timed runs in {elapsed:.1f} s ({rate:.3f}/s)",
        flush=True,
    )
    return rate


async def run_gpu_throughput(url: str, args: argparse.Namespace) -> None:
    device: Literal["cpu", "cuda"] = "cuda" if (args.gpus or 0) > 0 else "cpu"
    async with SandboxClient(url) as client:
        one = await judge_throughput(client, 1, args.runs, device)
        eight = await judge_throughput(client, 8, args.runs, device)
        status = await client.status()
    print(f"\njudge throughput on one {device.upper()} ({args.runs} timed runs per session, builds cached)")
    print(f"| {'sessions':>8} | {'judge runs/s':>12} |\n|{'-' * 10}|{'-' * 14}|")
    print(f"| {1:>8} | {one:>12.3f} |\n| {8:>8} | {eight:>12.3f} |")
    waited = status.gpus[0].lock_wait_total_s if status.gpus else 0.0
    print(f"ratio 8 vs 1: {eight / one:.2f}x   (GPU lock wait total {waited:.1f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mode", choices=("tools", "gpu-throughput"), default="tools")
    parser.add_argument("--url", help="an already running server (default: start one)")
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (tools mode)")
    parser.add_argument("--max-requests", type=int, default=50_000, help="stop after this many requests")
    parser.add_argument(
        "--judge",
        choices=("fake", "real"),
        default="fake",
        help="fake: the tests' stand-in judge (server path only); real: cuda-agent judge",
    )
    parser.add_argument("--think-ms", type=float, default=0.0, help="mean agent think time between calls")
    parser.add_argument("--judge-every", type=int, default=5, help="verify every N rounds per session")
    parser.add_argument("--judges", type=int, default=2, help="--max-concurrent-judges of the started server")
    parser.add_argument(
        "--shared-judge-cache",
        action="store_true",
        help="one build cache for all sessions: a faster warm-up (timed runs are cached either way)",
    )
    parser.add_argument("--gpus", type=int, default=None)
    parser.add_argument("--runs", type=int, default=4, help="timed judge runs per session (gpu-throughput)")
    parser.add_argument("--uid-base", type=int, default=52000)
    parser.add_argument(
        "--server-uid",
        type=int,
        help="start the server as this uid (65532, a pool pod's: restricted mode); needs root",
    )
    args = parser.parse_args()
    if args.mode == "gpu-throughput":
        args.judge = "real"
        args.sessions = max(args.sessions, 9)
        args.judges = max(args.judges, 8)
    root = Path(tempfile.mkdtemp(prefix="cuda-agent-sandbox-bench-", dir="/tmp"))
    os.chmod(root, 0o711)
    proc = None
    try:
        url = args.url
        if url is None:
            proc, url = start_server(args, root)
        runner = run_tools if args.mode == "tools" else run_gpu_throughput
        asyncio.run(runner(url, args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
        if os.environ.get("OUT") and (root / "server.log").exists():  # the device tool's result folder
            shutil.copy(root / "server.log", Path(os.environ["OUT"]) / "sandbox_server.log")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
