"""The server's own init: a parent process that reaps every orphan and forwards signals to the server.

In a pod the server is PID 1 of the container's PID namespace, with no init: every process an agent
command or a judge leaves behind (the launcher's PID-namespace child once the launcher is killed, a
pipeline's members killed at a timeout) is reparented to it, and the server never waits for processes
it did not start, so they stayed zombies. Zombies count against the uid's RLIMIT_NPROC (root mode: the
slot's next session could not fork after 67 timeouts) and against the pod's pids limit (restricted mode:
after 56 timeouts no session could run `ls | wc -l`).

So `cuda-agent sandbox serve` forks first, before anything else starts: the parent marks itself a child
subreaper (PR_SET_CHILD_SUBREAPER: orphans below it come to it even when it is not PID 1), is
non-dumpable (it holds the server's environment), forwards the usual termination signals to the server
and reaps whatever exits, and when the server itself ends exits with its status. The server cannot reap
orphans itself: a wait for any child would steal the exit statuses of the commands, workers and judges
it waits for by pid (asyncio, multiprocessing and subprocess each wait for their own).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 1, 4, 36
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

_init_pid: int | None = None


def init_pid() -> int | None:
    """The pid of the init this server runs under (None: it was not started under one)."""
    return _init_pid


def run_under_init() -> None:
    """Fork; returns in the child, which goes on as the server. The parent never returns: it reaps
    until the server exits, then exits with the server's status (128 + N if a signal N ended it)."""
    global _init_pid
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()
    # Signals arriving before the parent forwards them (or before the child resets them) wait.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid == 0:
        # The server dies with its init (a SIGKILL to the pod's PID 1, say) instead of running on orphaned.
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        _init_pid = parent
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    os._exit(_reap_until(pid))


def _reap_until(server: int) -> int:
    """Wait for any child (orphans included) until the server exits; returns its exit code."""
    while True:
        try:
            reaped, status = os.wait()
        except ChildProcessError:  # no child at all: the server is gone without a status
            return 1
        if reaped == server:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code
