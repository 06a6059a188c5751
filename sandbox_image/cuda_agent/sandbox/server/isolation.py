"""How agent commands and judge runs are isolated, chosen per environment (see docs/sandbox.md).

root mode (a local machine, or a privileged pod): every session slot owns two uids, one for the agent's
commands and one for its judge runs, neither of them the server's; every child gets a fresh network
namespace (loopback only) and a mount namespace where /root is hidden and GPUs are masked from agent
commands; workspaces are size-limited tmpfs mounts owned by the agent uid.

restricted mode (non-root pod, no capabilities): no user switch is possible, so children run under the
server's uid with no_new_privs and a seccomp filter that refuses signals to the server, ptrace, sockets
other than AF_UNIX and namespace changes; the server marks itself non-dumpable so same-uid code cannot
read its memory or /proc/<pid>/environ. Both modes apply the same rlimits and kill whole process groups.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import marshal
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cuda_agent
from cuda_agent.sandbox.server.config import ProcessLimits, SandboxServerConfig
from cuda_agent.sandbox.server.seccomp_bpf import FilterPolicy, build_filter

LAUNCHER = Path(__file__).with_name("launcher.py")
PR_SET_DUMPABLE = 4
CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
# Raised for every child: when the pod runs out of memory the kernel kills agent code, not the server.
CHILD_OOM_SCORE_ADJ = 1000


class IsolationError(RuntimeError):
    """The environment cannot provide the isolation the configuration asks for."""


@dataclass(frozen=True)
class Slot:
    """One session's (or one stateless evaluation's) identities."""

    index: int
    agent_uid: int
    agent_gid: int
    judge_uid: int
    judge_gid: int


def harden_server_process(private_mounts: bool) -> bool:
    """Called once at startup, before any thread exists. Returns whether mounts are now private.

    Non-dumpable: same-uid processes can no longer ptrace the server or read its /proc files. A private
    mount namespace keeps the per-session tmpfs mounts out of the host's mount table; they vanish with
    the server.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    if not private_mounts:
        return False
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    return bool(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0)


def detect_mode(requested: str) -> str:
    if requested == "root" and os.geteuid() != 0:
        raise IsolationError("--isolation root needs the server to run as root (uid 0)")
    if requested == "auto":
        return "root" if os.geteuid() == 0 else "restricted"
    return requested


def _expose_paths(config: SandboxServerConfig) -> list[str]:
    """Paths children must still reach when a mask path hides their parent (the interpreter, the code)."""
    wanted = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    wanted |= {os.path.dirname(p) for p in cuda_agent.__path__}
    wanted |= {p for p in sys.path if p and os.path.isdir(p)}
    wanted.add(str(config.state_dir))
    if config.judge_dir is not None:
        wanted.add(str(config.judge_dir))
    if os.path.isabs(config.judge_command[0]):
        wanted.add(os.path.dirname(config.judge_command[0]))
    real = sorted({os.path.realpath(p) for p in wanted} | wanted)
    # A bind of a directory covers everything under it, so keep only the outermost paths.
    outermost: list[str] = []
    for path in real:
        if not any(path == o or path.startswith(o + "/") for o in outermost):
            outermost.append(path)
    return outermost


class Isolation:
    """Builds the launcher spec for every child and cleans up after sessions."""

    def __init__(self, config: SandboxServerConfig, mode: str, private_mounts: bool) -> None:
        self.config = config
        self.mode = mode
        self.private_mounts = private_mounts
        self.server_pid = os.getpid()
        protected = (self.server_pid, os.getpgid(0))
        self.agent_filter = build_filter(FilterPolicy(protected_pids=protected)).hex()
        # The judge's own orchestrator may start worker sessions; it is killed by uid (root) or group.
        self.judge_filter = build_filter(FilterPolicy(deny_new_session=False, protected_pids=protected)).hex()
        exposes = _expose_paths(config)
        self.masks = [
            {"path": str(m), "expose": [p for p in exposes if p.startswith(str(m).rstrip("/") + "/")]}
            for m in config.mask_paths
        ]
        self.judge_group = config.uid_base - 1
        # Restricted mode has one uid for everything; Landlock hides the state directory (other sessions,
        # judge snapshots) from each child, which then sees only its own directories beneath it.
        self.landlock_read = [] if self.is_root else readable_outside(config.state_dir)

    @property
    def is_root(self) -> bool:
        return self.mode == "root"

    def slot(self, index: int) -> Slot:
        if not self.is_root:
            uid, gid = os.getuid(), os.getgid()
            return Slot(index, uid, gid, uid, gid)
        agent = self.config.uid_base + 2 * index
        return Slot(index, agent, agent, agent + 1, agent + 1)

    def launch_argv(self, spec: dict[str, Any]) -> list[str]:
        return launch_argv(spec)

    def agent_spec(
        self, slot: Slot, argv: list[str], env: dict[str, str], cwd: str, writable: list[str]
    ) -> dict[str, Any]:
        """`writable`: the session's own directories (the only part of the state directory it sees)."""
        hide = [] if self.config.agent_gpu_access else sorted(glob.glob("/dev/nvidia*"))
        limits = self.config.agent_limits
        if self.config.agent_gpu_access:
            # CUDA reserves far more address space than it uses: RLIMIT_AS would break cuInit.
            limits = limits.model_copy(update={"memory_mib": None})
        spec = self._spec(slot.agent_uid, slot.agent_gid, [], argv, env, cwd, limits, self.agent_filter, hide)
        return spec | {"landlock": self._landlock(writable)}

    def judge_spec(
        self,
        slot: Slot,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        writable: list[str],
        readable: list[str],
        shared_cache: bool = False,
    ) -> dict[str, Any]:
        """`readable`: the snapshot, read-only even under the server's uid; `writable`: scratch, cache.
        `shared_cache`: judges of every slot share one setgid cache directory, so what one writes there
        must stay open to the judges' group (umask 007); its private scratch is 0700 all the same."""
        groups, limits = [self.judge_group], self.config.judge_limits
        spec = self._spec(
            slot.judge_uid, slot.judge_gid, groups, argv, env, cwd, limits, self.judge_filter, []
        )
        if shared_cache and self.is_root:
            spec["umask"] = 0o007
        return spec | {"landlock": self._landlock(writable, readable)}

    def _landlock(
        self, writable: list[str], readable: list[str] | None = None
    ) -> dict[str, list[str]] | None:
        if self.is_root:
            return None  # separate uids and 0700 directories already keep sessions apart
        return {"read": [*self.landlock_read, *(readable or [])], "write": [*writable, "/dev"]}

    def _spec(
        self,
        uid: int,
        gid: int,
        groups: list[int],
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        limits: ProcessLimits,
        seccomp_hex: str,
        hide: list[str],
    ) -> dict[str, Any]:
        root = self.is_root
        return {
            "argv": argv,
            "env": env,
            "cwd": cwd,
            "uid": uid if root else None,
            "gid": gid if root else None,
            "groups": groups if root else [],
            "rlimits": limits.rlimits(),
            "new_netns": root,
            "new_mountns": root,
            "masks": self.masks if root else [],
            "hide": hide if root else [],
            "seccomp": seccomp_hex,
            "oom_score_adj": CHILD_OOM_SCORE_ADJ,
            "umask": 0o077 if root else 0o022,
        }

    def base_env(self) -> dict[str, str]:
        """The allowlisted part of the server's environment; nothing else (no secrets) reaches children."""
        env = {k: os.environ[k] for k in self.config.env_passthrough if k in os.environ}
        env.setdefault("LANG", "C.UTF-8")
        return env


def readable_outside(hidden: Path) -> list[str]:
    """Every path beside the way from / to `hidden`: together, all of the tree except `hidden`."""
    roots: list[str] = []
    current = Path("/")
    for name in hidden.resolve().parts[1:]:
        roots += sorted(entry.path for entry in os.scandir(current) if entry.name != name)
        current = current / name
    return roots


def landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(444, None, ctypes.c_size_t(0), ctypes.c_uint32(1)))


def unconfined_spec(argv: list[str], env: dict[str, str], cwd: str, **changes: Any) -> dict[str, Any]:
    """A launcher spec that confines nothing (no user switch, namespaces, limits, Landlock or seccomp):
    tests and benchmarks add exactly the steps they exercise through `changes`."""
    spec: dict[str, Any] = {
        "argv": argv,
        "env": env,
        "cwd": cwd,
        "uid": None,
        "gid": None,
        "groups": [],
        "rlimits": {},
        "new_netns": False,
        "new_mountns": False,
        "masks": [],
        "hide": [],
        "seccomp": None,
        "oom_score_adj": None,
        "umask": 0o022,
        "landlock": None,
    }
    return spec | changes


def launch_argv(spec: dict[str, Any]) -> list[str]:
    """The command that runs `spec` through the launcher (spec values: str, int, bool, None, list, dict)."""
    return [sys.executable, "-I", "-S", str(LAUNCHER), marshal.dumps(spec).hex()]


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    pids.append(int(name))
            except FileNotFoundError:
                continue
    return pids


def kill_uid_processes(uid: int, max_rounds: int = 100) -> int:
    """Kill every process of `uid` (root mode), fork bombs included.

    Stopped processes cannot fork, so everything found is stopped first and scanned again until no new
    process appears; then all of them are killed. Returns how many processes were killed.
    """
    if uid == 0 or uid == os.getuid():
        raise ValueError(f"refusing to kill all processes of uid {uid}")
    seen: set[int] = set()
    for _ in range(max_rounds):
        new = [p for p in _pids_of_uid(uid) if p not in seen]
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        seen.update(new)
    for pid in seen:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(seen)
