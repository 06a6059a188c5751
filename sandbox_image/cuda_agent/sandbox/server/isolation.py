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
import logging
import marshal
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cuda_agent
from cuda_agent.api.judge_files import JUDGE_OUTSIDE_PROC_ENV
from cuda_agent.sandbox.judge.confinement import proc_without_pids, readable_outside
from cuda_agent.sandbox.server.config import ProcessLimits, SandboxServerConfig
from cuda_agent.sandbox.server.init import init_pid
from cuda_agent.sandbox.server.seccomp_bpf import FilterPolicy, build_filter

log = logging.getLogger(__name__)

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
    if config.judge_seed_dir is not None:  # judges read it; no judge or agent can write it (judge_seed.py)
        wanted.add(str(config.judge_seed_dir))
    if os.path.isabs(config.judge_command[0]):
        wanted.add(os.path.dirname(config.judge_command[0]))
    real = sorted({os.path.realpath(p) for p in wanted} | wanted)
    # A bind of a directory covers everything under it, so keep only the outermost paths.
    outermost: list[str] = []
    for path in real:
        if not any(path == o or path.startswith(o + "/") for o in outermost):
            outermost.append(path)
    return outermost


# Shared, world-writable scratch places: every child gets its own instead (agents: the session's tmp/ and
# shm/, counted against its quota; judges: an empty tmpfs per run). /run holds the host's service
# sockets (a pathname socket is reachable from any network namespace), so agents get an empty one.
PRIVATE_SCRATCH = {"/tmp": "tmp", "/var/tmp": "tmp", "/dev/shm": "shm"}
AGENT_HIDDEN_DIRS = ("/run",)
# What an agent command may write of its session directory (its quota covers exactly these), and read.
AGENT_WRITABLE_DIRS = ("workspace", "tmp", "shm")
AGENT_READABLE_DIRS = ("bin", "run")
# Restricted mode: the devices an agent command may write (not /dev/shm or /dev/mqueue, which would be
# shared between sessions and outlive them; with namespaces /dev/shm is the session's own shm/).
AGENT_DEVICES = (
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
)


class Isolation:
    """Builds the launcher spec for every child and cleans up after sessions."""

    def __init__(self, config: SandboxServerConfig, mode: str, private_mounts: bool) -> None:
        self.config = config
        self.mode = mode
        self.private_mounts = private_mounts
        self.server_pid = os.getpid()
        # Agent commands get PID, IPC, mount and network namespaces as root, and through an unprivileged
        # user namespace in restricted mode where the kernel and the pod's seccomp profile allow one.
        self.user_namespaces = not self.is_root and user_namespaces_usable(config.user_namespaces)
        self.namespaces = self.is_root or self.user_namespaces
        # The server, its process group, and the init above it (server/init.py), which forwards signals.
        protected = (self.server_pid, os.getpgid(0), *filter(None, [init_pid()]))
        agent_policy = FilterPolicy(
            protected_pids=protected, deny_sysv_ipc=not self.namespaces, deny_netlink=not self.namespaces
        )
        self.agent_filter = build_filter(agent_policy).hex()
        # The judge's own orchestrator may start worker sessions; it is killed by uid (root) or group.
        # Judges with namespaces have a PID namespace of their own, where the server's pids name nobody
        # or one of the judge's own processes (its workers), which it must be able to kill.
        judge_protected = () if self.namespaces else protected
        # Without namespaces judges share the pod's SysV IPC namespace and /dev/shm: refuse the first with
        # the filter and keep the second out of their writable devices, as for agents.
        judge_policy = FilterPolicy(
            deny_new_session=False, protected_pids=judge_protected, deny_sysv_ipc=not self.namespaces
        )
        self.judge_devices = None if self.namespaces else shared_devices_left_out()
        self.judge_filter = build_filter(judge_policy).hex()
        self.exposes = _expose_paths(config)
        self.masks = [self._mask(str(m)) for m in config.mask_paths]
        self.judge_masks = self.masks + [
            self._mask(path, size_kib=config.judge_limits.file_size_mib << 10, mode="1777")
            for path in PRIVATE_SCRATCH
        ]
        self.judge_group = config.uid_base - 1
        # A session's tmp/ bound over /tmp cannot re-expose a state directory below /tmp without making
        # that directory an ancestor of the bind under Landlock, which would open every session to every
        # other: restricted mode then leaves that place shared (a warning; keep the state elsewhere).
        self.agent_scratch = dict(PRIVATE_SCRATCH)
        for path in PRIVATE_SCRATCH:
            if self.user_namespaces and self._mask(path)["expose"]:
                log.warning("state directory below %s: agent commands share %s", path, path)
                del self.agent_scratch[path]
        # Restricted mode has one uid for everything; Landlock hides the state directory (other sessions,
        # judge snapshots) from each child, which then sees only its own directories beneath it.
        self.landlock_read = [] if self.is_root else readable_outside(config.state_dir)
        # Without a PID namespace, every process's /proc/<pid> (its command line, above all) is readable
        # by same-uid code and no hidepid mount is possible unprivileged: agent commands then read all of
        # the tree but the per-process directories, except the command's own (proc_without_pids). CUDA
        # writes /proc/self/task at cuInit, so agents given a GPU keep all of /proc.
        self.agent_landlock_read = self.landlock_read
        if not self.is_root and not self.namespaces and not config.agent_gpu_access:
            hidden = (config.state_dir, Path("/proc"))
            self.agent_landlock_read = [*readable_outside(*hidden), *proc_without_pids_or_net()]
        # Judges under Landlock cannot list / themselves; their workers need this to hide other processes.
        self.judge_env: dict[str, str] = {}
        if not self.is_root:
            self.judge_env[JUDGE_OUTSIDE_PROC_ENV] = os.pathsep.join(readable_outside(Path("/proc")))

    @property
    def is_root(self) -> bool:
        return self.mode == "root"

    def slot(self, index: int) -> Slot:
        if not self.is_root:
            uid, gid = os.getuid(), os.getgid()
            return Slot(index, uid, gid, uid, gid)
        agent = self.config.uid_base + 2 * index
        return Slot(index, agent, agent, agent + 1, agent + 1)

    def _mask(self, path: str, **changes: Any) -> dict[str, Any]:
        """A directory covered in the child (by an empty tmpfs unless `source` is given), with the paths
        beneath it that children still need (the interpreter, the state directory) bound back in."""
        expose = [p for p in self.exposes if p.startswith(path.rstrip("/") + "/")]
        return {"path": path, "expose": expose, **changes}

    def launch_argv(self, spec: dict[str, Any]) -> list[str]:
        return launch_argv(spec)

    def agent_spec(
        self, slot: Slot, argv: list[str], env: dict[str, str], cwd: str, writable: list[str]
    ) -> dict[str, Any]:
        """`writable[0]`: the session directory, of which the command may write only its workspace/, tmp/
        and shm/ (which become its /tmp and /dev/shm) and read its bin/ and run/ (the judge client, the
        channel's socket): never the directory itself, so it can replace none of them with a link, and
        nothing the judge trusts is in its reach. `writable[1:]`: further directories it may write."""
        hide = [] if self.config.agent_gpu_access else sorted(glob.glob("/dev/nvidia*"))
        limits = self.config.agent_limits
        if self.config.agent_gpu_access:
            # CUDA reserves far more address space than it uses: RLIMIT_AS would break cuInit.
            limits = limits.model_copy(update={"memory_mib": None})
        spec = self._spec(slot.agent_uid, slot.agent_gid, [], argv, env, cwd, limits, self.agent_filter, hide)
        session_dir = writable[0]
        scratch = [f"{session_dir}/{name}" for name in AGENT_WRITABLE_DIRS]
        if self.namespaces:
            masks = self.masks + [self._mask(p) for p in AGENT_HIDDEN_DIRS]
            masks += [self._mask(p, source=f"{session_dir}/{d}") for p, d in self.agent_scratch.items()]
            namespaces = dict.fromkeys(("new_netns", "new_mountns", "new_ipcns", "new_pidns"), True)
            spec |= namespaces | {"new_userns": self.user_namespaces, "masks": masks, "hide": hide}
        # With namespaces too: until the tenth session they got no device, so `> /dev/null` failed.
        readable = [f"{session_dir}/{name}" for name in AGENT_READABLE_DIRS]
        landlock = self._landlock(
            [*scratch, *writable[1:]], readable, devices=list(AGENT_DEVICES), base=self.agent_landlock_read
        )
        return spec | {"landlock": landlock}

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
        groups, limits, env = [self.judge_group], self.config.judge_limits, env | self.judge_env
        spec = self._spec(
            slot.judge_uid, slot.judge_gid, groups, argv, env, cwd, limits, self.judge_filter, []
        )
        if self.namespaces:
            # A PID namespace with its own /proc: candidate code sees no other session's processes, and
            # when the judge (its init) ends, the kernel kills whatever it left. The GPU lock does not
            # care: it tells live tickets by flock, not by pid.
            spec |= {"masks": self.judge_masks, "new_pidns": True}
        if self.user_namespaces:
            # Restricted mode: the same mount, IPC and network namespaces as root mode's judges, inside a
            # user namespace mapping only the server's uid, so candidate code in one session's judge leaves
            # nothing in /dev/shm, /tmp or SysV IPC for another's and reaches no socket but loopback.
            spec |= dict.fromkeys(("new_userns", "new_mountns", "new_ipcns", "new_netns"), True)
        if shared_cache and self.is_root:
            spec["umask"] = 0o007
        landlock = self._landlock(writable, readable, devices=self.judge_devices)
        if landlock is not None:
            # The CUDA driver names the helper threads it starts by writing /proc/self/task/<tid>/comm;
            # refused, cuInit fails ("Error 304: OS call failed", seen on the H200), so restricted mode
            # could not judge on a GPU. The judge's own code may write existing /proc files; candidate
            # code runs only in its workers, whose own Landlock layer allows writes to their directory only.
            landlock["write_files"] = ["/proc"]
        return spec | {"landlock": landlock}

    def _landlock(
        self,
        writable: list[str],
        readable: list[str] | None = None,
        devices: list[str] | None = None,
        base: list[str] | None = None,
    ) -> dict[str, list[str]] | None:
        """`devices`: the /dev entries the child may write; None: all of /dev (judges). `base`: what the
        child may read besides `readable`; None: all but the state directory."""
        if self.is_root:
            return None  # separate uids and 0700 directories already keep sessions apart
        dev = ["/dev"] if devices is None else devices
        read = self.landlock_read if base is None else base
        # The rules below the state directory name the server's own directories: opened without following
        # any link (launcher), so one planted there cannot carry a rule to another session's files.
        state = str(self.config.state_dir).rstrip("/") + "/"
        own = sorted({p for p in [*writable, *(readable or [])] if p.startswith(state)})
        return {"read": [*read, *(readable or [])], "write": [*writable, *dev], "no_symlinks": own}

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
            "new_userns": False,
            "new_netns": root,
            "new_mountns": root,
            "new_ipcns": root,
            "new_pidns": False,
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


def proc_without_pids_or_net() -> list[str]:
    """proc_without_pids less the network namespace's tables: without a network namespace of its own, a
    command's /proc/self/net (and /proc/net, /proc/thread-self/net, /proc/self/task/<tid>/net) lists every
    socket and connection of the pod, every session's judge socket among them. So /proc/self is granted
    entry by entry, without `net` and `task`, and without its links (`cwd`, `exe`, `root`: a rule opened
    through them would land on their targets, `/` for `root`)."""
    whole = {"/proc/self", "/proc/thread-self", "/proc/net"}
    own = [
        f"/proc/self/{entry.name}"
        for entry in os.scandir("/proc/self")
        if entry.name not in ("net", "task") and not entry.is_symlink()
    ]
    return sorted([p for p in proc_without_pids() if p not in whole] + own)


def shared_devices_left_out() -> list[str]:
    """Every /dev entry but the shared scratch places (/dev/shm, /dev/mqueue): what a judge without its own
    mount namespace may write (the GPU's device nodes among them), not a file another judge could read."""
    # Symlinks (/dev/stdout -> /proc/self/fd/1) name no device: a rule would follow them to a pipe.
    left_out = ("shm", "mqueue")
    return sorted(e.path for e in os.scandir("/dev") if e.name not in left_out and not e.is_symlink())


def user_namespaces_usable(setting: str) -> bool:
    """Whether an unprivileged child can build the namespaces agent commands get (a user namespace, then
    PID, IPC, mount and network ones and a /proc of its own): tried once, through the launcher itself.
    Kubernetes' RuntimeDefault and this image's Localhost seccomp profile refuse unshare, and a masked
    /proc refuses a new proc mount; then (setting auto) restricted mode goes on without them."""
    if setting == "off":
        return False
    names = ("new_userns", "new_netns", "new_mountns", "new_ipcns", "new_pidns")
    spec = unconfined_spec(["/bin/true"], {}, "/", **dict.fromkeys(names, True))
    try:
        probe = subprocess.run(launch_argv(spec), capture_output=True, timeout=60, check=False)
        error = probe.stderr.decode(errors="replace").strip() if probe.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        error = str(exc)
    if not error:
        return True
    if setting == "on":
        raise IsolationError(f"--user-namespaces on, but this environment refuses them: {error}")
    log.warning("no user namespaces (%s): agent commands share the pod's PID and IPC namespaces", error)
    return False


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
        "new_userns": False,
        "new_netns": False,
        "new_mountns": False,
        "new_ipcns": False,
        "new_pidns": False,
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


def pids_of_uid(uid: int, zombies: bool = False) -> list[int]:
    """Processes whose real, effective or saved uid is `uid`, from their status files; zombies (killed,
    not yet reaped: nothing left to kill, but still counted by the uid's RLIMIT_NPROC) only if asked."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f if line[:4] in (b"Stat", b"Uid:"))
        except (OSError, ValueError):
            continue  # exited meanwhile
        uids = fields.get(b"Uid", b"").split()[:3]
        zombie = fields.get(b"State", b"").strip().startswith(b"Z")
        if (zombies or not zombie) and str(uid).encode() in uids:
            pids.append(int(name))
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
        new = [p for p in pids_of_uid(uid) if p not in seen]
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
