"""Issue 13's isolation and lifecycle attacks, in root mode and in restricted mode (with and without user
namespaces): sessions must not see each other (processes, /tmp, /dev/shm, SysV IPC, sockets), quotas must
keep working whatever a session builds, and a deleted session must not harm the next one on its slot.
While each attack runs, another session keeps calling a tool and must be answered within a generous
bound (behaviour on a loaded 2-core machine, not a benchmark). docs/sandbox.md has the before/after table.
"""

from __future__ import annotations

import os
import socket
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
from cuda_agent.sandbox.server.models import ToolResult

pytestmark = needs_root()

QUOTA_MIB = 64
MAX_INODES = 5_000
# Three sessions at most: the probe, the attacker and one more, so a session created after one is
# deleted gets the deleted one's slot (its uids).
LIMITS = {"workspace_quota_mib": QUOTA_MIB, "workspace_max_inodes": MAX_INODES, "max_sessions": 3}
SERVED_WITHIN_S = 20.0
SHMGET = "import ctypes; print('shm', ctypes.CDLL(None).shmget(0x5EED, {size}, {flags}))"
DEEP_DIRECTORY = "import os; [(os.mkdir('d'), os.chdir('d')) for _ in range(1100)]; print(len(os.getcwd()))"
MANY_FILES = f"for i in range({MAX_INODES + 1000}): open(f'e{{i}}', 'w').close()"
SCRATCH_PLACES = ("/tmp", "/var/tmp", "/dev/shm")


@pytest.fixture(scope="module", params=["root", "restricted-userns", "restricted"])
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    if request.param == "root":
        config = Path(tempfile.mkstemp(suffix=".yaml")[1])
        config.write_text(yaml.safe_dump(LIMITS))
        running = start_server("--config", str(config), "--max-sessions", str(LIMITS["max_sessions"]))
        config.unlink()
    else:
        userns = "on" if request.param == "restricted-userns" else "off"
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in LIMITS.items() if k != "workspace_quota_mib"]
        running = start_restricted_server("--user-namespaces", userns, *flags)
    running.mode = request.param  # type: ignore[attr-defined]
    try:
        yield running
    finally:
        cleanup(running)


def mode(server: RunningServer) -> str:
    return str(server.mode)  # type: ignore[attr-defined]


def namespaces(server: RunningServer) -> bool:
    return mode(server) != "restricted"


def scratch_left_shared(server: RunningServer) -> list[str]:
    """Scratch places restricted mode with user namespaces leaves shared (Landlock then refuses writes
    there): those below which the interpreter or the code lives, as in a checkout cloned under /tmp. A bind
    of the session's tmp/ over such a place would have to re-expose that path (server/isolation.py)."""
    if mode(server) != "restricted-userns":
        return []
    needed = {os.path.realpath(p) for p in (sys.prefix, sys.executable, Path(__file__).resolve())}
    return [d for d in SCRATCH_PLACES if any(p.startswith(d + "/") for p in needed)]


@contextmanager
def session(server: RunningServer) -> Iterator[str]:
    sid = server.client.create_session(TASK).session_id
    try:
        yield sid
    finally:
        if server.proc.poll() is None:
            server.client.request("DELETE", f"/v1/sessions/{sid}")


@contextmanager
def served_meanwhile(server: RunningServer) -> Iterator[None]:
    """Another session calls `read` over and over while the block runs; every call must be answered,
    none later than SERVED_WITHIN_S."""
    client = SyncSandboxClient(server.url, timeout_s=120)
    stop = threading.Event()
    latencies: list[float] = []
    errors: list[str] = []

    def probe(sid: str) -> None:
        while not stop.is_set():
            start = time.monotonic()
            try:
                result = client.tool(sid, "read", {"file_path": "model.py"})
                if result.is_error:
                    errors.append(result.output)
            except Exception as exc:
                errors.append(repr(exc))
            latencies.append(time.monotonic() - start)
            stop.wait(0.2)

    with session(server) as sid:
        thread = threading.Thread(target=probe, args=(sid,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=SERVED_WITHIN_S * 2)
    assert not errors, errors[:3]
    assert latencies and max(latencies) < SERVED_WITHIN_S, f"slowest call {max(latencies):.1f} s"


def bash(server: RunningServer, sid: str, command: str, timeout_ms: int = 60000) -> ToolResult:
    return server.client.tool(sid, "bash", {"command": command, "timeout": timeout_ms})


def background(server: RunningServer, sid: str, command: str) -> str:
    job = server.client.tool(sid, "bash", {"command": command, "run_in_background": True})
    return str(job.bash_id)  # type: ignore[attr-defined]


def wait_for(predicate: object, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def host_pids_running(needle: str) -> list[int]:
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if needle.encode() in Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" "):
                pids.append(int(name))
        except OSError:
            continue
    return pids


# ---------------------------------------------------------------------------- sessions see each other


def test_other_sessions_and_the_host_are_invisible(server: RunningServer) -> None:
    marker = f"sleep 4{os.getpid() % 100:02d}"
    with served_meanwhile(server), session(server) as first, session(server) as second:
        background(server, first, f"exec {marker}")
        assert wait_for(lambda: host_pids_running(marker))
        spy = bash(
            server,
            second,
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; "
            f"cd /proc/{server.pid} && cat cmdline environ 2>&1 | tail -2; "
            f"cd /proc/{host_pids_running(marker)[0]} && cat cmdline environ 2>&1 | tail -2",
        )
    assert marker not in spy.output and "sandbox serve" not in spy.output and "CUDA_AGENT" not in spy.output
    if namespaces(server):
        # A PID namespace per command: only the spy's own processes exist for it.
        assert spy.output.count("No such file") == 2
    else:
        # No PID namespace: Landlock leaves the command no /proc/<pid> but its own (hidepid for one).
        assert spy.output.count("Permission denied") == 4, spy.output


TOOLCHAIN = (
    "echo quiet > /dev/null && echo null-ok; cat <(echo procsub-ok); read -r first _ < /proc/self/status; "
    'echo self-$first; python3 -c \'import subprocess; print(subprocess.run(["echo", "child-ok"], '
    "capture_output=True, text=True).stdout.strip())'; "
    "printf 'int main(void){return 0;}' > a.c && cc a.c -o a && ./a && echo cc-ok"
)


def test_commands_and_compilers_work_with_other_processes_hidden(server: RunningServer) -> None:
    """What agents use must keep working where Landlock hides /proc/<pid> (restricted, no namespaces):
    /dev/null, process substitution, the command's own /proc/self, subprocesses, a C compiler."""
    with session(server) as sid:
        out = bash(server, sid, TOOLCHAIN).output.split()
    assert out == ["null-ok", "procsub-ok", "self-Name:", "child-ok", "cc-ok"]


def test_scratch_space_is_private_and_dies_with_the_session(server: RunningServer) -> None:
    with served_meanwhile(server), session(server) as other:
        with session(server) as first:
            uid = bash(server, first, "id -u").output.strip()
            planted = bash(
                server,
                first,
                "for d in /tmp /var/tmp /dev/shm; do echo left > $d/planted-$$ 2>&1 && echo wrote $d; done; "
                f"python3 -c {SHMGET.format(size=4096, flags=0o1666)!r}",
            )
            if not namespaces(server):
                # Landlock: no writes outside the session's own directories, /dev/shm included.
                assert "wrote" not in planted.output and planted.output.count("Permission denied") == 3
                assert "shm -1" in planted.output  # SysV IPC refused by the agent filter
                return
            shared = scratch_left_shared(server)
            private = [d for d in SCRATCH_PLACES if d not in shared]
            assert planted.output.count("wrote") == len(private) and "shm -1" not in planted.output
            assert planted.output.count("Permission denied") == len(shared)
            again = bash(server, first, f"cat {' '.join(f'{d}/planted-*' for d in private)} | sort -u")
            assert again.output.strip() == "left"  # the session keeps its own /tmp between commands
            seen = bash(
                server,
                other,
                f"ls -A /tmp /var/tmp /dev/shm; python3 -c {SHMGET.format(size=0, flags=0)!r}",
            )
            assert "planted" not in seen.output and "shm -1" in seen.output
            workspace = Path(server.client.get_session(first).workspace)
        # Deleted: nothing of it is left on the host, and a session on its slot starts empty.
        assert not workspace.parent.exists()
        host_scratch = [Path(d) for d in ("/tmp", "/var/tmp", "/dev/shm")]
        assert not [p for d in host_scratch for p in d.iterdir() if p.name.startswith("planted-")]
        if mode(server) == "root":
            assert not [p for d in host_scratch for p in d.iterdir() if str(p.stat().st_uid) == uid]
        with session(server) as successor:
            fresh = bash(server, successor, "id -u; ls -A /tmp /dev/shm | grep -c planted")
            assert fresh.output.split()[-1] == "0"
            if mode(server) == "root":
                assert fresh.output.split()[0] == uid  # the same slot, emptied


def _judge_plants() -> set[Path]:
    return {p for d in ("/dev/shm", "/tmp") for p in Path(d).glob("judge-planted-*")}


def test_judges_scratch_is_their_own(server: RunningServer) -> None:
    """Candidate code in one session's judge plants files in /dev/shm and /tmp (the fake judge's probe);
    the next session's judge finds none of them, and none reaches the host (root mode; restricted mode with
    user namespaces), and it sees no process but itself: the init of its own PID namespace. Restricted
    mode without them: nothing planted (no write to /tmp or /dev/shm, no SysV IPC); every process listed."""
    before = _judge_plants()
    observed = []
    try:
        with session(server) as first, session(server) as second:
            for sid in (first, second):
                server.client.tool(sid, "write", {"file_path": "model_new.py", "content": "x"})
                run = server.client.judge(sid, "verify")
                assert run.result is not None and run.result.model_extra is not None
                observed.append(run.result.model_extra["observed"])
        left_on_host = _judge_plants() - before
        if namespaces(server):
            assert "/dev/shm" in observed[0]["scratch_planted"]  # its own /dev/shm, writable
            assert observed[1]["scratch_left_by_others"] == [] and not left_on_host
            assert all(o["pid"] == 1 and o["visible_pids"] == [1] for o in observed), observed
            assert all(o["sysv_shm"] for o in observed)  # in an IPC namespace of its own
        else:
            # Landlock: /tmp and /dev/shm read-only; the filter refuses SysV IPC. The judge's own code
            # still lists every process (its workers hide them from candidate code: docs/sandbox.md).
            assert observed[0]["scratch_planted"] == [] and not left_on_host
            assert not any(o["sysv_shm"] for o in observed)
            assert len(observed[0]["visible_pids"]) > 1
    finally:
        for path in _judge_plants() - before:
            path.unlink(missing_ok=True)


def test_judge_channel_and_host_sockets_are_out_of_reach(server: RunningServer) -> None:
    """Another session's judge socket (Landlock does not cover connect) and the host's sockets in /run."""
    host_socket = Path(f"/run/cuda-agent-test-{os.getpid()}.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(host_socket))
    os.chmod(host_socket, 0o666)
    listener.listen()
    try:
        with served_meanwhile(server), session(server) as victim, session(server) as attacker:
            victim_socket = Path(server.client.get_session(victim).workspace).parent / "run" / "judge.sock"
            server.client.tool(attacker, "write", {"file_path": "model_new.py", "content": "x"})
            result = bash(
                server,
                attacker,
                f"CUDA_AGENT_JUDGE_SOCKET={victim_socket} verify 2>&1 | tail -1; "
                f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{host_socket}')\" "
                "2>&1 | tail -1",
            )
            lines = result.output.strip().splitlines()
            assert "Permission denied" in lines[0] or "judge token" in lines[0], lines
            assert server.client.get_session(victim).judge_runs == 0
            if namespaces(server):
                assert "FileNotFoundError" in lines[1]  # /run is empty for agent commands
            else:
                # Residual (docs/sandbox.md): Landlock cannot refuse connect() to a pathname socket; in a
                # pod only the pod's own sockets exist.
                assert lines[1:] == []  # it connected
    finally:
        listener.close()
        host_socket.unlink()


# ---------------------------------------------------------------------------- quotas


def test_deep_and_unreadable_directories_cannot_stop_the_quota_watchdog(server: RunningServer) -> None:
    """A 1,100-level directory used to make the watchdog raise RecursionError and stop enforcing for
    everyone; a chmod 000 directory hid what it held. Both sessions still get their quota enforced."""
    with served_meanwhile(server), session(server) as deep, session(server) as other:
        made = bash(
            server,
            deep,
            f"python3 -c {DEEP_DIRECTORY!r}",
        )
        assert int(made.output.strip()) > 2200 and not made.is_error
        # The file tools walk the same tree (glob and grep used the recursive os.fwalk).
        assert not server.client.tool(deep, "glob", {"pattern": "**/*.py"}).is_error
        assert not server.client.tool(deep, "grep", {"pattern": "relu"}).is_error
        # Overfill from a background job in one session and a foreground command in the other: the
        # watchdog must stop both while they run (root: the session's tmpfs refuses the bytes itself).
        fill = f"sleep 1; head -c {QUOTA_MIB + 16}M /dev/zero > $TMPDIR/fill && exec sleep 600"
        job = background(server, deep, fill)
        foreground = bash(server, other, fill, timeout_ms=120_000)
        if mode(server) == "root":
            assert "No space left" in foreground.output
            assert wait_for(lambda: "No space left" in output_of(server, deep, job))
        else:
            assert not foreground.timed_out and "workspace quota exceeded" in foreground.output
            assert wait_for(lambda: job_status(server, deep, job) != "running"), "no watchdog"
        if mode(server) != "root":
            hidden = bash(server, other, "rm -f $TMPDIR/fill; mkdir -p locked; chmod 000 locked; echo ok")
            assert hidden.is_error and "could not be measured" in hidden.output
            assert "ok" in bash(server, other, "chmod 700 locked; echo ok").output


def test_empty_files_count_against_the_inode_limit(server: RunningServer) -> None:
    """300,000 empty files cost ~300 MiB of kernel memory while the byte quota counted 3 MB; now every
    file and directory counts, and the walk stops at the limit however many there are."""
    with served_meanwhile(server), session(server) as sid:
        result = bash(
            server,
            sid,
            f"cd $TMPDIR && python3 -c {MANY_FILES!r}",
        )
        if mode(server) == "root":
            assert "No space left on device" in result.output  # the tmpfs's nr_inodes
        else:
            assert result.is_error and "inode limit exceeded" in result.output
        # While the session is still over its limit, the periodic check (every few seconds for a session
        # with a command running) may kill the cleanup itself; each try still deletes files, so repeat.
        for _ in range(5):
            bash(server, sid, "find $TMPDIR -name 'e*' -delete")
            if bash(server, sid, "echo fine").output == "fine\n":
                break
        assert bash(server, sid, "echo fine").output == "fine\n"


# ---------------------------------------------------------------------------- lifecycle


def test_deleting_a_session_stops_its_judge_and_spares_the_next_on_its_slot(server: RunningServer) -> None:
    """The trainer's judge request (HTTP) for a session deleted meanwhile used to run on, and its cleanup
    (kill every process of the slot's judge uid) then killed the next session's judge on that slot."""
    with served_meanwhile(server), session(server):  # with the probe: one slot left, for `first`
        with session(server) as first:
            uid = bash(server, first, "id -u").output.strip()
            server.client.tool(first, "write", {"file_path": "model_new.py", "content": "# SLEEP=60\n"})
            outcome: list[object] = []
            judging = threading.Thread(target=lambda: outcome.append(judge_quietly(server, first)))
            judging.start()
            job_dir = str(server.state_dir / "jobs")
            assert wait_for(lambda: host_pids_running(job_dir))
        judging.join(timeout=30)
        assert not judging.is_alive() and outcome
        assert wait_for(lambda: not host_pids_running(job_dir), timeout_s=15), (
            "the judge outlived its session"
        )
        with session(server) as successor:
            if mode(server) == "root":
                assert bash(server, successor, "id -u").output.strip() == uid  # the same slot
            server.client.tool(successor, "write", {"file_path": "model_new.py", "content": "# SLEEP=2\n"})
            run = server.client.judge(successor, "verify")
            assert run.result is not None and run.result.correct, run.text


def test_a_running_command_dies_with_its_session(server: RunningServer) -> None:
    """A foreground command running when its session is deleted (restricted mode has no session uid to
    kill by; it ran on until its timeout with its workspace gone)."""
    marker = f"sleep 5{os.getpid() % 100:02d}"
    with served_meanwhile(server):
        with session(server) as sid:
            calls: list[object] = []
            running = threading.Thread(
                target=lambda: calls.append(quietly(bash, server, sid, f"exec {marker}"))
            )
            running.start()
            assert wait_for(lambda: host_pids_running(marker))
        assert wait_for(lambda: not host_pids_running(marker), timeout_s=15), "the command outlived it"
        running.join(timeout=30)
        assert not running.is_alive() and calls


def quietly(call: object, *args: object) -> object:
    try:
        return call(*args)  # type: ignore[operator]
    except Exception as exc:  # deleted meanwhile: an error answer is fine, a hang is not
        return exc


def judge_quietly(server: RunningServer, sid: str) -> object:
    try:
        return server.client.judge(sid, "verify")
    except Exception as exc:  # deleted while judging: an error answer is fine, a hang is not
        return exc


def job_status(server: RunningServer, sid: str, bash_id: str) -> str:
    out = server.client.tool(sid, "bash_output", {"bash_id": bash_id})
    return str(out.status)  # type: ignore[attr-defined]


def output_of(server: RunningServer, sid: str, bash_id: str) -> str:
    return server.client.tool(sid, "bash_output", {"bash_id": bash_id}).output
