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
        queue, passes = WorkQueue(settle=0.01), [0]
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


RUN: Key = ("TrainingRun", "ns", "run")


def test_failures_back_off_exponentially_per_key_and_a_success_resets() -> None:
    """client-go's ItemExponentialFailureRateLimiter: base * 2^failures, capped; Forget on success."""

    async def scenario() -> tuple[list[float], list[float], float, int]:
        queue = WorkQueue(settle=0.001, failure_base=0.01, failure_max=0.05)
        queue.open()
        delays: list[float] = []  # the delay this pass would get if it fails, seen from inside the pass
        others: list[float] = []

        async def reconcile(key: Key) -> float | None:
            if key == RUN:
                others.append(queue.retry_delay(RUN))
                return None
            delays.append(queue.retry_delay(key))
            if len(delays) <= 5:
                raise RuntimeError("apiserver went away")
            return None

        worker = asyncio.create_task(queue.work(reconcile))
        queue.add(POOL)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(delays) == 6:
                break
        queue.add(RUN)  # another key, reconciled while POOL had failed five times in a row
        await asyncio.sleep(0.05)
        worker.cancel()
        return delays, others, queue.retry_delay(POOL), queue.failures(POOL)

    delays, others, after, failures = asyncio.run(scenario())
    assert delays == [0.01, 0.02, 0.04, 0.05, 0.05, 0.05]  # doubling, then the cap
    assert others == [0.01]  # backoff is per key
    assert (after, failures) == (0.01, 0)  # the sixth pass returned: the count is forgotten


def test_a_watch_event_does_not_wait_out_the_backoff() -> None:
    async def scenario() -> int:
        queue, passes = WorkQueue(settle=0.01, failure_base=300.0), [0]
        queue.open()

        async def reconcile(key: Key) -> float | None:
            passes[0] += 1
            if passes[0] == 1:
                raise RuntimeError("conflict")
            return None

        worker = asyncio.create_task(queue.work(reconcile))
        queue.add(POOL)
        await asyncio.sleep(0.1)  # failed once; the retry is 300 s away
        queue.add(POOL)  # the object changed
        await asyncio.sleep(0.1)
        worker.cancel()
        queue.cancel_timers()
        return passes[0]

    assert asyncio.run(scenario()) == 2


def test_client_go_defaults() -> None:
    queue = WorkQueue()
    assert (queue.failure_base, queue.failure_max) == (0.005, 1000.0)
    queue._failures[POOL] = 17
    assert queue.retry_delay(POOL) == 655.36
    queue._failures[POOL] = 18
    assert queue.retry_delay(POOL) == 1000.0
    queue._failures[POOL] = 5000
    assert queue.retry_delay(POOL) == 1000.0


def test_a_pass_that_handled_its_error_backs_off_like_one_that_raised() -> None:
    """A reconciler whose write was refused returns `queue.failed(key)`: the per-key delay grows with
    each such pass (capped by `at_most`), and the first pass without an error resets it."""

    async def scenario() -> tuple[list[float], int, int]:
        queue = WorkQueue(settle=0.001, failure_base=0.01, failure_max=1.0)
        queue.open()
        asked: list[float] = []

        async def reconcile(key: Key) -> float | None:
            if len(asked) < 5:
                asked.append(queue.failed(key, at_most=0.05))  # e.g. a refused apply, reported in the status
                return asked[-1]
            return None

        worker = asyncio.create_task(queue.work(reconcile))
        queue.add(POOL)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(asked) == 5:
                break
        during = queue.failures(POOL)
        await asyncio.sleep(0.1)  # the sixth pass: no error
        worker.cancel()
        return asked, during, queue.failures(POOL)

    asked, during, after = asyncio.run(scenario())
    assert asked == [0.01, 0.02, 0.04, 0.05, 0.05]  # doubling, then at_most
    assert (during, after) == (5, 0)  # counted as failures; forgotten once a pass had none
