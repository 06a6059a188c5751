"""Escape attempts by agent code (root mode): each must be contained with a clear error, and the server
must keep serving afterwards. docs/sandbox.md's threat model table points at these tests."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sandbox_helpers import (
    FAKE_JUDGE,
    FAKE_JUDGE_DIR,
    SECRET,
    TASK,
    RunningServer,
    cleanup,
    needs_root,
    start_server,
)

from cuda_agent.sandbox.server.models import EvaluateRequest, TaskRef, ToolResult

pytestmark = needs_root()

LIMITS = {
    "agent_limits": {"processes": 64, "memory_mib": 2048, "file_size_mib": 128, "cpu_seconds": 120},
    "workspace_quota_mib": 200,
}


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = Path(tempfile.mkstemp(suffix=".yaml")[1])
    config.write_text(yaml.safe_dump(LIMITS))
    running = start_server("--config", str(config))
    try:
        yield running
    finally:
        cleanup(running)
        config.unlink()


def bash(server: RunningServer, sid: str, command: str, timeout_ms: int = 30000) -> ToolResult:
    result = server.client.tool(sid, "bash", {"command": command, "timeout": timeout_ms})
    assert server.healthy(), f"server stopped serving after: {command}"
    return result


def agent_uid(server: RunningServer, sid: str) -> int:
    return int(bash(server, sid, "id -u").output)


def processes_of(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except FileNotFoundError:
                pass
    return pids


def wait_until_gone(uid: int) -> list[int]:
    """Processes of `uid` still alive after a bounded wait (empty when all are gone)."""
    deadline = time.monotonic() + 15
    while (left := processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_judge_files_cannot_be_written_replaced_or_linked(server: RunningServer, session_id: str) -> None:
    result = bash(
        server,
        session_id,
        f"echo evil >> {FAKE_JUDGE}; rm -f {FAKE_JUDGE}; mv {FAKE_JUDGE} x; "
        f"ln {FAKE_JUDGE} hardlink; touch {FAKE_JUDGE_DIR}/new.py",
    )
    assert result.output.count("Permission denied") >= 3
    # The hard link is refused: protected_hardlinks (EPERM), or the workspace tmpfs is another device.
    assert "Operation not permitted" in result.output or "Invalid cross-device link" in result.output
    assert "evil" not in FAKE_JUDGE.read_text() and not (FAKE_JUDGE_DIR / "new.py").exists()
    # Candidate code inside the judge sees a read-only snapshot, under another uid, without network.
    server.client.tool(session_id, "write", {"file_path": "model_new.py", "content": "x"})
    run = server.client.judge(session_id, "verify")
    assert run.result is not None and run.result.model_extra is not None
    observed = run.result.model_extra["observed"]
    assert observed["candidate_writable"] is False and observed["network"].startswith("refused")
    assert observed["uid"] not in (0, agent_uid(server, session_id))
    assert "CUDA_AGENT_TEST_SECRET" not in observed["env_keys"]


def test_changed_judge_files_stop_all_judging() -> None:
    judge_dir = Path(tempfile.mkdtemp(prefix="cuda-agent-judge-copy-", dir="/tmp"))
    os.chmod(judge_dir, 0o755)
    shutil.copy(FAKE_JUDGE, judge_dir / "fake_judge.py")
    running = start_server(judge_dir=judge_dir)
    try:
        request = EvaluateRequest(task=TaskRef(source=TASK), model_new="x")
        assert running.client.evaluate(request).reward == 3
        with open(judge_dir / "fake_judge.py", "a") as f:
            f.write("\n# tampered\n")
        status, body = running.client.request("POST", "/v1/evaluate", request.model_dump_json().encode())
        assert status == 503 and json.loads(body)["error"].startswith("judge-tampered")
        assert running.client.request("GET", "/healthz")[0] == 503
        assert running.client.status().judge_intact is False
    finally:
        cleanup(running)
        shutil.rmtree(judge_dir)


def test_another_sessions_workspace_is_out_of_reach(server: RunningServer, session_id: str) -> None:
    other = server.client.create_session(TASK)
    try:
        server.client.tool(
            other.session_id, "write", {"file_path": "secret.txt", "content": "other's kernel"}
        )
        ws = other.workspace
        session_dir = str(Path(ws).parent)
        result = bash(
            server,
            session_id,
            f"cat {ws}/secret.txt; ls {ws}; ls {session_dir}/run; "
            f"CUDA_AGENT_JUDGE_SOCKET={session_dir}/run/judge.sock verify",
        )
        assert result.output.count("Permission denied") >= 4 and "other's kernel" not in result.output
        via_tool = server.client.tool(session_id, "read", {"file_path": f"{ws}/secret.txt"})
        assert via_tool.is_error and "outside the workspace" in via_tool.output
    finally:
        server.client.delete_session(other.session_id)


def test_no_network_not_even_to_the_server_on_loopback(server: RunningServer, session_id: str) -> None:
    port = server.port
    result = bash(
        server,
        session_id,
        f"""
python -c "import socket; socket.create_connection(('127.0.0.1', {port}), 2)" 2>&1 | tail -1
python -c "import socket; socket.socket(socket.AF_INET6)" 2>&1 | tail -1
curl -sS --max-time 2 http://127.0.0.1:{port}/healthz 2>&1 | tail -1
grep -c ':{port:04X} ' /proc/net/tcp || true
""",
    )
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("PermissionError") and lines[1].startswith("PermissionError")
    assert "curl" in lines[2] and "200" not in lines[2]
    assert lines[3] == "0"  # a fresh network namespace: the server's listening socket is not even visible


def test_fork_bomb_is_bounded_and_cleaned_up(server: RunningServer, session_id: str) -> None:
    uid = agent_uid(server, session_id)
    result = bash(server, session_id, "bomb() { bomb | bomb & }; bomb; sleep 3", timeout_ms=20000)
    assert "Resource temporarily unavailable" in result.output
    assert wait_until_gone(uid) == []
    assert bash(server, session_id, "echo still usable").output == "still usable\n"


def test_memory_bomb_fails_inside_the_sandbox(server: RunningServer, session_id: str) -> None:
    result = bash(
        server,
        session_id,
        """
python -c "b = bytearray(8 << 30)" 2>&1 | tail -1
python -c "
chunks = []
while True:
    chunks.append(bytearray(64 << 20))
" 2>&1 | tail -1
""",
    )
    assert result.output.splitlines() == ["MemoryError", "MemoryError"]


def test_disk_fill_stops_at_the_file_size_limit_and_the_quota(server: RunningServer, session_id: str) -> None:
    one_file = bash(
        server, session_id, "dd if=/dev/zero of=big bs=1M count=1024 2>&1 | tail -1; ls -s --block-size=M big"
    )
    assert "File size limit exceeded" in one_file.output or "128M big" in one_file.output
    many = bash(
        server,
        session_id,
        "rm -f big; for i in 1 2 3; do dd if=/dev/zero of=f$i bs=1M count=100 2>&1 "
        "| grep -i 'space'; done; du -sm . | cut -f1",
    )
    assert "No space left on device" in many.output
    assert int(many.output.strip().splitlines()[-1]) <= LIMITS["workspace_quota_mib"]
    write = server.client.tool(session_id, "write", {"file_path": "more.txt", "content": "x" * (2 << 20)})
    assert write.is_error and "quota" in write.output
    bash(server, session_id, "rm -f f1 f2 f3")


def test_infinite_loop_is_killed_by_the_timeout(server: RunningServer, session_id: str) -> None:
    uid = agent_uid(server, session_id)
    result = server.client.tool(session_id, "bash", {"command": "while :; do :; done", "timeout": 1000})
    assert result.timed_out and result.is_error  # type: ignore[attr-defined]
    assert wait_until_gone(uid) == []
    assert server.healthy()


def test_agent_cannot_kill_or_ptrace_the_server(server: RunningServer, session_id: str) -> None:
    pid = server.pid
    result = bash(
        server,
        session_id,
        f"""
kill -9 {pid} 2>&1 | tail -1
kill -9 -1 2>&1 | tail -1
python -c "
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
child = subprocess.Popen(['sleep', '5'])
for target in ({pid}, child.pid):
    print('ptrace', libc.ptrace(16, target, 0, 0), os.strerror(ctypes.get_errno()))
child.kill()
"
cat /proc/{pid}/mem 2>&1 | tail -1
""",
    )
    lines = result.output.strip().splitlines()
    assert lines[0].endswith("Operation not permitted") and lines[1].endswith("Operation not permitted")
    assert lines[2] == "ptrace -1 Operation not permitted" and lines[3] == "ptrace -1 Operation not permitted"
    assert "No such file" in lines[4]  # the server is not in the command's PID namespace
    assert server.proc.poll() is None


def test_server_environment_and_secrets_are_unreadable(server: RunningServer, session_id: str) -> None:
    result = bash(
        server,
        session_id,
        f"""
cat /proc/{server.pid}/environ 2>&1 | tail -1
env | grep -c CUDA_AGENT_TEST_SECRET || true
grep -rl {SECRET} /proc/[0-9]*/environ 2>/dev/null | wc -l
ls -A /root
""",
    )
    lines = result.output.strip().splitlines()
    assert "No such file" in lines[0] and lines[1] == "0" and lines[2] == "0"  # own PID namespace
    assert lines[3:] == [".pyenv"] or lines[3:] == []  # /root is masked; only the interpreter is re-exposed
    assert SECRET not in result.output


def test_no_processes_survive_a_command_or_a_session(server: RunningServer) -> None:
    info = server.client.create_session(TASK)
    sid = info.session_id
    uid = agent_uid(server, sid)
    escape = bash(
        server,
        sid,
        "sleep 1000 & disown; nohup sleep 1000 >/dev/null 2>&1 & (sleep 1000 &) ; "
        "setsid sleep 1000 2>&1 | tail -1",
    )
    assert "Operation not permitted" in escape.output
    assert wait_until_gone(uid) == []
    server.client.tool(sid, "bash", {"command": "sleep 1000 & sleep 1000", "run_in_background": True})
    deadline = time.monotonic() + 15  # the launcher switches to the session uid just before exec
    while len(processes_of(uid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_of(uid)) >= 2
    deleted = server.client.delete_session(sid)
    assert deleted.processes_killed >= 1
    assert wait_until_gone(uid) == []
    assert not Path(info.workspace).exists()
