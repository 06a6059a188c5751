"""The judge zygote on its own: a real zygote process, started with the server's environment by a uid
without a passwd entry, forks real judges (the judge CLI on CPU) under a launcher spec without a user
switch (the root-mode path runs in test_real_judge.py through the server).

It must give the same verdict an exec'd judge gives, report each judge's exit code (including a kill and
a failed confinement step) and keep serving after a judge dies."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.sandbox.judge.config import default_cache_dir
from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import Isolation, unconfined_spec
from cuda_agent.sandbox.server.judge_runner import JudgeService
from cuda_agent.sandbox.server.judge_zygote import JudgeZygote, ZygoteError
from cuda_agent.sandbox.server.metrics import Metrics

EXAMPLES = Path(__file__).parents[2] / "examples"
TASK = EXAMPLES / "tasks" / "relu_mul_add.py"
SOLUTION = EXAMPLES / "solutions" / "relu_mul_add" / "cpu"
QUICK = ["--device", "cpu", "--json", "--trials", "2", "--profile-trials", "5", "--compile-mode", "none"]


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


# A uid with no passwd entry, as a pod's arbitrary runAsUser has (OpenShift's, or any image without one).
UNLISTED_UID = 12345


@pytest.fixture(scope="module")
def zygote(
    loop: asyncio.AbstractEventLoop, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JudgeZygote]:
    """Started as the server starts it (JudgeService.zygote_env) by a uid without a passwd entry: a user
    namespace maps this process's uid to UNLISTED_UID. Without the judge user in that environment the
    zygote's preload raised KeyError (getpwuid) and every judge was exec'd, ~10x slower on an H200."""
    with pytest.raises(KeyError):
        pwd.getpwuid(UNLISTED_UID)
    state = tmp_path_factory.mktemp("state")
    config = SandboxServerConfig(state_dir=state, isolation="restricted", user_namespaces="off")
    service = JudgeService(config, Isolation(config, "restricted", private_mounts=False), Metrics(), 0)
    service.zygote_dir.mkdir(parents=True)
    python = state / "python-as-unlisted-uid"
    python.write_text(
        f"#!/bin/sh\nexec unshare --user --map-user={UNLISTED_UID} --map-group={UNLISTED_UID} "
        f'{sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    log = str(service.zygote_dir / "zygote.log")
    started = loop.run_until_complete(JudgeZygote.start(str(python), service.zygote_env(), log))
    yield started
    loop.run_until_complete(started.close())


def _spec(job: Path, **changes: Any) -> dict[str, Any]:
    """What Isolation builds for a judge in restricted mode, minus Landlock and seccomp (tested elsewhere)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(job),
        "TMPDIR": str(job),
        "CUDA_AGENT_JUDGE_CACHE": str(default_cache_dir()),  # shared with test_solutions: builds hit
    }
    return unconfined_spec([], env, str(job), rlimits={"RLIMIT_CORE": [0, 0]}) | changes


def _descendants(pid: int) -> list[int]:
    """`pid` and every live process below it, from the host's /proc."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _judge(
    loop: asyncio.AbstractEventLoop,
    zygote: JudgeZygote,
    argv: list[str],
    kill_after: float | None = None,
    started: list[int] | None = None,
    **spec: Any,
) -> tuple[int | None, str, str]:
    """`started`: filled with the judge's processes just before the kill."""
    job = Path(tempfile.mkdtemp(prefix="zygote-job-"))

    async def run() -> int | None:
        judge = await zygote.spawn(argv, _spec(job, **spec), str(job / "out"), str(job / "err"))
        assert judge.pid != zygote.proc.pid
        if kill_after is not None:
            await asyncio.sleep(kill_after)
            if started is not None:
                started.extend(_descendants(judge.pid))
            os.killpg(judge.pid, signal.SIGKILL)
        await asyncio.wait_for(judge.exited.wait(), 600)
        return judge.returncode

    try:
        code = loop.run_until_complete(run())
        return code, (job / "out").read_text(), (job / "err").read_text()
    finally:
        shutil.rmtree(job, ignore_errors=True)


def test_forked_judge_gives_the_verdict(loop: asyncio.AbstractEventLoop, zygote: JudgeZygote) -> None:
    """Two judges forked from one zygote judge the same way; the second is confined as a user-namespaced
    pool's judges are (restricted mode with user namespaces, Isolation.judge_spec): it enters a user
    namespace after the zygote's preload (unshare(CLONE_NEWUSER) needs a single-threaded caller: a forked
    child is one) and judges there, loopback only, with its own /dev/shm, as the init of its own PID
    namespace (one more fork, the launcher's) with its own /proc."""
    assert zygote.hello["ready"] and zygote.hello["level"] == "full"
    assert "torch._inductor.compile_fx" in zygote.hello["loaded"]  # judges and workers inherit inductor
    shm = {"path": "/dev/shm", "expose": [], "size_kib": 1 << 20, "mode": "1777"}
    names = ("new_userns", "new_mountns", "new_ipcns", "new_netns", "new_pidns")
    namespaced = dict.fromkeys(names, True)
    for confinement in ({}, {"masks": [shm], **namespaced}):
        code, out, err = _judge(loop, zygote, [str(TASK), str(SOLUTION), *QUICK], **confinement)
        assert code == 0, err
        result = json.loads(out)
        assert result["reward"] >= 1 and result["correct"] and result["error"] is None
        assert str(result["isolation"]["landlock"]).startswith("on")  # the worker still confines itself


def test_usage_error_exit_code_and_message(loop: asyncio.AbstractEventLoop, zygote: JudgeZygote) -> None:
    code, out, err = _judge(loop, zygote, ["/nonexistent/task.py", str(SOLUTION), *QUICK])
    assert code == 2 and out == ""
    assert "TASK /nonexistent/task.py does not exist" in err


def test_failed_confinement_step_is_reported(loop: asyncio.AbstractEventLoop, zygote: JudgeZygote) -> None:
    code, _, err = _judge(loop, zygote, [str(TASK), str(SOLUTION), *QUICK], cwd="/nonexistent-dir")
    assert code == 126 and "chdir failed" in err


def test_killed_judge_is_reported_and_the_zygote_keeps_serving(
    loop: asyncio.AbstractEventLoop, zygote: JudgeZygote, tmp_path: Path
) -> None:
    """Killed as the server kills one (its process group), a judge in its own PID namespace is reported
    killed, and nothing it started is left: the launcher's waiting parent and the judge, its namespace's
    init, share the group, and the kernel ends the rest of the namespace with the init."""
    slow_task = tmp_path / "slow_task.py"
    slow_task.write_text("import time\ntime.sleep(120)\n" + TASK.read_text())
    started: list[int] = []
    pidns = {"new_userns": True, "new_pidns": True}
    argv = [str(slow_task), str(SOLUTION), *QUICK]
    code, _, _ = _judge(loop, zygote, argv, kill_after=1.0, started=started, **pidns)
    assert code == -signal.SIGKILL
    assert len(started) > 1  # the launcher's parent, the judge and whatever the judge had started
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in started):
        assert time.monotonic() < deadline, [pid for pid in started if _alive(pid)]
        time.sleep(0.05)
    code, _, err = _judge(loop, zygote, ["/nonexistent/task.py", str(SOLUTION), *QUICK])
    assert code == 2 and "does not exist" in err


def test_minimal_preload_serves_when_the_full_one_is_refused(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The full preload's real refusals (a CUDA self-check that fails, a device descriptor still held)
    happen only on GPU hosts, so here the refusal is forced by patching `start_level` for "full"; the
    minimal zygote it falls back to is a real process."""
    real_start_level = JudgeZygote.start_level

    async def refuse_full(cls: type[JudgeZygote], level: str, *args: Any) -> JudgeZygote:
        if level == "full":
            raise ZygoteError("judge zygote (full preload) did not start: forced by the test")
        return await real_start_level.__func__(cls, level, *args)  # type: ignore[attr-defined]

    monkeypatch.setattr(JudgeZygote, "start_level", classmethod(refuse_full))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    minimal = loop.run_until_complete(JudgeZygote.start(sys.executable, env, str(tmp_path / "zygote.log")))
    try:
        assert minimal.hello["level"] == "minimal"
        assert "forced by the test" in minimal.hello["full_preload_error"]
        assert "torch._inductor.compile_fx" not in minimal.hello["loaded"]
        code, _, err = _judge(loop, minimal, ["/nonexistent/task.py", str(SOLUTION), *QUICK])
        assert code == 2 and "does not exist" in err  # it forks judges like the full one
    finally:
        loop.run_until_complete(minimal.close())


def test_spawn_after_the_zygote_exited_raises(
    loop: asyncio.AbstractEventLoop, zygote: JudgeZygote, tmp_path: Path
) -> None:
    """Last in this module: it ends the shared zygote."""

    async def scenario() -> None:
        zygote.proc.kill()
        await zygote.proc.wait()
        await asyncio.sleep(0.2)
        assert not zygote.alive
        with pytest.raises(ZygoteError):
            await zygote.spawn(
                [str(TASK), str(SOLUTION)], _spec(tmp_path), str(tmp_path / "o"), str(tmp_path / "e")
            )

    loop.run_until_complete(scenario())
