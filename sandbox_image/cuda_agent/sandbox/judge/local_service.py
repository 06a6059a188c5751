"""The CLI side of the local judge service (`cuda-agent judge-service`): a warm judge zygote that the
`cuda-agent judge` command hands its evaluation to, so a cached evaluation does not pay for importing
torch and inductor again (H200: 16.8 s from the CLI against 2.3 s forked from a zygote).

Two ways in. Explicit: CUDA_AGENT_JUDGE_SERVICE names the socket (`cuda-agent judge-service` prints the
line to export). Automatic, for a user at a terminal (stdin and stderr are terminals, or
CUDA_AGENT_JUDGE_AUTO_SERVICE=1; =0 turns it off): the CLI looks for its own service at a per-user,
per-judge-version socket (`auto_socket_path`: the judge files' digest is in the name, so a changed judge
gets a service of its own), and when none answers it starts one in the background (exits after 30 min
idle) and judges this evaluation in-process; later calls are forked from the warm zygote. Scripts, tests
and pipes get neither unless they ask. The sandbox server's judges pass --no-service, so a socket a
session planted can never answer for a reward. Either way the peer must run as this user (SO_PEERCRED)
and have loaded the same judge files (their digest), or the CLI judges in-process.

Protocol (newline-delimited JSON on a Unix stream socket): client -> service one request
`{"argv": [...], "cwd": ..., "env": {...}, "judge_digest": ...}`; service -> client
`{"accepted": true, "pid": n}` or `{"accepted": false, "reason": ...}`, then `{"stderr": text}` chunks as
the judge writes them, then `{"stdout": text, "exit": code}`. Closing the connection kills the judge.
Standard library only: the judge CLI loads this before torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cuda_agent.api.judge_files import hash_judge_files, package_judge_dir

SERVICE_ENV = "CUDA_AGENT_JUDGE_SERVICE"
AUTO_ENV = "CUDA_AGENT_JUDGE_AUTO_SERVICE"
NO_SERVICE_FLAG = "--no-service"
CONNECT_TIMEOUT_S = 2.0
AUTO_IDLE_EXIT_S = 1800
MAX_SOCKET_PATH = 104  # bytes a Unix socket's path may take (sun_path is 108 with its NUL, less on BSDs)
SERVICE_MODULE = "cuda_agent.sandbox.server.judge_service"


def judge_digest() -> str:
    """Digest of the judge files this process would run: a service started before they changed is not
    used (its zygote preloaded the old ones)."""
    digest = hashlib.sha256()
    for path, value in sorted(hash_judge_files(package_judge_dir()).items()):
        digest.update(f"{path}\0{value}\0".encode())
    return digest.hexdigest()


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    if peer_uid(sock) != os.getuid():
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def judge_via_service(
    argv: Sequence[str], stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int | None:
    """Run this evaluation in the service named by CUDA_AGENT_JUDGE_SERVICE: its exit code, with its
    output written here; None (judge in-process) when no usable service answers."""
    path = os.environ.get(SERVICE_ENV)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    automatic = not path and auto_service_enabled()
    if automatic:
        path = str(auto_socket_path())
    if not path:
        return None
    sock = _connect(path)
    if sock is None:
        if automatic and len(os.fsencode(path)) >= MAX_SOCKET_PATH:
            err.write(f"cuda-agent judge: {path} is too long for a Unix socket; set XDG_RUNTIME_DIR\n")
        elif automatic:
            start_service(Path(path))
            err.write(
                f"cuda-agent judge: started a warm judge service at {path} for the next evaluations "
                f"(it exits after {AUTO_IDLE_EXIT_S // 60} min idle; {AUTO_ENV}=0 turns this off); "
                "judging this one in this process\n"
            )
        else:
            err.write(f"cuda-agent judge: no judge service answers at {path}; judging in this process\n")
        return None
    with sock, sock.makefile("rwb") as stream:
        request = {
            "argv": list(argv),
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "judge_digest": judge_digest(),
        }
        stream.write(json.dumps(request).encode() + b"\n")
        stream.flush()
        first = _read(stream)
        if not first.get("accepted"):
            err.write(f"cuda-agent judge: the judge service declined ({first.get('reason')}); judging here\n")
            return None
        err.write(f"cuda-agent judge: judged by the judge service at {path} (judge pid {first.get('pid')})\n")
        while True:
            message = _read(stream)
            if "stderr" in message:
                err.write(str(message["stderr"]))
                err.flush()
                continue
            out.write(str(message.get("stdout", "")))
            out.flush()
            return int(message.get("exit", 1))


def _read(stream: Any) -> dict[str, Any]:
    line = stream.readline()
    if not line:
        return {"accepted": False, "reason": "the service closed the connection", "exit": 1}
    message: dict[str, Any] = json.loads(line)
    return message


def auto_service_enabled() -> bool:
    """Reuse (or start) the user's own warm service: at a terminal unless CUDA_AGENT_JUDGE_AUTO_SERVICE=0,
    anywhere with =1."""
    value = os.environ.get(AUTO_ENV, "").strip()
    if value in ("0", "1"):
        return value == "1"
    try:
        return os.isatty(0) and os.isatty(2)
    except OSError:
        return False


def auto_socket_path() -> Path:
    """The automatic service's socket: per user (the runtime directory) and per judge version."""
    return default_socket_path().with_name(f"judge-service-{judge_digest()[:16]}.sock")


def start_service(path: Path) -> None:
    """Start `cuda-agent judge-service` for `path` in the background, detached from this terminal (its
    own session; output to `<socket>.log`). Two calls at once start two, and the second exits at once
    (the service holds `<socket>.lock`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    env = {k: v for k, v in os.environ.items() if k not in (SERVICE_ENV, AUTO_ENV)}
    with open(path.with_suffix(".log"), "ab") as log:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                SERVICE_MODULE,
                "--socket",
                str(path),
                "--idle-exit",
                str(AUTO_IDLE_EXIT_S),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )


def default_socket_path() -> Path:
    """Where `cuda-agent judge-service` listens unless told otherwise: the user's runtime directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "cuda-agent" / "judge-service.sock"
