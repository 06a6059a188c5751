"""On a lent GPU: a judge confined as a user-namespaced pool's judges are (restricted mode, one uid, a user
namespace with its own PID, mount, IPC and network namespaces, Landlock, the judge's seccomp filter) still
judges on the GPU, taking the GPU's lock as under the server (CUDA_AGENT_GPU_LOCK, the lock files in its
Landlock rules); its /dev/shm is its own, and it sees no process but its own (it is its namespace's pid 1).

The confinement is the server's own (`Isolation.judge_spec`, then the launcher), built as uid 65532 (the
sandbox pods' uid), so this checks exactly what such a pod's judges get, minus the pod itself. Run as root
on the GPU host (it drops to 65532 for the check), with pydantic on --deps:

    python3 tests/gpu/userns_judge_check.py --deps /tmp/site --out $OUT [--user-namespaces off]

`--user-namespaces off` checks the restricted fallback (any pool without `userNamespaces: Required`):
no namespaces, Landlock hiding other processes' /proc/<pid> from agent commands (nvcc must still work)
and from the judge's worker, and the GPU judgement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SANDBOX_UID = 65532
TASK = "examples/tasks/relu_mul_add.py"
CANDIDATE = "examples/solutions/relu_mul_add/cuda"
CODE = ("platform", "trainer", "sandbox_image", TASK, CANDIDATE)
PROBE = (
    "echo planted > /dev/shm/judge-probe && ls -A /dev/shm | tr '\\n' ' '; echo; "
    "cat /proc/self/uid_map; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | tr '\\n' ' '; echo; "
    "echo pid $$ sees $(ls /proc | grep -c '^[0-9]') processes, pid 1: $(tr '\\0' ' ' < /proc/1/cmdline)"
)
MAX_VISIBLE = 8  # the probe's shell (pid 1), ls, grep and the command substitutions' subshells


def _paths(code: Path) -> str:
    return os.pathsep.join(str(code / d) for d in ("deps", "platform", "trainer", "sandbox_image"))


def copy_code(code: Path, deps: str) -> None:
    """The checkout may sit below a directory the sandbox uid cannot enter (/root): a readable copy."""
    for rel in CODE:
        source, target = REPO / rel, code / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    if deps:
        shutil.copytree(deps, code / "deps")
    subprocess.run(["chmod", "-R", "a+rX", str(code.parent)], check=True)


def agent_probe(isolation: Any, state: Path, env: dict[str, str]) -> dict[str, object]:
    """An agent command as the server builds it: what it sees of other processes, and whether nvcc still
    compiles where Landlock hides /proc/<pid> (restricted mode without user namespaces)."""
    session = state / "sessions" / "0"
    for d in ("workspace", "tmp", "shm"):  # what an agent command may write of its session (issue 32)
        (session / d).mkdir(parents=True, exist_ok=True)
    (session / "workspace" / "k.cu").write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n")
    command = (
        "{ tr '\\0' ' ' < /proc/1/cmdline; } 2>&1 | tail -c 80; echo; "
        "nvcc -c k.cu -o k.o && echo nvcc-ok; "
        "python3 -c 'import torch; print(\"torch\", torch.__version__)'; "
        # Ignoring CUDA_VISIBLE_DEVICES="" must not reach the GPU: Landlock gives agents no device to write.
        "env -u CUDA_VISIBLE_DEVICES "
        "python3 -c 'import torch; print(\"gpu\", torch.cuda.is_available())' 2>&1"
    )
    path = f"{env['PATH']}:/usr/local/cuda/bin"
    agent_env = env | {"HOME": str(session / "workspace"), "TMPDIR": str(session / "tmp"), "PATH": path}
    argv = ["/bin/bash", "-c", command]
    cwd = str(session / "workspace")
    spec = isolation.agent_spec(isolation.slot(0), argv, agent_env, cwd, [str(session)])
    proc = subprocess.run(isolation.launch_argv(spec), capture_output=True, text=True, timeout=300)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    # Hidden: refused (no namespaces), or pid 1 is the command itself (its own PID namespace).
    first = lines[0] if lines else ""
    return {
        "agent_output": " | ".join(lines)[-400:],
        "agent_pid1_hidden": "Permission denied" in first or "echo nvcc-ok" in first,
        "agent_nvcc_ok": "nvcc-ok" in lines,
        "agent_gpu_unreachable": "gpu False" in lines,
    }


def check(state: Path, code: Path, user_namespaces: str) -> dict[str, object]:
    """As the sandbox uid: build the server's judge spec (user-namespaced, or the restricted fallback with
    `off`) and run a probe, an agent command and one GPU judgement."""
    sys.path[:0] = _paths(code).split(os.pathsep)
    from cuda_agent.api.judge_files import JUDGE_USER
    from cuda_agent.sandbox.gpu_lock import GPU_LOCK_ENV, GpuTicketLock
    from cuda_agent.sandbox.server.config import SandboxServerConfig
    from cuda_agent.sandbox.server.isolation import Isolation

    config = SandboxServerConfig(state_dir=state, isolation="restricted", user_namespaces=user_namespaces)
    isolation = Isolation(config, "restricted", private_mounts=False)
    job = state / "jobs" / "0"
    snapshot, scratch, cache = job / "snapshot", job / "scratch", state / "cache"
    for d in (snapshot, scratch, cache):
        d.mkdir(parents=True, exist_ok=True)
    shutil.copy(code / TASK, snapshot / "task.py")
    shutil.copytree(code / CANDIDATE, snapshot / "candidate")
    (state / "gpu").mkdir(mode=0o770)
    lock = GpuTicketLock(state / "gpu" / "gpu0.lock")  # as the server makes it (JudgeService.prepare_dirs)
    lock.create(os.getgid())
    env = isolation.base_env() | {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": _paths(code),
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "USER": JUDGE_USER,  # as the server's judge environment (JudgeService._process_env)
        "LOGNAME": JUDGE_USER,
        "PYTHONDONTWRITEBYTECODE": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "CUDA_AGENT_JUDGE_CACHE": str(cache),
        GPU_LOCK_ENV: str(lock.path),
    }
    # What the server lets a GPU judge write (JudgeService._run_in_slot): scratch, cache, its GPU's lock.
    writable = [str(scratch), str(cache), str(lock.path), str(lock.owners_dir)]
    slot = isolation.slot(0)
    result: dict[str, object] = {"user_namespaces": isolation.user_namespaces, "uid": os.getuid()}

    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        spec = isolation.judge_spec(slot, argv, env, str(scratch), writable, [str(job)])
        return subprocess.run(
            isolation.launch_argv(spec), capture_output=True, text=True, timeout=timeout, check=False
        )

    # Which step, if any, keeps CUDA from starting: each variant of the judge's spec runs a CUDA probe.
    cuda_probe = [
        sys.executable,
        "-c",
        "import torch; print(torch.cuda.device_count(), torch.ones(1, device='cuda').item())",
    ]
    base = isolation.judge_spec(slot, cuda_probe, env, str(scratch), writable, [str(job)])
    fallback: dict[str, Any] = dict.fromkeys(
        ("new_userns", "new_mountns", "new_ipcns", "new_netns", "new_pidns"), False
    ) | {"masks": []}
    landlock = base["landlock"] or {"read": [], "write": []}
    variants: dict[str, dict[str, Any]] = {
        "judge spec (userns+mnt+ipc+net)": {},
        "fallback (no namespaces)": fallback,
        "fallback, no landlock": fallback | {"landlock": None},
        "fallback, landlock writes /proc/self": fallback
        | {"landlock": {"read": landlock["read"], "write": [*landlock["write"], "/proc/self"]}},
        "fallback, landlock writes /proc/driver": fallback
        | {"landlock": {"read": landlock["read"], "write": [*landlock["write"], "/proc/driver"]}},
        "fallback, landlock writes /proc/self/task": fallback
        | {"landlock": {"read": landlock["read"], "write": [*landlock["write"], "/proc/self/task"]}},
        "userns spec, no landlock": {"landlock": None},
        "userns spec, no PID namespace": {"new_pidns": False},
    }
    for name, change in variants.items() if user_namespaces == "on" else ():
        proc = subprocess.run(
            isolation.launch_argv(base | change), capture_output=True, text=True, timeout=120, check=False
        )
        result[f"cuda: {name}"] = (proc.stdout.strip() or proc.stderr.strip()[-160:]).replace("\n", " | ")
    result |= agent_probe(isolation, state, env)
    probe = run(["/bin/sh", "-c", PROBE], 60)
    result["probe"] = (probe.stdout + probe.stderr).strip()
    seen = re.search(r"pid (\d+) sees (\d+) processes", probe.stdout)
    result["probe_pid_namespace"] = seen is not None and seen[1] == "1" and int(seen[2]) <= MAX_VISIBLE
    result["host_dev_shm_has_probe"] = Path("/dev/shm/judge-probe").exists()
    start = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "judge",
        str(snapshot / "task.py"),
        str(snapshot / "candidate"),
    ]
    judged = run([*argv, "--device", "cuda", "--json", "--compile-mode", "none", "--no-service"], 400)
    result["judge_wall_s"] = round(time.monotonic() - start, 1)
    result["judge_rc"] = judged.returncode
    try:
        verdict = json.loads(judged.stdout)
        result |= {k: verdict.get(k) for k in ("reward", "correct", "speedup", "violations", "error")}
    except json.JSONDecodeError:
        result["stdout_tail"] = judged.stdout[-1500:]
    result["stderr_tail"] = judged.stderr[-1500:]
    result["judge_sees_processes"] = "other processes stay visible" in judged.stdout + judged.stderr
    held = lock.read()
    result["gpu_lock"] = {
        "acquisitions": held.acquisitions,
        "held": held.holder is not None,
        "queued": held.queued,
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deps", default="")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--state", type=Path, default=Path("/srv/cuda-agent-userns-check"))
    parser.add_argument("--user-namespaces", choices=("on", "off"), default="on")
    args = parser.parse_args()
    shutil.rmtree(args.state, ignore_errors=True)
    Path("/dev/shm/judge-probe").unlink(missing_ok=True)  # left by an earlier run without namespaces
    code, state = args.state / "code", args.state / "state"
    copy_code(code, args.deps)
    state.mkdir(parents=True)
    os.chown(state, SANDBOX_UID, SANDBOX_UID)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the sandbox uid, as a pod runs it: no supplementary groups, no capabilities
        os.close(read_fd)
        os.setgroups([])
        os.setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
        os.setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
        try:
            payload = check(state, code, args.user_namespaces)
        except Exception as exc:  # reported, not raised: the parent prints the table
            payload = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write_fd, json.dumps(payload).encode())
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        raw = pipe.read()
    os.waitpid(pid, 0)
    result = json.loads(raw) if raw else {"error": "no result"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"userns_judge_check_{args.user_namespaces}.json").write_text(json.dumps(result, indent=1))
    for key, value in result.items():
        print(f"{key:<24} {str(value)[:300]}")
    ok = result.get("reward") in (1, 2, 3) and result.get("agent_pid1_hidden") is True
    ok = ok and result.get("agent_nvcc_ok") is True and result.get("judge_sees_processes") is False
    ok = ok and result.get("agent_gpu_unreachable") is True
    ok = ok and result.get("gpu_lock") == {"acquisitions": 1, "held": False, "queued": 0}
    if args.user_namespaces == "on":
        ok = ok and result.get("user_namespaces") is True and result.get("probe_pid_namespace") is True
        ok = ok and not result.get("host_dev_shm_has_probe")
    print("userns_judge_check:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
