"""The CLI side of the local judge service (`cuda-agent judge-service`): a warm judge zygote that the
`cuda-agent judge` command hands its evaluation to, so a cached evaluation does not pay for importing
torch and inductor again (H200: 16.8 s from the CLI against 2.3 s forked from a zygote).

Opt-in: only when CUDA_AGENT_JUDGE_SERVICE names the socket (the service prints the line to export).
Never found by a default path: inside the sandbox a session could otherwise plant a socket that answers
with made-up verdicts; the sandbox server also passes --no-service. The peer must run as this user
(SO_PEERCRED) and have loaded the same judge files (their digest), or the CLI judges in-process.

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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cuda_agent.sandbox.judge.files import hash_judge_dir, package_judge_dir

SERVICE_ENV = "CUDA_AGENT_JUDGE_SERVICE"
NO_SERVICE_FLAG = "--no-service"
CONNECT_TIMEOUT_S = 2.0


def judge_digest() -> str:
    """Digest of the judge files this process would run: a service started before they changed is not
    used (its zygote preloaded the old ones)."""
    digest = hashlib.sha256()
    for path, value in sorted(hash_judge_dir(package_judge_dir()).items()):
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
    if not path:
        return None
    out, err = stdout or sys.stdout, stderr or sys.stderr
    sock = _connect(path)
    if sock is None:
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


def default_socket_path() -> Path:
    """Where `cuda-agent judge-service` listens unless told otherwise: the user's runtime directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "cuda-agent" / "judge-service.sock"
