"""Helpers that run a real sandbox server (`cuda-agent sandbox serve`) as a subprocess on 127.0.0.1.

The server's tests use the fake judge in tests/sandbox/fake_judge (same CLI contract, verdict chosen by
markers in the candidate, reports what it observed from inside) because they test the server; the real
judge has its own tests in test_real_judge.py.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cuda_agent.sandbox.client import SyncSandboxClient
from cuda_agent.sandbox.server.workspace_fs import remove_tree

HERE = Path(__file__).parent
FAKE_JUDGE_DIR = HERE / "fake_judge"
FAKE_JUDGE = FAKE_JUDGE_DIR / "fake_judge.py"
REAL_JUDGE_DIR = Path(__file__).parents[2] / "sandbox_image" / "cuda_agent" / "sandbox" / "judge"
SECRET = "s3cr3t-server-only-value"
# The machine's judge seed for servers running the real judge: without it every server's judges compile
# torch's headers cold (~40 s on two cores). Content-keyed (torch, compiler, flags), so one directory serves
# every run and torch version; root-mode judges reach it although /root is 0700 (the server exposes it).
JUDGE_SEED_DIR = Path.home() / ".cache" / "cuda-agent" / "judge-seed"
JUDGE_SEED_FLAGS = "-O3"  # the example solutions' load_inline extra_cflags
STARTUP_TIMEOUT_S = 60.0

TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.relu(a * b)


def get_inputs():
    return [torch.randn(64, 64), torch.randn(64, 64)]


def get_init_inputs():
    return []
"""

# Outside /tmp: agent commands get the session's own /tmp, so a state directory below it would have to be
# re-exposed inside every session's /tmp (restricted mode refuses that, see isolation.agent_scratch).
STATE_ROOT = "/var/lib/cuda-agent-tests" if os.geteuid() == 0 else None


def state_root(prefix: str, mode: int = 0o711) -> Path:
    """A fresh directory for one server's state (the sandbox uids must reach their sessions; a restricted
    server lists the directories above its state directory for Landlock, so needs 0755)."""
    if STATE_ROOT is not None:
        os.makedirs(STATE_ROOT, exist_ok=True)
        os.chmod(STATE_ROOT, 0o755)
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=STATE_ROOT))
    os.chmod(root, mode)
    return root


# Each server gets its own uid range so tests never collide with a server left by another run.
_next_uid_base = [61000 + 2000 * (os.getpid() % 8)]


def needs_root() -> pytest.MarkDecorator:
    return pytest.mark.skipif(os.geteuid() != 0, reason="root-mode isolation needs uid 0")


@dataclass
class RunningServer:
    url: str
    pid: int
    proc: subprocess.Popen[bytes]
    state_dir: Path
    log: Path
    uid_base: int
    metrics_port: int | None = None
    client: SyncSandboxClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = SyncSandboxClient(self.url, timeout_s=300)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def healthy(self) -> bool:
        return self.proc.poll() is None and self.client.request("GET", "/healthz")[0] == 200

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@functools.cache
def judge_seed() -> Path:
    """The seed, built once per machine: `cuda-agent judge-seed` keeps entries already there (seconds) and
    holds the seed's lock while building, so the two xdist workers never build it twice."""
    argv = [sys.executable, "-m", "cuda_agent.cli", "judge-seed", "--out", str(JUDGE_SEED_DIR)]
    argv.append(f"--flags={JUDGE_SEED_FLAGS}")
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return JUDGE_SEED_DIR


def start_server(
    *args: str,
    judge_dir: Path = FAKE_JUDGE_DIR,
    judge_command: list[str] | None = None,
    env: dict[str, str] | None = None,
    pid1: bool = False,
) -> RunningServer:
    """Start a server on a free port; its state directory is searchable by the sandbox uids. A server
    running the real judge gets the machine's judge seed (its judges then build no precompiled header).
    `pid1`: as PID 1 of a PID namespace of its own (`unshare --pid --fork --mount-proc`), as in a pod
    (the ready line's pid is then the namespace's)."""
    root = state_root("sbx-")
    uid_base = _next_uid_base[0]
    _next_uid_base[0] += 200
    command_words = judge_command or [sys.executable, str(judge_dir / "fake_judge.py")]
    command = [
        *(["unshare", "--pid", "--fork", "--kill-child=SIGTERM", "--mount-proc"] if pid1 else []),
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "sandbox",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(root / "state"),
        "--uid-base",
        str(uid_base),
        "--judge-command",
        shlex.join(command_words),
        "--judge-dir",
        str(judge_dir),
        "--frozen-dir",
        str(REAL_JUDGE_DIR / "frozen"),
        "--max-sessions",
        "8",
        "--metrics-port",
        "0",
        *(["--judge-seed", str(judge_seed())] if judge_dir == REAL_JUDGE_DIR else []),
        *args,
    ]
    log = root / "server.log"
    server_env = {**os.environ, "CUDA_AGENT_TEST_SECRET": SECRET, **(env or {})}
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log_file, env=server_env)
    assert proc.stdout is not None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    line = b""
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        if line.startswith(b"{"):
            break
    if not line.startswith(b"{"):
        proc.kill()
        raise RuntimeError(f"sandbox server did not start:\n{log.read_text()[-4000:]}")
    ready = json.loads(line)
    return RunningServer(
        ready["url"], ready["pid"], proc, root / "state", log, uid_base, ready.get("metrics_port")
    )


def cleanup(server: RunningServer) -> None:
    server.stop()
    # rm, not shutil.rmtree: a test's session may leave a 2,000-deep tree in the trash (the server's own
    # background removal may not have reached it), and shutil.rmtree recurses into RecursionError there.
    remove_tree(server.state_dir.parent)


RESTRICTED_SERVER_UID = 60900  # no passwd entry needed


def start_restricted_server(*args: str, pid1: bool = False) -> RunningServer:
    """A server without root, as in a Pod Security "restricted" pod: started under an unprivileged uid
    through the server's own launcher (which also hides /root, where this machine's interpreter lives).
    `pid1`: as PID 1 of a PID namespace of its own with its own /proc, as in a pod."""
    from cuda_agent.sandbox.server.isolation import launch_argv, unconfined_spec

    uid = RESTRICTED_SERVER_UID
    root = state_root("sbx-r-", mode=0o755)
    state = root / "state"
    state.mkdir()
    os.chown(state, uid, uid)
    argv = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "sandbox",
        "serve",
        "--port",
        "0",
        "--state-dir",
        str(state),
        "--judge-command",
        f"{sys.executable} {FAKE_JUDGE}",
        "--judge-dir",
        str(FAKE_JUDGE_DIR),
        "--frozen-dir",
        str(REAL_JUDGE_DIR / "frozen"),
        "--workspace-quota-mib",
        "64",
        *args,
    ]
    expose = sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))})
    env = {"PATH": "/usr/bin:/bin", "HOME": str(state), "CUDA_AGENT_TEST_SECRET": SECRET}
    spec = unconfined_spec(
        argv,
        env,
        str(state),
        uid=uid,
        gid=uid,
        new_mountns=True,
        new_pidns=pid1,
        masks=[{"path": "/root", "expose": expose}],
    )
    log = root / "server.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(launch_argv(spec), stdout=subprocess.PIPE, stderr=log_file)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"{"):
        proc.kill()
        raise RuntimeError(f"restricted server did not start:\n{log.read_text()[-3000:]}")
    ready = json.loads(line)
    return RunningServer(ready["url"], ready["pid"], proc, state, log, 0)
