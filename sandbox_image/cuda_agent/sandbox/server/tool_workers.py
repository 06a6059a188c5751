"""Processes that run the agent's file tools (read, write, edit, glob, grep, notebook_edit) and the
bash_output filter, so a slow pattern, a huge edit or a deep walk costs one worker process under a time
and memory limit, never the server's event loop, interpreter or memory.

Workers are spawned (a fresh interpreter talking over an inherited socketpair), never through
multiprocessing's forkserver: its listening socket has a path that an agent command of the same uid
(restricted mode) could connect to and have arbitrary pickled code run outside its seccomp filter and
Landlock rules. Each worker marks itself non-dumpable, since it reads every session's files. A call
that runs past its time limit has its worker killed and replaced; the agent reads why.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import resource
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from cuda_agent.sandbox.server import file_tools
from cuda_agent.sandbox.server.workspace_fs import ToolError

_CTX = multiprocessing.get_context("spawn")

MARKER_SLACK = 200  # a tool that cut its own output adds a note; leave it whole
# What a worker may run: the file tools and the filter, looked up by name so requests stay picklable.
WORKER_FUNCTIONS = frozenset(
    {"read", "write", "edit", "multi_edit", "glob", "grep", "notebook_edit", "filter_lines"}
)


def cap_output(text: str, limit: int) -> str:
    """At most `limit` characters (plus a tool's own short marker): head and tail kept, the middle
    replaced by a marker naming the cut."""
    if len(text) <= limit + MARKER_SLACK:
        return text
    half = limit // 2
    cut = len(text) - 2 * half
    return f"{text[:half]}\n[... {cut} characters cut: output limit {limit} ...]\n{text[-half:]}"


def _serve(conn: Connection, memory_mib: int, output_limit: int) -> None:
    from cuda_agent.sandbox.judge.confinement import make_non_dumpable

    make_non_dumpable()
    resource.setrlimit(resource.RLIMIT_AS, (memory_mib << 20, memory_mib << 20))
    while True:
        try:
            name, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            value = getattr(file_tools, name)(*args)
            if isinstance(value, str):
                value = cap_output(file_tools.printable(value), output_limit)
            else:
                output = cap_output(file_tools.printable(value.output), output_limit)
                value = value.model_copy(update={"output": output})
            reply: tuple[str, Any] = ("ok", value)
        except ToolError as exc:
            reply = ("tool_error", file_tools.printable(str(exc)))
        except MemoryError:
            reply = ("tool_error", f"the tool ran out of memory (limit {memory_mib} MiB)")
        except RecursionError:
            reply = ("tool_error", "the tool gave up: structure nested too deeply")
        except Exception as exc:
            reply = ("error", file_tools.printable(f"{type(exc).__name__}: {exc}"))
        conn.send(reply)


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection

    def exchange(self, message: tuple[str, tuple[Any, ...]], timeout_s: float) -> tuple[str, Any]:
        """Runs in a thread of the pool's executor: send, wait at most timeout_s, receive."""
        try:
            self.conn.send(message)
            if not self.conn.poll(timeout_s):
                self.kill()
                return ("timeout", None)
            reply: tuple[str, Any] = self.conn.recv()
            return reply
        except (EOFError, OSError):
            self.kill()
            return ("died", None)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()


@dataclass
class _Share:
    slots: asyncio.Semaphore
    users: int = 0


class ToolWorkers:
    """A pool of at most `size` worker processes, started on demand and reused; one owner (session)
    holds at most `per_owner` of them at once, so a session firing slow calls leaves workers for others."""

    def __init__(
        self, size: int, per_owner: int, timeout_s: float, memory_mib: int, output_limit: int
    ) -> None:
        self.size = size
        self.per_owner = max(1, min(per_owner, size))
        self._shares: dict[str, _Share] = {}
        self.timeout_s = timeout_s
        self.memory_mib = memory_mib
        self.output_limit = output_limit
        self._idle: list[_Worker] = []
        self._slots: asyncio.Semaphore | None = None
        # One thread per worker waits on its pipe; the event loop never blocks on a worker.
        self._threads = ThreadPoolExecutor(size, thread_name_prefix="tool-worker")
        self.killed = 0

    def _start(self) -> _Worker:
        parent, child = _CTX.Pipe()
        process = _CTX.Process(
            target=_serve, args=(child, self.memory_mib, self.output_limit), daemon=True, name="tool-worker"
        )
        process.start()
        child.close()
        return _Worker(process, parent)

    async def prestart(self) -> None:
        """Start one worker now (an interpreter start), so the first tool call does not pay for it."""
        worker = await asyncio.get_running_loop().run_in_executor(self._threads, self._start)
        self._idle.append(worker)

    async def run(self, owner: str, name: str, *args: Any) -> Any:
        """`file_tools.<name>(*args)` in a worker, for `owner`. ToolError for what the agent should read
        (including a timeout or the memory limit); RuntimeError for a bug."""
        if name not in WORKER_FUNCTIONS:
            raise ValueError(f"not a worker function: {name}")
        share = self._shares.get(owner)
        if share is None:
            share = self._shares[owner] = _Share(asyncio.Semaphore(self.per_owner))
        share.users += 1
        try:
            async with share.slots:
                return await self._run(name, args)
        finally:
            share.users -= 1
            if share.users == 0:
                del self._shares[owner]

    async def _run(self, name: str, args: tuple[Any, ...]) -> Any:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        loop = asyncio.get_running_loop()
        async with self._slots:
            worker = (
                self._idle.pop() if self._idle else await loop.run_in_executor(self._threads, self._start)
            )
            try:
                status, value = await loop.run_in_executor(
                    self._threads, worker.exchange, (name, args), self.timeout_s
                )
            except BaseException:  # cancelled (the client went away): the worker's state is unknown
                await loop.run_in_executor(None, worker.kill)
                raise
            if status in ("ok", "tool_error", "error"):
                self._idle.append(worker)
            else:
                self.killed += 1
        if status == "ok":
            return value
        if status == "tool_error":
            raise ToolError(value)
        if status == "timeout":
            raise ToolError(f"{name} took longer than {self.timeout_s:g} s and was stopped; narrow it down")
        if status == "died":
            raise ToolError(f"{name} failed: its worker process died (memory limit {self.memory_mib} MiB)")
        raise RuntimeError(f"{name} failed in its worker: {value}")

    def close(self) -> None:
        for worker in self._idle:
            worker.kill()
        self._idle.clear()
        self._threads.shutdown(wait=False, cancel_futures=True)
