"""A fair (FIFO ticket) lock per device, shared between processes through one small state file.

The judge holds it around verify and profile, so no other session's verify or profile runs on the same
device while it measures, and the session server reads the same state file for its queue and busy
metrics. `fcntl.flock` alone is not FIFO (every waiter wakes and races), so flock only guards short
updates of a state file that holds a ticket dispenser: each waiter draws the next ticket and runs when
`serving` reaches it. Tickets whose owner died (killed judge, crashed server) are skipped, so a dead
holder never blocks the queue.

Liveness never uses pids: judges run in PID namespaces of their own, where a pid means nothing to the
server or to another judge. Each drawn ticket is a file `<state>.owners/<ticket>` on which its owner holds
`flock(LOCK_EX)` through a descriptor it keeps until it gives the ticket back; the kernel drops that
flock when the owner dies, so a ticket is alive exactly while its file's flock cannot be taken. Unlike
POSIX record locks, flocks of two separate open() calls conflict even within one process, so the owner's
own checks see its ticket alive too.

Standard library only: both the judge (no aiohttp) and the server (no torch) import it.

    with device_lock("cuda:0", cache_dir / "locks").acquire(timeout_s) as hold:
        ...verify + profile...
    result.lock_wait_s = hold.wait_s
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

GPU_LOCK_ENV = "CUDA_AGENT_GPU_LOCK"
_POLL_START_S = 0.002
_POLL_MAX_S = 0.05


@dataclass
class LockState:
    """What the state file holds. `owners`: tickets drawn and not yet given back (each alive while its
    file's flock is held); `holder`: the ticket being served, once its owner has taken the lock."""

    next_ticket: int = 0
    serving: int = 0
    owners: list[int] = field(default_factory=list)
    holder: int | None = None
    held_since: float | None = None
    busy_total_s: float = 0.0
    wait_total_s: float = 0.0
    acquisitions: int = 0

    @classmethod
    def parse(cls, text: str) -> LockState:
        """The state in `text`; ValueError, KeyError or TypeError when it is not a consistent one."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError("GPU lock state is not a JSON object")
        holder, held_since = raw.get("holder"), raw.get("held_since")
        state = cls(
            next_ticket=int(raw["next_ticket"]),
            serving=int(raw["serving"]),
            owners=sorted(int(t) for t in raw["owners"]),
            holder=None if holder is None else int(holder),
            held_since=None if held_since is None else float(held_since),
            busy_total_s=float(raw.get("busy_total_s", 0.0)),
            wait_total_s=float(raw.get("wait_total_s", 0.0)),
            acquisitions=int(raw.get("acquisitions", 0)),
        )
        consistent = 0 <= state.serving <= state.next_ticket and state.holder in (None, state.serving)
        if not consistent or any(not state.serving <= t < state.next_ticket for t in state.owners):
            raise ValueError("inconsistent GPU lock state")
        return state

    def dump(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @property
    def queued(self) -> int:
        """Live tickets not yet served, the holder's excluded."""
        return len(self.owners) - (1 if self.holder is not None else 0)


class GpuTicketLock:
    """FIFO lock across processes; `path` is the state file (created on first use), its owners' ticket
    files live in `<path>.owners/`."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.owners_dir = self.path.with_name(self.path.name + ".owners")
        # ticket -> (descriptor holding its file's flock, pid of the process that drew it)
        self._tickets: dict[int, tuple[int, int]] = {}

    def create(self, gid: int) -> None:
        """Make the state file and the owners directory for every process of group `gid` (the server, at
        start, for the judges of all slots): group read-write, the directory setgid so ticket files get
        that group too. Never follows a symlink planted in their place."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
        try:
            os.fchown(fd, os.getuid(), gid)
            os.fchmod(fd, 0o660)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.mkdir(self.owners_dir, 0o700)
        fd = os.open(self.owners_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchown(fd, os.getuid(), gid)
            os.fchmod(fd, 0o2770)
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _state(self) -> Iterator[LockState]:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o660)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            old = os.pread(fd, 1 << 20, 0)
            try:
                state = LockState.parse(old.decode())
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                # Empty (first use) or corrupt: the queue is rebuilt from the live ticket files.
                state = self._recover()
            yield state
            # One write, padded with spaces (JSON ignores them) over the old text, never a truncate: a
            # judge killed while it writes (a deleted session's) leaves the old state or the new one,
            # not an empty file whose recovery would forget who holds the GPU.
            os.pwrite(fd, state.dump().encode().ljust(len(old)), 0)
        finally:
            os.close(fd)  # closing the last fd drops the flock

    def _recover(self) -> LockState:
        """A queue of the tickets whose owners still hold their files, in ticket order. The first may
        already hold the lock: it goes on and gives its ticket back as usual, and nobody else can take
        the lock meanwhile, since only that ticket is served until then."""
        try:
            names = os.listdir(self.owners_dir)
        except FileNotFoundError:
            return LockState()
        tickets = sorted(int(name) for name in names if name.isascii() and name.isdigit())
        live = [t for t in tickets if _ticket_alive(self.owners_dir / str(t))]
        next_ticket = max(tickets, default=-1) + 1
        return LockState(next_ticket=next_ticket, serving=min(live, default=next_ticket), owners=live)

    def read(self) -> LockState:
        """A consistent snapshot for metrics (no ticket drawn)."""
        with self._state() as state:
            _reap_dead(state, self.owners_dir)
            return dataclasses.replace(state, owners=list(state.owners))

    def draw_ticket(self) -> int:
        """A place in the queue, owned by this process until `release` (or its death)."""
        with self._state() as state:
            mode, gid = self._prepare_owners_dir()
            while True:
                ticket = state.next_ticket
                state.next_ticket += 1
                fd = _create_ticket_file(self.owners_dir / str(ticket), mode, gid)
                state.owners.append(ticket)  # a file still held is an owner the state had lost: one too
                if fd is not None:
                    self._tickets[ticket] = (fd, os.getpid())
                    return ticket

    def _prepare_owners_dir(self) -> tuple[int, int]:
        """The permission bits and group ticket files get: the state file's, so that whoever may use the
        state file may test and remove them. Without the server (the judge CLI alone), the directory is
        made here, open to the same group."""
        st = os.stat(self.path)
        mode = stat.S_IMODE(st.st_mode) & 0o666
        try:
            os.mkdir(self.owners_dir, 0o700)
        except FileExistsError:
            return mode, st.st_gid
        os.chmod(self.owners_dir, mode | (mode & 0o444) >> 2 | stat.S_ISGID)
        with contextlib.suppress(PermissionError):
            os.chown(self.owners_dir, -1, st.st_gid)
        return mode, st.st_gid

    def try_take(self, ticket: int, waited_s: float) -> bool:
        """Become the holder if `ticket` is being served; False means keep waiting."""
        with self._state() as state:
            _reap_dead(state, self.owners_dir)
            if state.serving != ticket or state.holder is not None or ticket not in state.owners:
                return False
            state.holder = ticket
            state.held_since = time.time()
            state.wait_total_s += waited_s
            state.acquisitions += 1
            return True

    def release(self, ticket: int) -> None:
        """Give back a ticket this process drew (held or still waiting); other tickets are left alone.
        In a forked child that inherited the ticket, only the child's copy of the descriptor is closed."""
        fd, owner = self._tickets.pop(ticket, (-1, -1))
        if fd < 0:
            return
        if owner != os.getpid():
            os.close(fd)
            return
        try:
            with self._state() as state:
                if state.holder == ticket:
                    state.busy_total_s += time.time() - (state.held_since or time.time())
                    state.holder = None
                    state.held_since = None
                if ticket in state.owners:
                    state.owners.remove(ticket)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.owners_dir / str(ticket))
                _advance_past_gone(state)
        finally:
            os.close(fd)

    def acquire(self, timeout_s: float | None = None) -> LockHold:
        """Block until this process holds the GPU; raises TimeoutError after timeout_s.

        The ticket's descriptor is close-on-exec, so an exec'd program never holds it. A child forked
        while the lock is held keeps the ticket alive for as long as it keeps the descriptor: intended,
        since such a child works for the holder (the judge's workers close inherited descriptors anyway,
        and die with the judge)."""
        start = time.monotonic()
        ticket = self.draw_ticket()
        delay = _POLL_START_S
        try:
            while not self.try_take(ticket, time.monotonic() - start):
                if timeout_s is not None and time.monotonic() - start > timeout_s:
                    raise TimeoutError(f"GPU lock {self.path} not acquired within {timeout_s} s")
                time.sleep(delay)
                delay = min(delay * 2, _POLL_MAX_S)
        except BaseException:
            self.release(ticket)  # give the ticket back so the queue moves on
            raise
        return LockHold(self, ticket, time.monotonic() - start)


def _create_ticket_file(path: Path, mode: int, gid: int) -> int | None:
    """A new ticket file, flock held, as a close-on-exec descriptor; None if a live owner holds a file
    of that name already. Called with the state file's flock held, so no check races this."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            if _ticket_alive(path):  # else it was left by a dead owner and is gone now
                return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # new, so nobody else has it open
        os.fchmod(fd, mode)  # the umask (judges: 077) must not keep others from testing it
        if os.fstat(fd).st_gid != gid:
            with contextlib.suppress(PermissionError):
                os.fchown(fd, -1, gid)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ticket_alive(path: Path) -> bool:
    """Whether a ticket's owner still holds its file's flock; a dead ticket's file is removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    except PermissionError:
        return True  # cannot be tested: never hand the GPU to someone else under a live holder
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return True
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    finally:
        os.close(fd)
    return False


def _reap_dead(state: LockState, owners_dir: Path) -> None:
    """Skip tickets (and a holder) whose owner is gone."""
    state.owners = [t for t in state.owners if _ticket_alive(owners_dir / str(t))]
    if state.holder is not None and state.holder not in state.owners:
        state.busy_total_s += time.time() - (state.held_since or time.time())
        state.holder = None
        state.held_since = None
    _advance_past_gone(state)


def _advance_past_gone(state: LockState) -> None:
    """Serve the oldest live ticket once nobody holds the lock (tickets only ever grow)."""
    if state.holder is None:
        state.serving = min(state.owners, default=state.next_ticket)


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
