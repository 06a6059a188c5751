"""A sandbox server on this machine: the one launcher of `cuda-agent sandbox serve` for local use.

The operator's local executor (a run's server, supervised), the trainer's demonstrations and `cuda-agent
eval` without --sandbox all start a server here from a pool's server config (cuda_agent.api.pool_server,
placed on this machine by cuda_agent.api.episode.on_this_machine) or from the server's defaults. They
place it the same way: loopback only, no metrics port (a pod's fixed port would collide between local
servers; /metrics stays on the API port), the installed judge package (the server's default judge_dir,
hash-checked before every judge run) and a uid range of its own.

This module only writes a config file and runs a process: it loads no server module (the server validates
its config when it starts and says which field is wrong).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

# Root mode gives every session slot a pair of uids (the agent's and its judge's) above uid_base, and the
# judges' group uid_base - 1 (SandboxServerConfig.sandbox_uids). Several local servers (runs, tests,
# demonstrations) share this machine's uids: each takes a random range of its own above UID_BASE.
UID_BASE, UID_RANGES = 200_000, 10_000
# The server's defaults (SandboxServerConfig), written into every local config so that the uid range
# below is computed from what the server will use (tests/unit/test_local_sandbox.py keeps them equal).
SERVER_MAX_SESSIONS = 64
SERVER_MAX_CONCURRENT_JUDGES = 2
STOP_SECONDS = 30.0  # SIGTERM, then SIGKILL: the server finishes the judge job in flight


def uid_base(max_sessions: int, max_concurrent_judges: int) -> int:
    """A random start of a uid range that no other range this function hands out overlaps: ranges are
    spaced by their whole length (the judges' group, then two uids per session and judge slot)."""
    span = 2 * (max_sessions + max_concurrent_judges) + 2
    return UID_BASE + secrets.randbelow(UID_RANGES) * span


def local_settings(pool_settings: Mapping[str, Any], port: int, state_dir: Path) -> dict[str, Any]:
    """`pool_settings` (a pool's server config, or {} for the server's defaults) placed on this machine:
    loopback on `port` (0: any free port, printed on the ready line), state under `state_dir`, the
    installed judge files, no metrics port, its own uid range."""
    settings = dict(pool_settings)
    settings.pop("judge_dir", None)  # the pod's path is its ConfigMap mount; here the installed package
    settings.pop("judge_seed_dir", None)  # the image's precompiled headers; this machine has none
    settings.setdefault("max_sessions", SERVER_MAX_SESSIONS)
    settings.setdefault("max_concurrent_judges", SERVER_MAX_CONCURRENT_JUDGES)
    settings |= {
        "host": "127.0.0.1",
        "port": port,
        "metrics_port": None,
        "state_dir": str(state_dir),
        "uid_base": uid_base(int(settings["max_sessions"]), int(settings["max_concurrent_judges"])),
    }
    return settings


def write_config(settings: Mapping[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(settings), sort_keys=False))
    return path


def serve_command(config: Path) -> list[str]:
    """The server's argv for a config file, with this interpreter."""
    return [sys.executable, "-m", "cuda_agent.cli", "sandbox", "serve", "--config", str(config)]


def traversable_temp_dir(prefix: str, parent: Path | None = None) -> Path:
    """A fresh directory that the sessions' uids may traverse to reach their workspaces below it. In root
    mode every ancestor of the server's state must be traversable: a home directory (or a test's temp
    dir) is private, so the default parent is the temp dir."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(path, 0o711)
    return path


@contextmanager
def local_server(pool_settings: Mapping[str, Any] | None = None, parent: Path | None = None) -> Iterator[str]:
    """A sandbox server for the duration of the block; yields its URL. Its config, log and state go to a
    fresh directory below `parent` (default: the temp dir; a root-mode server binds a tmpfs over /tmp for
    its children, so one that must outlive that view keeps it elsewhere), removed afterwards."""
    root = traversable_temp_dir("cuda-agent-sandbox-", parent)
    config = write_config(local_settings(pool_settings or {}, 0, root / "state"), root / "sandbox.yaml")
    log_path = root / "server.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(serve_command(config), stdout=subprocess.PIPE, stderr=log_file)
    try:
        assert proc.stdout is not None
        line = b""
        while proc.poll() is None and not line.startswith(b"{"):
            line = proc.stdout.readline()
        if not line.startswith(b"{"):
            raise RuntimeError(f"the sandbox server did not start:\n{log_path.read_text()[-3000:]}")
        yield str(json.loads(line)["url"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)
