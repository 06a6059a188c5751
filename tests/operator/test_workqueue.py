"""The work queue coalesces bursts, never runs one key twice at once, and honours requeue delays."""

from __future__ import annotations

import asyncio

from cuda_agent.operator.workqueue import Key, WorkQueue

POOL: Key = ("SandboxPool", "ns", "pool")


def test_a_burst_of_events_is_one_pass() -> None:
    async def scenario() -> list[Key]:
        queue, passes = WorkQueue(settle=0.05), []
        queue.open()

        async def reconcile(key: Key) -> float | None:
            passes.append(key)
            return None

        worker = asyncio.create_task(queue.work(reconcile))
        for _ in range(100):
            queue.add(POOL)
        await asyncio.sleep(0.3)
        worker.cancel()
        return passes

    assert asyncio.run(scenario()) == [POOL]


def test_changes_during_a_pass_cause_exactly_one_more_pass_and_no_overlap() -> None:
    async def scenario() -> tuple[int, int]:
        queue, passes, running, overlap = WorkQueue(settle=0.01), [0], [0], [0]
        queue.open()

        async def reconcile(key: Key) -> float | None:
            running[0] += 1
            overlap[0] = max(overlap[0], running[0])
            passes[0] += 1
            if passes[0] == 1:
                for _ in range(10):
                    queue.add(key)  # events arriving while the first pass runs
            await asyncio.sleep(0.05)
            running[0] -= 1
            return None

        workers = [asyncio.create_task(queue.work(reconcile)) for _ in range(4)]
        queue.add(POOL)
        await asyncio.sleep(0.4)
        for worker in workers:
            worker.cancel()
        return passes[0], overlap[0]

    assert asyncio.run(scenario()) == (2, 1)


def test_requeue_after_and_failures_are_retried() -> None:
    async def scenario() -> int:
        queue, passes = WorkQueue(settle=0.01, error_backoff=0.05), [0]
        queue.open()

        async def reconcile(key: Key) -> float | None:
            passes[0] += 1
            if passes[0] == 1:
                raise RuntimeError("apiserver went away")
            return 0.05 if passes[0] < 4 else None

        worker = asyncio.create_task(queue.work(reconcile))
        queue.add(POOL)
        await asyncio.sleep(0.6)
        worker.cancel()
        return passes[0]

    assert asyncio.run(scenario()) == 4


def test_nothing_runs_before_the_queue_is_opened() -> None:
    async def scenario() -> tuple[int, int]:
        queue, passes = WorkQueue(settle=0.01), [0]

        async def reconcile(key: Key) -> float | None:
            passes[0] += 1
            return None

        worker = asyncio.create_task(queue.work(reconcile))
        queue.add(POOL)
        await asyncio.sleep(0.1)
        before = passes[0]
        queue.open()
        await asyncio.sleep(0.1)
        worker.cancel()
        return before, passes[0]

    assert asyncio.run(scenario()) == (0, 1)
