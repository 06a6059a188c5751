"""The trainer's one event loop, for the whole run.

The driver is synchronous; rollouts and weight hooks are coroutines. `asyncio.run` per step or per bucket
would give each call a fresh loop and close it afterwards, and whatever an async engine bound to the first
loop (an in-process vLLM engine's output task, a batching task, client sessions) would be dead on the next
call. `run_async` runs every coroutine of the trainer on one loop in a background thread instead, started
on first use and kept until the process exits; the caller's context (the OpenTelemetry span of the step)
goes along, so episode spans stay children of the step's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoopThread:
    """An event loop running forever in a daemon thread; `run` waits for one coroutine on it."""

    def __init__(self, name: str = "cuda-agent-trainer-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("run_async called from the trainer's event loop itself: await instead")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        context = contextvars.copy_context()

        def start() -> None:
            task = self.loop.create_task(_wait(awaitable), context=context)
            task.add_done_callback(lambda t: _settle(done, t))

        self.loop.call_soon_threadsafe(start)
        return done.result()


async def _wait(awaitable: Awaitable[T]) -> T:
    return await awaitable


def _settle(done: concurrent.futures.Future[Any], task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        done.cancel()
    elif task.exception() is not None:
        done.set_exception(task.exception())
    else:
        done.set_result(task.result())


_loop: EventLoopThread | None = None
_lock = threading.Lock()


def trainer_loop() -> EventLoopThread:
    global _loop
    with _lock:
        if _loop is None:
            _loop = EventLoopThread()
        return _loop


def run_async(awaitable: Awaitable[T]) -> T:
    """Run `awaitable` to completion on the trainer's event loop and return its result (or raise)."""
    return trainer_loop().run(awaitable)
