"""A stand-in for the judge CLI with the same contract, for the sandbox server's own tests.

The server's tests are about the server (isolation, queueing, locking, what reaches the judge), so they
need a judge whose verdict they control and which reports what it observed from inside its process. The
real judge is exercised by tests/sandbox/test_real_judge.py. Behaviour is chosen by markers in the
candidate's files: BUILD_ERROR, WRONG, SLEEP=<seconds>, HOLD_GPU=<seconds>; a task containing TASK_ERROR
exits 2 as the real judge does for a broken task.
"""

import ctypes
import hashlib
import json
import os
import re
import socket
import sys
import time
from pathlib import Path


def candidate_text(path: Path) -> str:
    if path.is_file():
        return path.read_text()
    return "\n".join(p.read_text(errors="replace") for p in sorted(path.rglob("*")) if p.is_file())


def probe_isolation(candidate: Path) -> dict:
    """What candidate code inside the judge could do: the tests assert these are all refused."""
    seen: dict = {"uid": os.getuid(), "gid": os.getgid()}
    try:
        with socket.create_connection(("127.0.0.1", int(os.environ.get("FAKE_JUDGE_PROBE_PORT", "1"))), 1):
            seen["network"] = "connected"
    except OSError as exc:
        seen["network"] = f"refused: {exc.strerror or exc}"
    target = candidate if candidate.is_dir() else candidate.parent
    try:
        (target / "planted.txt").write_text("x")
        seen["candidate_writable"] = True
    except OSError:
        seen["candidate_writable"] = False
    seen["env_keys"] = sorted(os.environ)
    # Processes it can see: in a PID namespace of its own, only itself (its init) and what it started.
    seen["pid"] = os.getpid()
    seen["visible_pids"] = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())[:20]
    # What an earlier judge left in the shared scratch places, then a plant for the next one to find.
    seen["scratch_left_by_others"] = sorted(
        str(p) for d in ("/dev/shm", "/tmp") if os.path.isdir(d) for p in Path(d).glob("judge-planted-*")
    )
    planted = []
    for d in ("/dev/shm", "/tmp"):
        try:
            (Path(d) / f"judge-planted-{os.getpid()}").write_text("x")
            planted.append(d)
        except OSError:
            pass
    seen["scratch_planted"] = planted
    # SysV shared memory (IPC_PRIVATE, 4 KiB): an id in an IPC namespace of its own, -1 where refused.
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(0, 4096, 0o1600)
    if shm >= 0:
        libc.shmctl(shm, 0, None)  # IPC_RMID
    seen["sysv_shm"] = shm >= 0
    return seen


def main() -> int:
    # The real judge's command line, read by the real judge's own code: the JudgeConfig a real judge would
    # run with is what this stand-in reports, so the server's tests check the options where they arrive.
    from pydantic import ValidationError

    from cuda_agent.sandbox.judge import cli as judge_cli

    args = judge_cli.parse_args(sys.argv[1:])
    try:
        config = judge_cli.build_config(args, args.device or "cpu")
    except (ValueError, ValidationError) as exc:
        print(f"judge: {exc}", file=sys.stderr)
        return 2
    try:
        task = Path(args.task).read_text()
    except OSError as exc:
        print(f"judge: cannot read task {args.task}: {exc}", file=sys.stderr)
        return 2
    if "TASK_ERROR" in task:
        print("judge: task failed to run: TASK_ERROR marker", file=sys.stderr)
        return 2
    candidate = Path(args.candidate)
    text = candidate_text(candidate)
    if m := re.search(r"SLEEP=([\d.]+)", text):
        time.sleep(float(m.group(1)))
    lock_wait = 0.0
    held = []
    if m := re.search(r"HOLD_GPU=([\d.]+)", text):
        from cuda_agent.sandbox.gpu_lock import device_lock

        # The real judge's lock: the server's per-GPU state file from CUDA_AGENT_GPU_LOCK.
        with device_lock(config.device, Path(os.environ.get("TMPDIR", "/tmp"))).acquire() as hold:
            start = time.time()
            time.sleep(float(m.group(1)))
            held = [start, time.time()]
            lock_wait = hold.wait_s
    cache = os.environ.get("CUDA_AGENT_JUDGE_CACHE")
    cached = False
    if cache:
        key = Path(cache, hashlib.sha256(text.encode()).hexdigest()[:16])
        cached = key.exists()
        key.parent.mkdir(parents=True, exist_ok=True)
        key.write_text("built")
    compiled = "BUILD_ERROR" not in text
    correct = compiled and "WRONG" not in text
    result = {
        "reward": 3 if correct else -1,
        "compiled": compiled,
        "correct": correct,
        "violations": [],
        "error": None if correct else ("build failed" if not compiled else "wrong result: trial 1"),
        "timings_ms": {"candidate": 1.0, "eager": 2.0, "compile": 1.5},
        "speedup": {"eager": 2.0, "compile": 1.5},
        "cv": {"candidate": 0.01, "eager": 0.01, "compile": 0.01},
        "precision": config.precision,
        "device": config.device,
        "build_log": None if compiled else "kernels/k.cpp:1: error: BUILD_ERROR",
        "seconds": {"build": 0.0, "verify": 0.0, "profile": 0.0},
        "build_cached": cached,
        "lock_wait_s": lock_wait,
        "argv": sys.argv[1:],
        "config": config.model_dump(mode="json", exclude={"ops"}),
        "held": held,
        "candidate_kind": "dir" if candidate.is_dir() else "file",
        "observed": probe_isolation(candidate),
    }
    print("candidate output must never reach stdout", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
