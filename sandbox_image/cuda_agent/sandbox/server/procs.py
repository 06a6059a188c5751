"""Running isolated children: foreground commands with a wall-clock timeout, and background jobs.

Every child starts in its own process group (the launcher's setsid; the seccomp filter then forbids
leaving it), so one killpg ends the command with everything it started. Output is kept bounded while
it streams in: the head and the tail survive, the middle is replaced by a note.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from cuda_agent.sandbox.server.isolation import kill_group

_READ_CHUNK = 65536
# After the main process exits, stragglers in its group are killed; this is how long their last
# output may take to drain from the pipe.
_DRAIN_S = 0.5


class BoundedOutput:
    """Keeps the first and last `limit/2` characters of a stream, counting what was dropped."""

    def __init__(self, limit: int) -> None:
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail.append(chunk)
            self.tail_len += len(chunk)
            while self.tail_len - len(self.tail[0]) >= self.half:
                self.tail_len -= len(self.tail.popleft())

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + min(self.tail_len, self.half)

    def render(self) -> str:
        tail = b"".join(self.tail)[-self.half :]
        dropped = self.total - len(self.head) - len(tail)
        head_text = self.head.decode("utf-8", "replace")
        tail_text = tail.decode("utf-8", "replace")
        if dropped > 0:
            return f"{head_text}\n\n[... {dropped} bytes of output truncated ...]\n\n{tail_text}"
        return head_text + tail_text


@dataclass
class CommandOutcome:
    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float


class _ExitAwareProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Signals the main process's exit on its own: Process.wait() also waits for every pipe to close,
    which a disowned background child would delay until the timeout."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def spawn(
    argv: list[str], merge_stderr: bool, limit: int = 1 << 16
) -> tuple[asyncio.subprocess.Process, asyncio.Event]:
    """Start a child in its own session (process group) with an empty environment and piped output."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitAwareProtocol(limit, loop),
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        start_new_session=True,
        env={},
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


async def end_group(proc: asyncio.subprocess.Process) -> None:
    """Kill what is left of the process group and wait until its pipes are closed (bounded)."""
    kill_group(proc.pid)
    try:
        await asyncio.wait_for(proc.wait(), 5)
    except TimeoutError:
        proc._transport.close()  # type: ignore[attr-defined]  # a pipe holder outside the group


async def run_foreground(
    argv: list[str],
    timeout_s: float,
    output_limit: int,
    groups: set[int] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> CommandOutcome:
    """Run to completion or until timeout; either way nothing of its process group survives.
    `groups`: where the running command's process group is listed (its session's, so that deleting the
    session can kill it); `on_start(pgid)`: called once it is listed (a session deleted while the
    command started kills it there)."""
    start = time.monotonic()
    proc, exited = await spawn(argv, merge_stderr=True)
    if groups is not None:
        groups.add(proc.pid)
    if on_start is not None:
        on_start(proc.pid)
    out = BoundedOutput(output_limit)
    assert proc.stdout is not None
    reader = asyncio.create_task(_pump(proc.stdout, out))
    timed_out = False
    try:
        await asyncio.wait_for(exited.wait(), timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        await end_group(proc)
        if groups is not None:
            groups.discard(proc.pid)
    try:
        await asyncio.wait_for(reader, _DRAIN_S)
    except TimeoutError:
        reader.cancel()
    text = out.render()
    if timed_out:
        text += f"\n[command timed out after {timeout_s:g} s; its process group was killed]"
    return CommandOutcome(
        output=text,
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        truncated=out.truncated,
        duration_s=time.monotonic() - start,
    )


async def _pump(stream: asyncio.StreamReader, sink: BoundedOutput | BackgroundJob) -> None:
    while chunk := await stream.read(_READ_CHUNK):
        sink.feed(chunk)


@dataclass
class BackgroundJob:
    """A command running on after its tool call returned; output is read incrementally."""

    bash_id: str
    command: str
    proc: asyncio.subprocess.Process
    max_pending: int
    pending: bytearray = field(default_factory=bytearray)
    dropped: int = 0
    killed: bool = False
    finished: bool = False
    timed_out: bool = False
    started_at: float = field(default_factory=time.monotonic)
    pump: asyncio.Task[None] | None = None

    def feed(self, chunk: bytes) -> None:
        self.pending += chunk
        overflow = len(self.pending) - self.max_pending
        if overflow > 0:
            del self.pending[:overflow]
            self.dropped += overflow

    @property
    def status(self) -> Literal["running", "exited", "killed"]:
        if self.proc.returncode is None:
            return "running"
        return "killed" if self.killed else "exited"

    def take_output(self, pattern: re.Pattern[str] | None) -> tuple[str, int]:
        text = self.pending.decode("utf-8", "replace")
        dropped = self.dropped
        self.pending.clear()
        self.dropped = 0
        if pattern is not None:
            text = "".join(line for line in text.splitlines(keepends=True) if pattern.search(line))
        return text, dropped

    def kill(self) -> None:
        if self.finished:
            # Its group is gone and its id free: killpg could now hit a newer command (pid reuse).
            return
        if self.proc.returncode is None:
            self.killed = True
        kill_group(self.proc.pid)


async def start_background(bash_id: str, command: str, argv: list[str], max_pending: int) -> BackgroundJob:
    proc, _ = await spawn(argv, merge_stderr=True)
    job = BackgroundJob(bash_id=bash_id, command=command, proc=proc, max_pending=max_pending)
    assert proc.stdout is not None
    job.pump = asyncio.create_task(_finish(job, proc.stdout))
    return job


async def _finish(job: BackgroundJob, stream: asyncio.StreamReader) -> None:
    # The pipe stays open while any process of the group lives, so wait for both ends.
    await _pump(stream, job)
    await job.proc.wait()
    job.finished = True
