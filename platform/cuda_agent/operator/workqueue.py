"""A coalescing work queue of objects to reconcile, in the style of client-go's workqueue.

Watch events only *mark* an object dirty; workers reconcile the latest state. A burst of 128 pod events
for one pool becomes a few reconcile passes, a key is never reconciled by two workers at once, and a
pass can ask to be run again after a delay (autoscaler period, drain wait, error backoff).

A pass that raises is retried after a per-key exponential backoff, as client-go's
ItemExponentialFailureRateLimiter with the default controller limiter's numbers: 5 ms after the first
failure, doubling with each further failure of that key, at most 1000 s; a pass that returns resets the
key's count (client-go's Forget), unless it handled an error itself and asked for its retry through
`failed` (it then counts as a failure too). A watch event still marks the key dirty at once, so a
backed-off key whose object changes is reconciled without waiting out its delay.

The queue reports what client-go's workqueue reports to its MetricsProvider (`QueueMetrics`): each add of
a key that was not dirty, each retry after a failure, how long a key waited from its add until a worker
took it, and how long its pass took; and it answers, per kind, the seconds of work in progress now and the
age of the oldest pass. The operator's metrics module exports them under client-go's names.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)
Key = tuple[str, str, str]  # (kind, namespace, name)
Reconcile = Callable[[Key], Awaitable[float | None]]


class QueueMetrics(Protocol):
    """What the queue reports as it works (client-go's workqueue MetricsProvider, per key)."""

    def added(self, key: Key) -> None:
        """`key` was marked dirty (it was not already)."""

    def retried(self, key: Key) -> None:
        """A pass of `key` failed (raised, or handled its error and called `failed`): it is retried."""

    def picked(self, key: Key, waited: float) -> None:
        """A worker took `key`, `waited` seconds after the add that made it dirty."""

    def done(self, key: Key, worked: float) -> None:
        """A pass of `key` ended after `worked` seconds."""


class NoQueueMetrics:
    """Reports nothing (a queue outside the operator's process, e.g. in tests)."""

    def added(self, key: Key) -> None:
        return None

    def retried(self, key: Key) -> None:
        return None

    def picked(self, key: Key, waited: float) -> None:
        return None

    def done(self, key: Key, worked: float) -> None:
        return None


@dataclass
class WorkQueue:
    """Dirty keys wait `settle` seconds before a pass, so a burst of events collapses into one.

    `failure_base` .. `failure_max` bound the per-key backoff after a pass that raised, or that handled an
    error itself and said so (`failed`)."""

    settle: float = 0.2
    failure_base: float = 0.005
    failure_max: float = 1000.0
    metrics: QueueMetrics = field(default_factory=NoQueueMetrics)
    _failures: dict[Key, int] = field(default_factory=dict)
    _handled: set[Key] = field(default_factory=set)  # keys whose running pass called failed()
    _dirty: set[Key] = field(default_factory=set)
    _queue: asyncio.Queue[Key] = field(default_factory=asyncio.Queue)
    _active: dict[Key, float] = field(default_factory=dict)  # key -> when its pass started (monotonic)
    _added_at: dict[Key, float] = field(default_factory=dict)  # dirty key -> when it was added (monotonic)
    _timers: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    _open: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def depth(self) -> int:
        """Objects marked dirty and not yet taken by a worker."""
        return len(self._dirty)

    def depth_of(self, kind: str) -> int:
        """Objects of `kind` marked dirty and not yet taken (a controller's queue depth)."""
        # A copy first: a scrape reads this from the metrics server's thread while the loop changes it.
        return sum(1 for key in tuple(self._dirty) if key[0] == kind)

    def active_of(self, kind: str) -> int:
        """Workers in a pass over an object of `kind` now."""
        return len(self._started_of(kind))

    def unfinished_work_of(self, kind: str) -> float:
        """Seconds spent so far by the passes over `kind` that are running now (client-go's unfinished
        work: it grows while a pass is stuck)."""
        now = time.monotonic()
        return sum(now - started for started in self._started_of(kind))

    def longest_running_of(self, kind: str) -> float:
        """Seconds the oldest running pass over `kind` has run; 0 when none runs."""
        now = time.monotonic()
        return max((now - started for started in self._started_of(kind)), default=0.0)

    def _started_of(self, kind: str) -> list[float]:
        return [started for key, started in tuple(self._active.items()) if key[0] == kind]

    def open(self) -> None:
        """Let workers start. Until then keys only collect: a pass must not run on half-filled
        watch indexes (a StatefulSet missing from them would look like one to create from scratch)."""
        self._open.set()

    def add(self, key: Key) -> None:
        """Mark dirty now-ish; several adds before the pass starts cost one pass."""
        if key in self._dirty:
            return
        self._dirty.add(key)
        self._added_at.setdefault(key, time.monotonic())
        self.metrics.added(key)
        if key not in self._active:
            asyncio.get_running_loop().call_later(self.settle, self._queue.put_nowait, key)

    def add_after(self, key: Key, delay: float) -> None:
        """Re-check later; an earlier requeue of the same key wins over a later one."""
        loop = asyncio.get_running_loop()
        existing = self._timers.get(key)
        if existing is not None and existing.when() <= loop.time() + delay:
            return
        if existing is not None:
            existing.cancel()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def retry_delay(self, key: Key) -> float:
        """The delay before `key` is retried if its pass raises now: failure_base * 2^(earlier failures in
        a row), at most failure_max."""
        failures = self._failures.get(key, 0)
        if failures >= 64:  # 2**64 * 5 ms is far past any maximum; keeps the float finite
            return self.failure_max
        return float(min(self.failure_base * 2**failures, self.failure_max))

    def failed(self, key: Key, at_most: float | None = None) -> float:
        """For a pass of `key` that handled an error itself (a refused write) and returns normally: the
        delay to ask for, the same per-key backoff as after a raise (at most `at_most`), and the pass
        counts as a failure, so the next one in a row waits twice as long (controller-runtime's
        `return result, err`)."""
        self._handled.add(key)
        delay = self.retry_delay(key)
        return delay if at_most is None else min(delay, at_most)

    def failures(self, key: Key) -> int:
        """Passes of `key` that raised in a row (0 once one returns)."""
        return self._failures.get(key, 0)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def work(self, reconcile: Reconcile) -> None:
        """One worker: take a key, reconcile it, schedule the requeue it asked for. Runs until cancelled."""
        await self._open.wait()
        while True:
            key = await self._queue.get()
            if key in self._active or key not in self._dirty:
                continue  # another worker has it; it re-queues on finish if dirtied meanwhile
            self._dirty.discard(key)
            started = time.monotonic()
            self.metrics.picked(key, started - self._added_at.pop(key, started))
            self._active[key] = started
            try:
                requeue = await reconcile(key)
                if key in self._handled:
                    self._failures[key] = self._failures.get(key, 0) + 1
                    self.metrics.retried(key)
                else:
                    self._failures.pop(key, None)
            except Exception:  # a bug or an outage must not kill the worker: log, back off, retry
                requeue = self.retry_delay(key)
                self._failures[key] = self._failures.get(key, 0) + 1
                self.metrics.retried(key)
                log.exception(
                    "reconcile of %s/%s/%s failed (%d in a row); retrying in %.3g s",
                    *key,
                    self._failures[key],
                    requeue,
                )
            finally:
                self._handled.discard(key)
                self._active.pop(key, None)
                self.metrics.done(key, time.monotonic() - started)
                if key in self._dirty:
                    self._queue.put_nowait(key)
            if requeue is not None:
                self.add_after(key, requeue)

    def cancel_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
