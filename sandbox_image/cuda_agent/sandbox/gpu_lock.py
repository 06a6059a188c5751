"""A fair (FIFO ticket) lock per device, shared between processes through one small state file.

The judge holds it around verify and profile, so no other session's verify or profile runs on the same
device while it measures, and the session server reads the same state file for its queue and busy
metrics. `fcntl.flock` alone is not FIFO (every waiter wakes and races), so flock only guards short
updates of a state file that holds a ticket dispenser: each waiter draws the next ticket and runs when
`serving` reaches it. Tickets whose owner died (killed judge, crashed server) are skipped, so a dead
holder never blocks the queue.

Standard library only: both the judge (no aiohttp) and the server (no torch) import it.

    with device_lock("cuda:0", cache_dir / "locks").acquire(timeout_s) as hold:
        ...verify + profile...
    result.lock_wait_s = hold.wait_s
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GPU_LOCK_ENV = "CUDA_AGENT_GPU_LOCK"
_POLL_START_S = 0.002
_POLL_MAX_S = 0.05


@dataclass
class LockState:
    """What the state file holds; owners map ticket -> [pid, process start time] (pids get reused)."""

    next_ticket: int = 0
    serving: int = 0
    owners: dict[str, list[int]] = field(default_factory=dict)
    holder: list[int] | None = None
    held_since: float | None = None
    busy_total_s: float = 0.0
    wait_total_s: float = 0.0
    acquisitions: int = 0

    @classmethod
    def parse(cls, text: str) -> LockState:
        if not text.strip():
            return cls()
        raw = json.loads(text)
        return cls(
            next_ticket=int(raw["next_ticket"]),
            serving=int(raw["serving"]),
            owners={str(k): [int(v[0]), int(v[1])] for k, v in raw["owners"].items()},
            holder=None if raw.get("holder") is None else [int(x) for x in raw["holder"]],
            held_since=raw.get("held_since"),
            busy_total_s=float(raw.get("busy_total_s", 0.0)),
            wait_total_s=float(raw.get("wait_total_s", 0.0)),
            acquisitions=int(raw.get("acquisitions", 0)),
        )

    def dump(self) -> str:
        return json.dumps(self.__dict__)

    @property
    def queued(self) -> int:
        """Tickets drawn and not yet served, the holder's excluded."""
        return max(0, self.next_ticket - self.serving - (1 if self.holder else 0))


def process_identity(pid: int) -> list[int]:
    """[pid, start time in clock ticks]: a pid alone may name a newer, unrelated process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return [pid, 0]
    # Field 22 (starttime); the command name in field 2 may contain spaces, so split after its ')'.
    return [pid, int(stat.rsplit(")", 1)[1].split()[19])]


def is_alive(identity: list[int]) -> bool:
    pid, start = identity
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another uid's live process
    return start == 0 or process_identity(pid)[1] == start


class GpuTicketLock:
    """FIFO lock across processes; `path` is the state file (created on first use)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @contextlib.contextmanager
    def _state(self) -> Iterator[LockState]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o660)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "r+") as f:
                try:
                    state = LockState.parse(f.read())
                except (ValueError, KeyError, TypeError, IndexError):
                    # A corrupt file must not wedge the GPU: start a fresh queue.
                    state = LockState()
                yield state
                f.seek(0)
                f.truncate()
                f.write(state.dump())
        finally:
            os.close(fd)  # closing the last fd drops the flock

    def read(self) -> LockState:
        """A consistent snapshot for metrics (no ticket drawn)."""
        with self._state() as state:
            _reap_dead(state)
            return LockState(**state.__dict__)

    def draw_ticket(self, identity: list[int] | None = None) -> int:
        with self._state() as state:
            ticket = state.next_ticket
            state.next_ticket += 1
            state.owners[str(ticket)] = identity or process_identity(os.getpid())
            return ticket

    def try_take(self, ticket: int, waited_s: float) -> bool:
        """Become the holder if `ticket` is being served; False means keep waiting."""
        with self._state() as state:
            _reap_dead(state)
            if state.serving != ticket or state.holder is not None:
                return False
            state.holder = state.owners.get(str(ticket), process_identity(os.getpid()))
            state.held_since = time.time()
            state.wait_total_s += waited_s
            state.acquisitions += 1
            return True

    def release(self, ticket: int) -> None:
        with self._state() as state:
            if state.serving == ticket and state.holder is not None:
                state.busy_total_s += time.time() - (state.held_since or time.time())
                state.holder = None
                state.held_since = None
                state.serving += 1
            state.owners.pop(str(ticket), None)
            _advance_past_gone(state)

    def acquire(self, timeout_s: float | None = None) -> LockHold:
        """Block until this process holds the GPU; raises TimeoutError after timeout_s."""
        start = time.monotonic()
        ticket = self.draw_ticket()
        delay = _POLL_START_S
        while not self.try_take(ticket, time.monotonic() - start):
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                self.release(ticket)  # give the ticket back so the queue moves on
                raise TimeoutError(f"GPU lock {self.path} not acquired within {timeout_s} s")
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        return LockHold(self, ticket, time.monotonic() - start)


def _reap_dead(state: LockState) -> None:
    """Skip tickets (and a holder) whose process is gone."""
    if state.holder is not None and not is_alive(state.holder):
        state.busy_total_s += time.time() - (state.held_since or time.time())
        state.owners.pop(str(state.serving), None)
        state.holder = None
        state.held_since = None
        state.serving += 1
    dead = [t for t, ident in state.owners.items() if state.holder != ident and not is_alive(ident)]
    for t in dead:
        state.owners.pop(t)
    _advance_past_gone(state)


def _advance_past_gone(state: LockState) -> None:
    if state.holder is not None:
        return
    while state.serving < state.next_ticket and str(state.serving) not in state.owners:
        state.serving += 1


@dataclass
class LockHold:
    lock: GpuTicketLock | None
    ticket: int
    wait_s: float

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release(self.ticket)
            self.lock = None

    def __enter__(self) -> LockHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def host_device(device: str) -> str:
    """`device` ("cpu", "cuda:N") as the host numbers it: CUDA_VISIBLE_DEVICES renumbers GPUs per process,
    and two judges must share a lock exactly when they use the same physical GPU."""
    kind, _, index = device.partition(":")
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if kind != "cuda" or not visible:
        return device
    position = int(index or 0)
    return f"cuda:{visible[position]}" if position < len(visible) else device


def device_lock(device: str, default_dir: Path) -> GpuTicketLock:
    """The lock of the device a judge measures on: the state file CUDA_AGENT_GPU_LOCK names (the session
    server's per-GPU file, which its status reads), else `<default_dir>/device-<host device>.lock`."""
    path = os.environ.get(GPU_LOCK_ENV)
    if path:
        return GpuTicketLock(path)
    return GpuTicketLock(Path(default_dir) / f"device-{host_device(device).replace(':', '-')}.lock")
