"""Issue 32's attacks (the sandbox server's third pass), each against three servers started as PID 1 of a
PID namespace of their own, as the image's entrypoint runs in a pod: root mode, restricted mode with user
namespaces, and the restricted fallback without them (a pod whose seccomp profile refuses `unshare`).
docs/sandbox.md, "Issue 32: before and after", has the table: every test here failed on the code before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from sandbox_helpers import TASK, RunningServer, cleanup, needs_root, start_restricted_server, start_server

from cuda_agent.sandbox.client import SyncSandboxClient
from cuda_agent.sandbox.server.isolation import launch_argv, unconfined_spec
from cuda_agent.sandbox.server.models import ToolResult

pytestmark = needs_root()

QUOTA_MIB = 64
MAX_INODES = 30_000
LIMITS = {"workspace_quota_mib": QUOTA_MIB, "workspace_max_inodes": MAX_INODES, "max_sessions": 4}
MODES = ["root", "restricted-userns", "restricted"]


@pytest.fixture(scope="module", params=MODES)
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    running = _start(request.param)
    try:
        yield running
    finally:
        cleanup(running)


def _start(mode: str, *extra: str) -> RunningServer:
    if mode == "root":
        config = Path(tempfile.mkstemp(suffix=".yaml")[1])
        config.write_text(yaml.safe_dump(LIMITS))
        running = start_server("--config", str(config), *extra, pid1=True)
        config.unlink()
    else:
        userns = "on" if mode == "restricted-userns" else "off"
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items() if k != "workspace_quota_mib"]
        running = start_restricted_server("--user-namespaces", userns, *flags, *extra, pid1=True)
    running.mode = mode  # type: ignore[attr-defined]
    return running


def mode(server: RunningServer) -> str:
    return str(server.mode)  # type: ignore[attr-defined]


@contextmanager
def session(server: RunningServer) -> Iterator[str]:
    sid = server.client.create_session(TASK).session_id
    try:
        yield sid
    finally:
        if server.proc.poll() is None:
            server.client.request("DELETE", f"/v1/sessions/{sid}")


def bash(server: RunningServer, sid: str, command: str, timeout_ms: int = 60000) -> ToolResult:
    return server.client.tool(sid, "bash", {"command": command, "timeout": timeout_ms})


def host_tree(top: int) -> dict[int, tuple[int, str, str]]:
    """Every process below `top` on this host: pid -> (parent, state, command line)."""
    table: dict[int, tuple[int, str, str]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(name)] = (int(fields[1]), fields[0], cmdline)
    below: dict[int, tuple[int, str, str]] = {}
    frontier = {top}
    while frontier:
        frontier = {pid for pid, (ppid, _, _) in table.items() if ppid in frontier and pid not in below}
        below.update({pid: table[pid] for pid in frontier})
    return below


def zombies(server: RunningServer) -> list[int]:
    return [pid for pid, (_, state, _) in host_tree(server.proc.pid).items() if state == "Z"]


def server_host_pid(server: RunningServer) -> int:
    """The server process's pid on this host: the deepest `sandbox serve` process (below its init)."""
    tree = host_tree(server.proc.pid)
    serving = {pid for pid, (_, state, cmd) in tree.items() if "sandbox serve" in cmd and state != "Z"}
    below_another = [pid for pid in serving if tree[pid][0] in serving]
    return (below_another or sorted(serving))[0]


def _reset_peak_rss(pid: int) -> None:
    """VmHWM back to the current RSS (proc(5): writing 5 to clear_refs), so a later VmHWM is this
    measurement's peak, not an earlier test's."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def wait_for(predicate: object, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------------------- 1. nothing the judge trusts


def test_agent_writes_nothing_the_judge_trusts(server: RunningServer) -> None:
    """Finding 1: restricted agent commands could write their whole session directory: plant entries in
    the judge's build cache, replace judge-cache/ (or workspace/) with a link to the state directory (the
    judge's Landlock rule then followed it, and candidate code read every session's kernels and tokens).
    Now they write workspace/, tmp/ and shm/ only; the judge's cache lies outside the session directory."""
    with session(server) as sid:
        attempts = {
            "plant in judge-cache": "mkdir -p ../judge-cache/ext && echo x > ../judge-cache/ext/planted",
            "replace judge-cache": "rm -rf ../judge-cache; ln -s .. ../judge-cache",
            "replace workspace": "cd .. && mv workspace w2 && ln -s / workspace",
            "write bin": "echo x > ../bin/planted",
            "replace run": "mv ../run ../run2",
        }
        for what, command in attempts.items():
            result = bash(server, sid, f"{command} && echo DONE")
            assert "DONE" not in result.output, (what, result.output)
        listing = bash(server, sid, "ls -a ..").output.split()
        assert "judge-cache" not in listing and "w2" not in listing and "run2" not in listing, listing
        # Nothing of the session's is a link, and its judge cache is not in its directory.
        session_dir = server.state_dir / "sessions" / sid
        assert not any(p.is_symlink() for p in session_dir.iterdir())
        assert (server.state_dir / "judge-caches" / sid).is_dir()
        assert not list((server.state_dir / "judge-caches" / sid).rglob("planted"))
        # The tools and the judge work as before (a swapped workspace made them answer 500).
        assert not server.client.tool(
            sid, "write", {"file_path": "model_new.py", "content": "# ok\n"}
        ).is_error
        assert not server.client.tool(sid, "read", {"file_path": "model_new.py"}).is_error
        run = server.client.judge(sid, "verify")
        assert run.result is not None, run.error
        assert run.result.correct


def test_landlock_rules_below_the_state_directory_follow_no_link(tmp_path: Path) -> None:
    """The launcher opens the rules for the server's own directories with RESOLVE_NO_SYMLINKS: a rule path
    replaced by a link is refused (exit 126 naming it), never moved onto the link's target."""
    state = tmp_path / "state"
    (state / "secret").mkdir(parents=True)
    (state / "cache").symlink_to(state / "secret")
    rules = {"read": ["/usr", "/lib", "/lib64", "/bin", "/etc"], "write": [str(state / "cache")]}
    argv = ["/bin/sh", "-c", f"echo x > {state}/cache/planted"]
    plain = unconfined_spec(argv, {"PATH": "/usr/bin:/bin"}, "/", landlock=rules)
    guarded = unconfined_spec(
        argv, {"PATH": "/usr/bin:/bin"}, "/", landlock=rules | {"no_symlinks": [str(state / "cache")]}
    )
    followed = subprocess.run(launch_argv(plain), capture_output=True, text=True, timeout=60)
    assert followed.returncode == 0 and (state / "secret" / "planted").exists()  # what a link used to do
    (state / "secret" / "planted").unlink()
    refused = subprocess.run(launch_argv(guarded), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 126 and "symbolic link" in refused.stderr, refused.stderr
    assert not (state / "secret" / "planted").exists()


# ---------------------------------------------------------------------------- 2. a real init


def test_orphans_of_killed_commands_are_reaped(server: RunningServer) -> None:
    """Finding 2: the server as PID 1 reaped nothing it did not start; each command killed at its timeout
    left zombies (root mode: one of the slot's uid per timeout, restricted: two or three per pipeline),
    until no session could fork. The server now runs under its own init (server/init.py), which reaps
    them, and a slot is handed out again only when its uids have no process left, zombies included."""
    with session(server) as sid:
        for _ in range(4):
            result = bash(server, sid, "sleep 30 | cat | cat & sleep 30 | cat", timeout_ms=1000)
            assert result.timed_out
        assert wait_for(lambda: not zombies(server), 15), f"zombies left: {zombies(server)}"
        assert bash(server, sid, "ls / | wc -l").exit_code == 0


# ---------------------------------------------------------------------------- 3. one quota


def test_quota_holds_for_the_file_tools_with_no_command_running(server: RunningServer) -> None:
    """Finding 3: the write tool alone stored 193 MiB against 64 MiB, then 120,138 directories against the
    inode limit, with no command running (the watchdog looked only at sessions running one). Writes are
    now measured like commands, and refused while the session is over its quota (root: tmpfs, ENOSPC)."""
    block = "x" * (15 << 20)
    with session(server) as sid:
        results = [
            server.client.tool(sid, "write", {"file_path": f"big{i}.bin", "content": block}) for i in range(6)
        ]
        assert any(r.is_error and "quota" in r.output for r in results), [r.output[-200:] for r in results]
        assert results[-1].is_error
        held = sum(p.stat().st_blocks * 512 for p in (server.state_dir / "sessions" / sid).rglob("*.bin"))
        assert held <= (QUOTA_MIB + 16) << 20, held >> 20
        # Deleting files through a command makes room again.
        assert bash(server, sid, "rm -f big*.bin").exit_code == 0
        assert not server.client.tool(sid, "write", {"file_path": "small.txt", "content": "ok"}).is_error
    with session(server) as sid:
        deep = "/".join(["d"] * 2000)
        results = [
            server.client.tool(sid, "write", {"file_path": f"t{i}/{deep}/f", "content": "x"})
            for i in range(20)
        ]
        assert results[-1].is_error and ("inode" in results[-1].output or "quota" in results[-1].output)
        listing = subprocess.run(
            ["find", str(server.state_dir / "sessions" / sid)], capture_output=True, check=True
        )
        count = listing.stdout.count(b"\n")
        assert count <= MAX_INODES + 3 * 2001, count


def test_deleting_a_huge_tree_does_not_hold_the_request(server: RunningServer) -> None:
    """Finding 3: deleting a session with a huge tree took minutes (restricted mode: its slot taken until
    then). The tree is now renamed aside at once and removed in the background. Measured against `rm -rf`
    of a tree of the same shape in the same run (root mode's tmpfs vanishes with its unmount anyway)."""
    make = (
        "import os; [open(f'd{i % 200}/{i}', 'w').close() for i in range(24000)"
        " if os.makedirs(f'd{i % 200}', exist_ok=True) is None]"
    )
    baseline = Path(tempfile.mkdtemp(dir=server.state_dir.parent))
    subprocess.run([sys.executable, "-c", make], cwd=baseline, check=True)
    start = time.monotonic()
    shutil.rmtree(baseline)
    rm_s = time.monotonic() - start
    sid = server.client.create_session(TASK).session_id
    assert bash(server, sid, f'python3 -c "{make}" && echo made').output.strip().endswith("made")
    start = time.monotonic()
    status, _ = server.client.request("DELETE", f"/v1/sessions/{sid}")
    delete_s = time.monotonic() - start
    assert status == 200
    assert not (server.state_dir / "sessions" / sid).exists()
    assert delete_s < max(rm_s / 2, 0.5), f"DELETE {delete_s:.2f} s, rm -rf of the same tree {rm_s:.2f} s"
    assert wait_for(lambda: not any((server.state_dir / "trash").iterdir()), 120)


# ---------------------------------------------------------------------------- 4. sparse files


def test_sparse_files_cost_the_snapshot_what_they_hold(server: RunningServer) -> None:
    """Finding 4: the snapshot counted st_size and copied densely, through the server's memory: two
    127 MiB sparse files (1 MiB of quota) made 254 MiB on the state volume per verify and the server's
    RSS grew by as much. Now files are copied hole by hole, one at a time. A first verify without the
    sparse files warms the server's judge path (its first call loads modules and buffers: 74 MiB under CI
    load), and the peak is reset just before the measured one, so the growth is the snapshot's alone."""
    host_pid = server_host_pid(server)
    with session(server) as sid:
        bash(server, sid, "echo 'SLEEP=0' > model_new.py")
        assert server.client.judge(sid, "verify").result is not None
        bash(server, sid, "truncate -s 100M kernels/a.bin kernels/b.bin && echo 'SLEEP=4' > model_new.py")
        _reset_peak_rss(host_pid)
        rss_before = _status_kib(host_pid, "VmRSS")
        peak = [0]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                for job in (server.state_dir / "jobs").glob("*/candidate"):
                    with_blocks = sum(p.stat().st_blocks * 512 for p in job.rglob("*") if p.is_file())
                    peak[0] = max(peak[0], with_blocks)
                time.sleep(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            run = server.client.judge(sid, "verify")
        finally:
            done.set()
            watcher.join()
        assert run.result is not None, run.error
        assert peak[0] < 8 << 20, f"snapshot held {peak[0] >> 20} MiB on disk"
        growth_mib = (_status_kib(host_pid, "VmHWM") - rss_before) >> 10
        assert growth_mib < 64, f"server peak RSS grew by {growth_mib} MiB"


# ---------------------------------------------------------------------------- 5, 6. bounds and sockets


def test_a_queued_tool_call_starts_nothing_once_its_session_is_deleted(server: RunningServer) -> None:
    """Finding 5: a call queued behind the 4-call gate still started its process after DELETE returned."""
    client = SyncSandboxClient(server.url, timeout_s=120)
    sid = server.client.create_session(TASK).session_id
    answers: dict[int, tuple[int, bytes]] = {}

    def call(i: int, command: str) -> None:
        body = json.dumps({"command": command, "timeout": 30000}).encode()
        answers[i] = client.request("POST", f"/v1/sessions/{sid}/tools/bash", body)

    threads = [threading.Thread(target=call, args=(i, "sleep 20")) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    late = threading.Thread(target=call, args=(4, "echo STARTED-AFTER-DELETE"))
    late.start()
    time.sleep(0.5)
    assert server.client.request("DELETE", f"/v1/sessions/{sid}")[0] == 200
    for t in [*threads, late]:
        t.join(60)
    status, body = answers[4]
    assert status == 404, (status, body[:300])


def test_background_jobs_and_todo_lists_are_bounded() -> None:
    """Finding 6 and 5: finished background jobs were kept forever (300 of them: +40 MiB), a background job
    had no time limit, and a todo list of 1,000 x 30,000 characters was kept and echoed back whole."""
    running = _start("restricted", "--background-job-timeout-s", "2", "--session-ttl-s", "8")
    try:
        with session(running) as sid:
            for _ in range(30):
                running.client.tool(sid, "bash", {"command": "true", "run_in_background": True})
            time.sleep(2)
            for _ in range(2):
                running.client.tool(sid, "bash", {"command": "true", "run_in_background": True})
            jobs = running.client.request("GET", f"/v1/sessions/{sid}")[1]
            assert len(json.loads(jobs)["background_jobs"]) <= 16 + 2
            job = running.client.tool(sid, "bash", {"command": "sleep 600", "run_in_background": True})
            bash_id = job.bash_id  # type: ignore[attr-defined]
            assert wait_for(
                lambda: running.client.tool(sid, "bash_output", {"bash_id": bash_id}).status != "running",  # type: ignore[attr-defined]
                20,
            )
            big = [{"content": "x" * 30000, "status": "pending"}] * 10
            assert running.client.tool(sid, "todo_write", {"todos": big}).is_error
            many = [{"content": f"t{i}", "status": "pending"} for i in range(500)]
            assert running.client.tool(sid, "todo_write", {"todos": many}).is_error
            fine = [{"content": f"t{i}", "status": "pending"} for i in range(20)]
            assert not running.client.tool(sid, "todo_write", {"todos": fine}).is_error
    finally:
        cleanup(running)


def test_agent_commands_see_no_other_sessions_sockets(server: RunningServer) -> None:
    """Finding 5: in the restricted fallback /proc/self/net/unix listed every judge socket of the pod
    (every session id) and /proc/net/tcp every connection; netlink's sock_diag lists the same."""
    with session(server) as other, session(server) as sid:
        probe = (
            "cat /proc/self/net/unix /proc/net/unix /proc/thread-self/net/unix /proc/net/tcp 2>&1; "
            "python3 -c 'import socket as s; s.socket(s.AF_NETLINK, s.SOCK_RAW, 4); print(\"netlink-open\")'"
            " 2>&1"
        )
        output = bash(server, sid, probe).output
        assert other not in output, output[:2000]
        assert "judge.sock" not in output, output[:2000]
        if mode(server) == "restricted":
            assert "netlink-open" not in output, output[-500:]


def test_evaluate_refuses_a_path_that_is_a_file_and_a_directory(server: RunningServer) -> None:
    """Finding 7: files `a` and `a/b` answered 500 naming the state directory's job path."""
    body = {"task": {"source": TASK}, "files": {"model_new.py": "x", "a": "1", "a/b": "2"}}
    status, text = server.client.request("POST", "/v1/evaluate", json.dumps(body).encode())
    assert status == 422, (status, text[:300])
    assert str(server.state_dir) not in text.decode()
