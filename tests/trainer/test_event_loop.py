"""The trainer's one event loop: what an async engine started in one step still has in the next (the
loop and a background task it started), the caller's context inside the coroutine (the step's span),
and errors raised back to the caller."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from cuda_agent.trainer.event_loop import run_async

current_step: contextvars.ContextVar[str] = contextvars.ContextVar("current_step", default="none")


class Engine:
    """Like an in-process async engine: its first call starts a task that serves every later call."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[tuple[int, asyncio.Future[int]]] | None = None
        self.server: asyncio.Task[None] | None = None

    async def double(self, x: int) -> int:
        if self.server is None:
            self.requests = asyncio.Queue()
            self.server = asyncio.get_running_loop().create_task(self._serve())
        assert self.requests is not None
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self.requests.put((x, answer))
        return await answer

    async def _serve(self) -> None:
        assert self.requests is not None
        while True:
            x, answer = await self.requests.get()
            answer.set_result(2 * x)


def test_one_loop_across_calls_with_the_callers_context_and_errors() -> None:
    engine = Engine()
    assert run_async(engine.double(2)) == 4
    # With asyncio.run per call, the first loop would be closed and its serving task cancelled here.
    assert run_async(engine.double(5)) == 10
    assert engine.server is not None and not engine.server.done()

    async def stop() -> None:
        assert engine.server is not None
        engine.server.cancel()

    run_async(stop())

    async def step_name() -> str:
        return current_step.get()

    token = current_step.set("ppo-3")
    try:
        assert run_async(step_name()) == "ppo-3"
    finally:
        current_step.reset(token)

    async def fails() -> None:
        raise ValueError("engine died")

    with pytest.raises(ValueError, match="engine died"):
        run_async(fails())
