"""The local executor's process supervision on real processes (no cluster): restart with backoff up to a
limit, the exit reason kept, logs appended to a file, and stop() ending the whole process group."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from cuda_agent.operator.local_executor import Supervised, trainer_state


def supervised(tmp_path: Path, script: str, max_restarts: int | None) -> Supervised:
    return Supervised(
        name="test",
        argv=["/bin/sh", "-c", script],
        env=dict(os.environ),
        log_path=tmp_path / "process.log",
        on_change=lambda: None,
        backoff=0.05,
        max_restarts=max_restarts,
    )


def test_a_crashing_process_is_restarted_then_failed_with_its_exit_code(tmp_path: Path) -> None:
    async def scenario() -> Supervised:
        process = supervised(tmp_path, "echo attempt; exit 3", max_restarts=3)
        process.start()
        while process.state not in ("failed", "succeeded"):
            await asyncio.sleep(0.05)
        return process

    process = asyncio.run(scenario())
    assert (process.state, process.restarts, process.last_exit) == ("failed", 3, "exit code 3")
    assert (tmp_path / "process.log").read_text().count("attempt") == 3
    state, message = trainer_state(process)
    assert state == "failed" and "3 times" in message and "exit code 3" in message


def test_stop_ends_the_process_group_and_a_clean_exit_succeeds(tmp_path: Path) -> None:
    async def scenario() -> tuple[Supervised, int, Supervised]:
        # The shell's background child is in the same process group: stop() must end it too.
        running = supervised(tmp_path, "sleep 300 & echo $! > child.pid; wait", max_restarts=None)
        running.cwd = tmp_path
        running.start()
        while not (tmp_path / "child.pid").exists() or not (tmp_path / "child.pid").read_text().strip():
            await asyncio.sleep(0.05)
        child = int((tmp_path / "child.pid").read_text())
        await running.stop()
        finished = supervised(tmp_path, "exit 0", max_restarts=3)
        finished.start()
        while finished.state != "succeeded":
            await asyncio.sleep(0.05)
        return running, child, finished

    running, child, finished = asyncio.run(scenario())
    assert running.state == "stopped" and running.last_exit == "killed by SIGTERM"
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    assert trainer_state(finished)[0] == "complete"
