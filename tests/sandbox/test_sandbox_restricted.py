"""Restricted mode: the server runs without root (as in a Pod Security "restricted" pod), so agent code
shares its uid; no_new_privs, the seccomp filter, rlimits and a non-dumpable server must still contain
the escapes that do not need a second uid. The test starts the server under an unprivileged uid through
the server's own launcher (which also hides /root, where this machine's interpreter lives)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import FAKE_JUDGE, REAL_JUDGE_DIR, SECRET, TASK, RunningServer, needs_root

from cuda_agent.sandbox.server.isolation import launch_argv

pytestmark = needs_root()
SERVER_UID = 60900  # no passwd entry needed


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    root = Path(tempfile.mkdtemp(prefix="cuda-agent-sbx-restricted-", dir="/tmp"))
    os.chmod(root, 0o755)
    state = root / "state"
    state.mkdir()
    os.chown(state, SERVER_UID, SERVER_UID)
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
        str(FAKE_JUDGE.parent),
        "--frozen-dir",
        str(REAL_JUDGE_DIR / "frozen"),
        "--workspace-quota-mib",
        "64",
    ]
    expose = sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))})
    spec = {
        "argv": argv,
        "env": {"PATH": "/usr/bin:/bin", "HOME": str(state), "CUDA_AGENT_TEST_SECRET": SECRET},
        "cwd": str(state),
        "uid": SERVER_UID,
        "gid": SERVER_UID,
        "groups": [],
        "rlimits": {},
        "new_netns": False,
        "new_mountns": True,
        "masks": [{"path": "/root", "expose": expose}],
        "hide": [],
        "seccomp": None,
        "oom_score_adj": None,
        "umask": 0o022,
    }
    log = root / "server.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(launch_argv(spec), stdout=subprocess.PIPE, stderr=log_file)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(b"{"):
        proc.kill()
        raise RuntimeError(f"restricted server did not start:\n{log.read_text()[-3000:]}")
    ready = json.loads(line)
    running = RunningServer(ready["url"], ready["pid"], proc, state, log, 0)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_server_reports_restricted_isolation_and_serves_tools(server: RunningServer) -> None:
    assert server.client.status().isolation == "restricted"
    sid = server.client.create_session(TASK).session_id
    result = server.client.tool(sid, "bash", {"command": "id -u; cat model.py | head -1"})
    assert result.output.splitlines() == [str(SERVER_UID), "import torch"]
    server.client.tool(sid, "write", {"file_path": "model_new.py", "content": "x"})
    verify = server.client.tool(sid, "bash", {"command": "verify"})
    assert "correct: yes" in verify.output


def test_same_uid_agent_cannot_signal_trace_or_read_the_server(server: RunningServer) -> None:
    sid = server.client.create_session(TASK).session_id
    pid = server.pid
    result = server.client.tool(
        sid,
        "bash",
        {
            "command": f"""
kill -9 {pid} 2>&1 | tail -1
python -c "import ctypes, os; l = ctypes.CDLL(None, use_errno=True); \
print(l.ptrace(16, {pid}, 0, 0), os.strerror(ctypes.get_errno()))"
cat /proc/{pid}/environ 2>&1 | tail -1
env | grep -c {SECRET} || true
python -c "import socket; socket.create_connection(('127.0.0.1', {server.port}))" 2>&1 | tail -1
"""
        },
    )
    lines = result.output.strip().splitlines()
    assert lines[0].endswith("Operation not permitted")
    assert lines[1] == "-1 Operation not permitted"
    assert "Permission denied" in lines[2]  # the server is non-dumpable
    assert lines[3] == "0"
    assert lines[4].startswith("PermissionError")
    assert server.healthy()


def test_process_groups_end_with_the_command_and_the_session(server: RunningServer) -> None:
    sid = server.client.create_session(TASK).session_id
    marker = f"sleep 1{os.getpid() % 1000:03d}"
    escape = server.client.tool(
        sid, "bash", {"command": f"{marker} & disown; setsid {marker} 2>&1 | tail -1"}
    )
    assert "Operation not permitted" in escape.output
    server.client.tool(sid, "bash", {"command": marker, "run_in_background": True})
    server.client.delete_session(sid)
    deadline = time.monotonic() + 15
    while (
        time.monotonic() < deadline
        and marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    ):
        time.sleep(0.1)
    assert marker not in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


def test_workspace_quota_is_enforced_after_the_fact(server: RunningServer) -> None:
    sid = server.client.create_session(TASK).session_id
    result = server.client.tool(
        sid, "bash", {"command": "for i in 1 2 3; do head -c 40M /dev/zero > f$i; done"}
    )
    assert result.is_error and "workspace quota exceeded" in result.output
    server.client.tool(sid, "bash", {"command": "rm -f f1 f2 f3"})
    assert server.client.tool(sid, "bash", {"command": "echo fine"}).output == "fine\n"


def test_landlock_keeps_sessions_sharing_one_uid_apart(server: RunningServer) -> None:
    first = server.client.create_session(TASK)
    second = server.client.create_session(TASK)
    server.client.tool(first.session_id, "write", {"file_path": "secret.txt", "content": "first's kernel"})
    state_dir = Path(first.workspace).parents[2]
    result = server.client.tool(
        second.session_id,
        "bash",
        {
            "command": f"""
cat {first.workspace}/secret.txt 2>&1 | tail -1
ls {state_dir}/jobs 2>&1 | tail -1
echo planted > {first.workspace}/planted 2>&1 | tail -1
echo mine > own.txt && cat own.txt
"""
        },
    )
    lines = result.output.strip().splitlines()
    assert all("Permission denied" in line for line in lines[:3]), lines
    assert lines[3] == "mine" and "first's kernel" not in result.output
    # Landlock ABI >= 6 scopes signals: the other session's processes are out of reach too.
    job = server.client.tool(
        first.session_id, "bash", {"command": "echo $$; exec sleep 300", "run_in_background": True}
    )
    pids: list[str] = []
    for _ in range(100):
        out = server.client.tool(first.session_id, "bash_output", {"bash_id": job.bash_id})  # type: ignore[attr-defined]
        pids += [line for line in out.output.splitlines() if line.isdigit()]
        if pids:
            break
        time.sleep(0.05)
    pid = pids[0]
    killed = server.client.tool(second.session_id, "bash", {"command": f"kill -9 {pid} 2>&1 | tail -1"})
    assert killed.output.strip().endswith("Operation not permitted")
    # Inside the judge (same uid as well) the candidate snapshot cannot be changed.
    server.client.tool(second.session_id, "write", {"file_path": "model_new.py", "content": "x"})
    run = server.client.judge(second.session_id, "verify")
    assert run.result is not None and run.result.model_extra is not None
    assert run.result.model_extra["observed"]["candidate_writable"] is False
