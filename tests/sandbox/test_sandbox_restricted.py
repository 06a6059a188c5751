"""Restricted mode: the server runs without root (as in a Pod Security "restricted" pod), so agent code
shares its uid; no_new_privs, the seccomp filter, rlimits and a non-dumpable server must still contain
the escapes that do not need a second uid. The test starts the server under an unprivileged uid through
the server's own launcher (which also hides /root, where this machine's interpreter lives)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import (
    RESTRICTED_SERVER_UID,
    SECRET,
    TASK,
    RunningServer,
    cleanup,
    needs_root,
    start_restricted_server,
)

from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import Isolation

pytestmark = needs_root()


@pytest.fixture(scope="module", params=["auto", "off"], ids=["userns", "no-userns"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """Both restricted variants: with user namespaces (this kernel allows them) and without (what a pod
    whose seccomp profile refuses unshare gets)."""
    running = start_restricted_server("--user-namespaces", request.param)
    try:
        yield running
    finally:
        cleanup(running)


def test_server_reports_restricted_isolation_and_serves_tools(server: RunningServer) -> None:
    assert server.client.status().isolation == "restricted"
    sid = server.client.create_session(TASK).session_id
    result = server.client.tool(sid, "bash", {"command": "id -u; cat model.py | head -1"})
    assert result.output.splitlines() == [str(RESTRICTED_SERVER_UID), "import torch"]
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
    # The server is non-dumpable, or (user namespaces) not even in the command's PID namespace.
    assert "Permission denied" in lines[2] or "No such file" in lines[2]
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
    # Landlock ABI >= 6 scopes signals (and, with user namespaces, the other session's processes are not
    # even in this one's PID namespace): the other session's processes are out of reach too.
    marker = f"sleep 3{os.getpid() % 100:02d}"
    server.client.tool(first.session_id, "bash", {"command": f"exec {marker}", "run_in_background": True})
    pid = wait_for_process(marker)
    killed = server.client.tool(second.session_id, "bash", {"command": f"kill -9 {pid} 2>&1 | tail -1"})
    assert killed.output.strip().endswith(("Operation not permitted", "No such process"))
    assert is_running(pid)
    # Inside the judge (same uid as well) the candidate snapshot cannot be changed.
    server.client.tool(second.session_id, "write", {"file_path": "model_new.py", "content": "x"})
    run = server.client.judge(second.session_id, "verify")
    assert run.result is not None and run.result.model_extra is not None
    assert run.result.model_extra["observed"]["candidate_writable"] is False


def wait_for_process(args: str) -> int:
    """The (host) pid of the process whose command line is `args`, once it runs."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                if Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").strip() == args.encode():
                    return int(name)
            except OSError:
                continue
        time.sleep(0.05)
    raise AssertionError(f"no process {args!r} appeared")


def is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


NAME_A_THREAD = """
import threading
done = threading.Event()
helper = threading.Thread(target=done.wait)
helper.start()
try:
    with open(f"/proc/self/task/{helper.native_id}/comm", "w") as comm:
        comm.write("named")
    print("named", open(f"/proc/self/task/{helper.native_id}/comm").read().strip())
except OSError as error:
    print("refused", error.errno)
done.set()
helper.join()
"""


def test_restricted_judges_may_name_their_threads_as_the_cuda_driver_does(tmp_path: Path) -> None:
    """The CUDA driver names its helper threads through /proc/self/task/<tid>/comm; under restricted
    mode's Landlock that write was refused and cuInit failed (Error 304 on the H200, 2026-12-01), so no
    judge could use the GPU. Judges may now write existing /proc files; agent commands still may not."""
    state = tmp_path / "state"
    scratch = state / "scratch"
    scratch.mkdir(parents=True)
    config = SandboxServerConfig(state_dir=state, isolation="restricted", user_namespaces="off")
    isolation = Isolation(config, "restricted", private_mounts=False)
    slot = isolation.slot(0)
    argv = [sys.executable, "-I", "-c", NAME_A_THREAD]
    env = {"PATH": os.environ["PATH"]}
    judge = isolation.judge_spec(slot, argv, env, str(scratch), [str(scratch)], [])
    agent = isolation.agent_spec(slot, argv, env, str(scratch), [str(scratch)])

    def run(spec: dict[str, object]) -> str:
        launched = subprocess.run(isolation.launch_argv(spec), capture_output=True, text=True, timeout=60)
        return (launched.stdout + launched.stderr).strip()

    assert run(judge) == "named named"
    assert run(agent) == f"refused {errno.EACCES}"
