"""The per-device FIFO ticket lock: order, exclusion, dead holders and waiters (told by the flock on their
ticket files, across uids and PID namespaces), corrupt state, the judge's use of it around verify +
profile, and the server's view of the same state file."""

from __future__ import annotations

import fcntl
import itertools
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandbox_helpers import TASK, cleanup, needs_root, start_restricted_server, start_server, state_root

from cuda_agent.sandbox.gpu_lock import GPU_LOCK_ENV, GpuTicketLock, LockState, device_lock
from cuda_agent.sandbox.judge.config import JudgeConfig
from cuda_agent.sandbox.judge.errors import RunStopped
from cuda_agent.sandbox.judge.orchestrator import Orchestrator
from cuda_agent.sandbox.server.isolation import launch_argv, unconfined_spec
from cuda_agent.sandbox.server.models import EvaluateRequest, JudgeOptions, TaskRef

CANDIDATE = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a.clone()  # no compute for the static screen to refuse; verify runs it and finds it wrong
"""


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll until `condition` holds; the limit only keeps a broken run from hanging the suite."""
    deadline = time.monotonic() + 120
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _log(path: str, **event: Any) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def _judge_run(cache: Path) -> Orchestrator:
    return Orchestrator(JudgeConfig(task=Path("task.py"), candidate=Path("model_new.py"), cache_dir=cache))


def _worker(path: str, name: str, drawn: mp.Queue, go: mp.Event, log: str) -> None:  # type: ignore[type-arg]
    lock = GpuTicketLock(path)
    ticket = lock.draw_ticket()
    drawn.put(ticket)
    go.wait()
    start = time.monotonic()
    while not lock.try_take(ticket, time.monotonic() - start):
        time.sleep(0.002)
    with open(log, "a") as f:
        f.write(json.dumps({"name": name, "ticket": ticket, "start": time.time()}) + "\n")
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write(json.dumps({"name": name, "end": time.time()}) + "\n")
    lock.release(ticket)


def test_waiters_are_served_in_ticket_order_one_at_a_time(tmp_path: Path) -> None:
    path, log = str(tmp_path / "gpu0.lock"), str(tmp_path / "log")
    ctx = mp.get_context("fork")
    drawn, go = ctx.Queue(), ctx.Event()
    procs = []
    for i in range(6):  # each process draws its ticket before the next one starts: arrival order is known
        p = ctx.Process(target=_worker, args=(path, f"w{i}", drawn, go, log))
        p.start()
        assert drawn.get(timeout=30) == i
        procs.append(p)
    go.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    events = [json.loads(line) for line in Path(log).read_text().splitlines()]
    starts = [e for e in events if "start" in e]
    assert [e["name"] for e in starts] == [f"w{i}" for i in range(6)]
    # Exclusion: every holder ended before the next one started (the log alternates start, end).
    assert [("start" in e) for e in events] == [True, False] * 6
    state = GpuTicketLock(path).read()
    assert state.serving == 6 and state.holder is None and state.acquisitions == 6


def _hold_forever(path: str, held: mp.Event) -> None:  # type: ignore[type-arg]
    GpuTicketLock(path).acquire()
    held.set()
    time.sleep(600)


def test_a_killed_holder_does_not_block_the_queue(tmp_path: Path) -> None:
    path = str(tmp_path / "gpu0.lock")
    ctx = mp.get_context("fork")
    held = ctx.Event()
    holder = ctx.Process(target=_hold_forever, args=(path, held))
    holder.start()
    assert held.wait(30)
    lock = GpuTicketLock(path)
    with pytest.raises(TimeoutError):
        lock.acquire(timeout_s=0.2)  # really held
    os.kill(holder.pid or 0, signal.SIGKILL)
    holder.join()
    hold = lock.acquire(timeout_s=30)
    assert hold.wait_s >= 0
    hold.release()
    assert lock.read().holder is None


def test_tickets_of_dead_waiters_are_skipped(tmp_path: Path) -> None:
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    dead = mp.get_context("fork").Process(target=lambda: GpuTicketLock(lock.path).draw_ticket())
    dead.start()
    dead.join()  # a waiter that drew ticket 0 and died before its turn, without giving it back
    assert (lock.owners_dir / "0").exists()
    with lock.acquire(timeout_s=30) as hold:
        assert hold.ticket == 1
    assert lock.read().serving == 2
    assert list(lock.owners_dir.iterdir()) == []  # the dead ticket's file was removed with it


def _acquire_and_report(path: str, name: str, served: mp.Queue) -> None:  # type: ignore[type-arg]
    with GpuTicketLock(path).acquire(timeout_s=120):
        served.put(name)


def test_a_killed_waiter_is_skipped(tmp_path: Path) -> None:
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    ctx = mp.get_context("fork")
    served = ctx.Queue()
    hold = lock.acquire()
    waiters = []
    for name in ("killed", "next"):
        waiters.append(ctx.Process(target=_acquire_and_report, args=(str(lock.path), name, served)))
        waiters[-1].start()
        queued = len(waiters)
        _wait_for(lambda: lock.read().queued == queued, f"{name} queued")  # noqa: B023
    os.kill(waiters[0].pid or 0, signal.SIGKILL)
    waiters[0].join()
    assert lock.read().queued == 1
    hold.release()
    assert served.get(timeout=60) == "next"
    waiters[1].join(timeout=60)
    state = lock.read()
    assert state.holder is None and state.queued == 0 and state.acquisitions == 2


def test_a_ticket_is_alive_to_its_owners_own_process_too(tmp_path: Path) -> None:
    """flock, unlike POSIX record locks (lockf/fcntl), conflicts between two open()s of one process: the
    holder's own reads (another descriptor of its ticket file) must see it alive and never reap it."""
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    with lock.acquire() as hold:
        ticket_file = lock.owners_dir / str(hold.ticket)
        fd = os.open(ticket_file, os.O_RDONLY)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        assert lock.read().holder == hold.ticket
        assert GpuTicketLock(lock.path).read().holder == hold.ticket  # another lock object, same process
    assert not ticket_file.exists() and lock.read().holder is None


def test_a_forked_child_gives_back_only_its_copy_of_the_ticket(tmp_path: Path) -> None:
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    hold = lock.acquire()
    pid = os.fork()
    if pid == 0:
        try:
            hold.release()  # the child's inherited copy: closed, the parent's hold untouched
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert lock.read().holder == hold.ticket
    hold.release()
    assert lock.read().holder is None


def _waiting_waiter(path: str) -> None:
    with GpuTicketLock(path).acquire(timeout_s=120):
        pass


def _overwrite_state(lock: GpuTicketLock, text: str) -> None:
    """Under the state file's flock, as any corruption would land: a waiter polling meanwhile must not
    write its older view over it."""
    with open(lock.path, "r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.truncate()
        f.write(text)


INCONSISTENT = '{"next_ticket": 1, "serving": 5, "owners": []}'


def test_unreadable_or_inconsistent_states_are_refused() -> None:
    for text in (
        "{not json",
        "[]",
        '{"next_ticket": "x"}',
        INCONSISTENT,
        '{"next_ticket": 2, "owners": [0]}',
    ):
        with pytest.raises((ValueError, KeyError, TypeError)):
            LockState.parse(text)


@pytest.mark.parametrize("corrupt", ["{not json", INCONSISTENT, ""], ids=["garbage", "inconsistent", "empty"])
def test_a_corrupt_state_file_is_rebuilt_from_the_live_tickets(tmp_path: Path, corrupt: str) -> None:
    """The queue survives: the holder keeps the GPU to itself (its ticket is served first, so the waiter
    cannot take it) and the waiter gets it once the holder is done."""
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    hold = lock.acquire()
    waiter = mp.get_context("fork").Process(target=_waiting_waiter, args=(str(lock.path),))
    waiter.start()
    _wait_for(lambda: lock.read().queued == 1, "the waiter queued")
    _overwrite_state(lock, corrupt)
    state = lock.read()
    assert state.owners == [hold.ticket, hold.ticket + 1] and state.serving == hold.ticket
    assert state.next_ticket == hold.ticket + 2
    hold.release()
    waiter.join(timeout=60)
    assert waiter.exitcode == 0
    state = lock.read()  # acquisitions: only the waiter's, counted in the rebuilt state
    assert state.holder is None and state.queued == 0 and state.acquisitions == 1
    _overwrite_state(lock, corrupt)  # nobody left: a fresh queue
    with lock.acquire(timeout_s=30):
        assert lock.read().holder is not None


TAKE_THE_LOCK = """
import os, sys, time
from cuda_agent.sandbox.gpu_lock import GpuTicketLock
try:
    hold = GpuTicketLock(sys.argv[1]).acquire(timeout_s=float(sys.argv[2]))
except TimeoutError:
    print("timeout", flush=True)
    raise SystemExit(0)
print(os.getpid(), hold.ticket, flush=True)
if sys.argv[3] == "hold":
    time.sleep(600)
"""


@needs_root()
def test_judges_of_other_uids_in_pid_namespaces_of_their_own_share_the_lock() -> None:
    """As root mode's judges run: each in its own PID namespace (so both are pid 1 there), under its own
    uid with umask 077, sharing only the judges' group, with the lock the server created. The second
    waits while the first holds, and is served once the first is killed."""
    group, uids = 60980, (60981, 60982)
    root = state_root("gpulock-")
    gpu_dir = root / "gpu"
    gpu_dir.mkdir()
    os.chown(gpu_dir, 0, group)
    os.chmod(gpu_dir, 0o770)
    lock = GpuTicketLock(gpu_dir / "gpu0.lock")
    lock.create(group)

    # The interpreter may live below /root (0700): covered, with the interpreter bound back in, as the
    # server's masks do (isolation._expose_paths).
    expose = sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))})
    masks = [{"path": "/root", "expose": expose}]

    def judge(uid: int, timeout_s: float, then: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-c", TAKE_THE_LOCK, str(lock.path), str(timeout_s), then]
        env = {"PATH": os.environ["PATH"], "HOME": str(root)}
        spec = unconfined_spec(argv, env, str(root), uid=uid, gid=uid, groups=[group], umask=0o077)
        spec |= {"new_pidns": True, "new_mountns": True, "masks": masks}
        return subprocess.Popen(launch_argv(spec), stdout=subprocess.PIPE, text=True, start_new_session=True)

    holder = judge(uids[0], 30, "hold")
    try:
        assert holder.stdout is not None and holder.stdout.readline().split() == ["1", "0"]
        out, _ = judge(uids[1], 0.3, "exit").communicate(timeout=60)
        assert out.split() == ["timeout"]  # the holder is alive to another uid in another namespace
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        out, _ = judge(uids[1], 30, "exit").communicate(timeout=60)
        assert out.split() == ["1", "2"]
        state = lock.read()
        assert state.holder is None and state.queued == 0 and state.acquisitions == 2
        assert list(lock.owners_dir.iterdir()) == []
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
        shutil.rmtree(root)


def test_the_device_lock_is_the_servers_state_file_or_one_per_physical_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GPU_LOCK_ENV, str(tmp_path / "gpu3.lock"))
    assert device_lock("cuda:0", tmp_path).path == tmp_path / "gpu3.lock"
    monkeypatch.delenv(GPU_LOCK_ENV)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # this process's cuda:1 is the host's GPU 3
    assert device_lock("cuda:1", tmp_path).path == tmp_path / "device-cuda-3.lock"
    assert device_lock("cpu", tmp_path).path == tmp_path / "device-cpu.lock"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert device_lock("cuda:1", tmp_path).path == tmp_path / "device-cuda-1.lock"


def _judge_holder(cache: str, name: str, log: str, release: Any) -> None:
    run = _judge_run(Path(cache))
    with run.device_lock("verify"):
        _log(log, name=name, event="start", at=time.monotonic(), wait=run.result.lock_wait_s)
        if release is not None:
            release.wait(120)
        _log(log, name=name, event="end", at=time.monotonic())


def test_judges_hold_the_device_lock_in_arrival_order_and_report_their_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three judges on one device (the default lock under their shared cache): the first holds it until
    both others are queued; they then run one at a time in ticket order, and each one's lock_wait_s
    covers at least the time from its queueing (seen here) to the end of the hold before it."""
    monkeypatch.delenv(GPU_LOCK_ENV, raising=False)
    cache, log = tmp_path / "cache", str(tmp_path / "log")
    lock = GpuTicketLock(cache / "locks" / "device-cpu.lock")
    ctx = mp.get_context("fork")
    release = ctx.Event()
    procs = [ctx.Process(target=_judge_holder, args=(str(cache), "first", log, release))]
    procs[0].start()
    _wait_for(lambda: lock.path.exists() and lock.read().holder is not None, "first judge holds the lock")
    queued_at = {}
    for name in ("second", "third"):
        procs.append(ctx.Process(target=_judge_holder, args=(str(cache), name, log, None)))
        procs[-1].start()
        waiting = len(procs) - 1
        _wait_for(lambda: lock.read().queued == waiting, f"{name} judge queued")  # noqa: B023
        queued_at[name] = time.monotonic()
    release.set()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    events = [json.loads(line) for line in Path(log).read_text().splitlines()]
    names = ("first", "second", "third")
    assert [(e["name"], e["event"]) for e in events] == [(n, ev) for n in names for ev in ("start", "end")]
    at = {(e["name"], e["event"]): e for e in events}
    assert at["second", "start"]["wait"] >= at["first", "end"]["at"] - queued_at["second"] > 0
    assert at["third", "start"]["wait"] >= at["second", "end"]["at"] - queued_at["third"] > 0
    state = lock.read()
    assert state.acquisitions == 3 and state.holder is None and state.queued == 0


def test_a_judge_without_the_device_lock_by_its_deadline_stops_naming_the_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GPU_LOCK_ENV, str(tmp_path / "gpu0.lock"))
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    with lock.acquire():
        run = _judge_run(tmp_path / "cache")
        run.deadline = time.monotonic()  # the run's total time is spent
        with pytest.raises(RunStopped), run.device_lock("verify"):
            pytest.fail("entered the locked block without the lock")
    assert run.result.error is not None and run.result.error.startswith("timeout after ")
    assert run.result.error.endswith("waiting for the device lock (cpu) in verify")
    assert run.result.reward == -1
    state = lock.read()  # the judge's ticket was given back: nothing waits, nothing is held
    assert state.queued == 0 and state.holder is None and state.acquisitions == 1


def test_the_judge_cli_waits_for_the_servers_device_lock_and_reports_the_wait(tmp_path: Path) -> None:
    """The real judge CLI (python -m cuda_agent.sandbox.judge.cli) with CUDA_AGENT_GPU_LOCK, as the server
    runs it. The candidate is plain PyTorch, so nothing is built; its verdict (wrong outputs, no custom
    kernel) does not matter here, only that verify ran under the lock and lock_wait_s reports the wait."""
    (tmp_path / "task.py").write_text(TASK)
    (tmp_path / "model_new.py").write_text(CANDIDATE)
    lock = GpuTicketLock(tmp_path / "gpu0.lock")
    hold = lock.acquire()
    command = [sys.executable, "-m", "cuda_agent.sandbox.judge.cli", str(tmp_path / "task.py")]
    command += [str(tmp_path / "model_new.py"), "--device", "cpu", "--json", "--trials", "1"]
    command += ["--compile-mode", "none", "--profile-trials", "3", "--cache-dir", str(tmp_path / "cache")]
    env = {**os.environ, GPU_LOCK_ENV: str(lock.path)}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for(lambda: lock.read().queued == 1 or proc.poll() is not None, "the judge queued")
        queued_at = time.monotonic()
        hold.release()
        released_at = time.monotonic()
        out, err = proc.communicate(timeout=600)
    finally:
        hold.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report = json.loads(out)
    assert report["correct"] is False and report["error"].startswith("wrong result"), report  # verify ran
    assert report["lock_wait_s"] >= released_at - queued_at > 0, report
    assert report["build_lock_wait_s"] == 0.0  # nothing to build, so no build-cache lock
    state = lock.read()
    assert state.acquisitions == 2 and state.holder is None and state.queued == 0


@needs_root()
def test_concurrent_gpu_judging_never_overlaps_and_reports_lock_wait() -> None:
    """Three evaluations on one (pretend) GPU with three judge slots: builds may overlap, GPU phases not.
    The (fake) judge takes the lock itself through CUDA_AGENT_GPU_LOCK, as the real one does."""
    config = Path(tempfile.mkstemp(suffix=".yaml")[1])
    config.write_text(yaml.safe_dump({"gpus": 1, "max_concurrent_judges": 3}))
    running = start_server("--config", str(config))
    try:
        request = EvaluateRequest(
            task=TaskRef(source=TASK), model_new="HOLD_GPU=0.4", device="cuda", judge=JudgeOptions(trials=1)
        )
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda _: running.client.evaluate(request), range(3)))
        assert all(r.reward == 3 for r in results)
        spans = sorted(tuple(r.model_extra["held"]) for r in results)  # type: ignore[index]
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        waits = sorted(r.lock_wait_s or 0.0 for r in results)
        assert waits[-1] > 0.3  # the last one waited for the two before it
        status = running.client.status()
        assert status.gpus[0].lock_queue == 0 and not status.gpus[0].lock_held
        assert status.gpus[0].busy_fraction > 0 and status.gpus[0].lock_wait_total_s > 0
        metrics = running.client.request("GET", "/metrics")[1].decode()
        assert 'cuda_agent_sandbox_gpu_busy_ratio{gpu="0"}' in metrics
        assert "cuda_agent_sandbox_gpu_lock_wait_seconds_count 3" in metrics
    finally:
        cleanup(running)
        config.unlink()


@needs_root()
def test_restricted_judges_take_the_gpu_lock_from_their_own_pid_namespace() -> None:
    """Restricted mode with user namespaces: the judge reaches the server's lock files through its Landlock
    rules (before the lock's owners directory, restricted GPU judges were given no Landlock rule for the
    state file at all) while it is the init of a PID namespace that shows it no other process."""
    running = start_restricted_server("--user-namespaces", "on", "--gpus", "1")
    try:
        request = EvaluateRequest(
            task=TaskRef(source=TASK), model_new="HOLD_GPU=0.1", device="cuda", judge=JudgeOptions(trials=1)
        )
        result = running.client.evaluate(request)
        assert result.reward == 3 and result.model_extra is not None, result
        assert result.model_extra["held"]  # the fake judge held the GPU's lock
        observed = result.model_extra["observed"]
        assert observed["pid"] == 1 and observed["visible_pids"] == [1], observed
        status = running.client.status()
        assert status.gpus[0].lock_queue == 0 and not status.gpus[0].lock_held
        state = GpuTicketLock(running.state_dir / "gpu" / "gpu0.lock").read()
        assert state.acquisitions == 1 and state.owners == []
    finally:
        cleanup(running)
