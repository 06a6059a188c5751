"""The judge's own confinement, needing no privileges: non-dumpable judge, Landlock-confined worker,
private copies.

In a restricted pod (non-root, no capabilities) the judge cannot switch users or create namespaces, but it
can (1) mark itself non-dumpable so same-UID code cannot ptrace it or open /proc/<pid>/mem, (2) confine
the worker with Landlock so candidate code can write only to its private directory, open no TCP
connection and signal nothing outside itself, and (3) run the candidate from a read-only private copy.
Each step reports what it achieved; an older kernel degrades the report, never the judging.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.api.judge_files import JUDGE_OUTSIDE_PROC_ENV, JUDGE_USER

PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# Write-side filesystem rights (reads and execution stay allowed everywhere).
FS_WRITE_FILE = 1 << 1
FS_READ_FILE, FS_READ_DIR = 1 << 2, 1 << 3
FS_WRITE_RIGHTS_V1 = (1 << 1) | (1 << 4) | (1 << 5) | sum(1 << b for b in range(6, 13))
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14
# The rights a rule may grant on a file (the rest only make sense beneath a directory): execute, write,
# read, truncate, ioctl on devices.
FILE_RIGHTS = (1 << 0) | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | (1 << 15)
NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

MAX_CANDIDATE_FILES = 2000
MAX_CANDIDATE_BYTES = 64 << 20
# Environment variables the worker inherits; everything else (tokens, judge settings) is dropped.
ENV_PASSTHROUGH = (
    "PATH",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
    "CC",
    "CXX",
    "TRITON_PTXAS_PATH",
    "TRITON_LIBCUDA_PATH",
    # Task files may size their inputs from it (examples/tasks/README.md); the worker regenerates the
    # orchestrator's inputs, so both must read the same value. It carries no secret.
    "CUDA_AGENT_TASK_SCALE",
    JUDGE_OUTSIDE_PROC_ENV,  # paths, no secret: read by hide_processes before candidate code
)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def make_non_dumpable() -> str:
    """PR_SET_DUMPABLE=0: same-UID processes can no longer ptrace us or read /proc/<pid>/{mem,fd,environ}."""
    try:
        rc = _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    except (OSError, AttributeError) as exc:
        return f"unavailable: {exc}"
    return "on" if rc == 0 else f"failed: errno {ctypes.get_errno()}"


def no_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def landlock_abi() -> int:
    try:
        abi = _libc().syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            None,
            ctypes.c_size_t(0),
            ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
        )
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))


def confine_writes(writable: list[Path], devices: list[Path]) -> str:
    """Landlock the calling process (and its future children): writes only beneath `writable`, file
    writes (no creation) beneath `devices`, no TCP bind/connect, no signals or abstract sockets outward."""
    abi = landlock_abi()
    if abi < 1:
        return "unavailable: kernel without Landlock"
    fs_rights = FS_WRITE_RIGHTS_V1 | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    file_rights = FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0)
    rules = [*((p, fs_rights) for p in writable), *((p, file_rights) for p in devices)]
    attr = _RulesetAttr(
        fs_rights,
        (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0,
    )
    error = _restrict_self(attr, 24 if abi >= 6 else 16 if abi >= 4 else 8, rules)
    if error:
        return f"failed: {error}"
    parts = [f"abi {abi}: writes only to the private dir"]
    if abi >= 4:
        parts.append("no TCP")
    if abi >= 6:
        parts.append("no signals or abstract sockets outward")
    return "on (" + ", ".join(parts) + ")"


def hide_processes() -> str:
    """A Landlock layer under which the caller (and its children) read everything but the other
    processes' /proc/<pid>: the judge's and the server's, and in a pod without PID namespaces every other
    session's command lines. Applied before candidate code, after CUDA and the trusted compile started."""
    if landlock_abi() < 1:
        return "unavailable: kernel without Landlock"
    listed = os.environ.get(JUDGE_OUTSIDE_PROC_ENV)
    try:
        outside = listed.split(os.pathsep) if listed else readable_outside(Path("/proc"))
    except OSError as exc:  # an outer Landlock layer that does not let this process list /
        return f"failed: cannot list the tree outside /proc ({exc}) and ${JUDGE_OUTSIDE_PROC_ENV} is unset"
    reads = FS_READ_FILE | FS_READ_DIR
    rules = [(Path(p), reads) for p in (*outside, *proc_without_pids())]
    error = _restrict_self(_RulesetAttr(reads, 0, 0), 8, rules)
    return f"failed: {error}" if error else "on (no /proc/<pid> but its own)"


def _restrict_self(attr: _RulesetAttr, size: int, rules: list[tuple[Path, int]]) -> str:
    """One Landlock layer: the rules' rights beneath each existing path (directory-only rights dropped on
    files), then no_new_privs and restrict_self. Returns "" or what failed."""
    libc = _libc()
    ruleset = libc.syscall(
        SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)
    )
    if ruleset < 0:
        return f"create_ruleset errno {ctypes.get_errno()}"
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # absent (or vanished since listed): nothing to allow
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= FILE_RIGHTS
                rule = _PathBeneathAttr(rights, fd)
                rc = libc.syscall(
                    SYS_LANDLOCK_ADD_RULE,
                    ctypes.c_int(ruleset),
                    ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                if rc < 0:
                    return f"add_rule {path} errno {ctypes.get_errno()}"
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"no_new_privs errno {ctypes.get_errno()}"
        if libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            return f"restrict_self errno {ctypes.get_errno()}"
    finally:
        os.close(ruleset)
    return ""


def readable_outside(*hidden: Path) -> list[str]:
    """Every path beside the ways from / to each of `hidden`: together, all of the tree except them."""
    targets = {h.resolve() for h in hidden}
    ancestors = {parent for target in targets for parent in target.parents}
    roots: list[str] = []
    pending = [Path("/")]
    while pending:  # only the ancestors of hidden paths are opened: a handful of directories
        current = pending.pop()
        for entry in sorted(os.scandir(current), key=lambda e: e.name):
            path = Path(entry.path)
            if path in ancestors:
                pending.append(path)
            elif path not in targets:
                roots.append(entry.path)
    return sorted(roots)


def proc_without_pids() -> list[str]:
    """/proc's system-wide entries (cpuinfo, meminfo, sys, driver...) and `self`, opened by the process
    that builds the rules, so that it reads its own /proc/<pid> and no other: hidepid for one process
    (the launcher opens them before it execs the command). Its children read no /proc/<pid> at all."""
    return sorted(f"/proc/{name}" for name in os.listdir("/proc") if not name.isdigit())


@dataclass
class Workspace:
    """One judge run's private directory: the sealed candidate copy, the worker's home and its log."""

    root: Path
    candidate: Path
    home: Path
    log: Path

    def cleanup(self) -> None:
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    os.chmod(path, stat.S_IRWXU)
        shutil.rmtree(self.root, ignore_errors=True)


def make_workspace(candidate: Path) -> Workspace:
    root = Path(tempfile.mkdtemp(prefix="cuda-agent-judge-"))
    os.chmod(root, 0o700)
    workspace = Workspace(root=root, candidate=root / "cand", home=root / "home", log=root / "candidate.log")
    workspace.home.mkdir()
    workspace.log.touch()
    workspace.candidate.mkdir()
    if candidate.is_file():
        shutil.copyfile(candidate, workspace.candidate / "model_new.py")
    else:
        _copy_tree(candidate, workspace.candidate)
    return workspace


def _copy_tree(src: Path, dst: Path) -> None:
    """Regular files and directories only: links (which could point at judge files) are not followed."""
    count = total = 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        dirnames[:] = [
            d
            for d in dirnames
            if not d.startswith((".git", "__pycache__")) and not os.path.islink(os.path.join(dirpath, d))
        ]
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            path = Path(dirpath, name)
            if path.is_symlink() or not path.is_file():
                continue
            count += 1
            total += path.stat().st_size
            if count > MAX_CANDIDATE_FILES or total > MAX_CANDIDATE_BYTES:
                raise ValueError(
                    f"candidate directory {src} is too large (> {MAX_CANDIDATE_FILES} files or 64 MiB)"
                )
            shutil.copyfile(path, dst / rel / name)


def seal(path: Path) -> None:
    """Read-only for everyone (a non-root worker cannot edit what was screened and built)."""
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o555)
    os.chmod(path, 0o555)


def worker_env(workspace: Workspace, device: str) -> dict[str, str]:
    """A scrubbed environment: only what CUDA and the toolchain need, caches inside the private home."""
    env = {k: os.environ[k] for k in ENV_PASSTHROUGH if k in os.environ}
    home = str(workspace.home)
    env.update(
        HOME=home,
        TMPDIR=home,
        USER=JUDGE_USER,
        LOGNAME=JUDGE_USER,
        LANG="C.UTF-8",
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        TORCH_EXTENSIONS_DIR=os.path.join(home, "torch_extensions"),
        TORCHINDUCTOR_CACHE_DIR=os.path.join(home, "inductor"),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        TRITON_CACHE_DIR=os.path.join(home, "triton"),
        TRITON_HOME=home,
        CUDA_CACHE_PATH=os.path.join(home, "nv"),
        XDG_CACHE_HOME=os.path.join(home, "cache"),
    )
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if device == "cpu":
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def cuda_host() -> bool:
    """A CUDA build of torch on a machine with an NVIDIA driver, decided without any CUDA call (a driver
    query would make torch refuse CUDA in every process forked afterwards)."""
    import torch

    return torch.version.cuda is not None and os.path.exists("/dev/nvidiactl")


def close_inherited_fds(keep: tuple[int, ...] = ()) -> None:
    """Close every descriptor above stderr except `keep`: a forked child starts with its parent's."""
    for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
        if fd > 2 and fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def adopt_environment(env: dict[str, str]) -> None:
    """Replace this forked process's environment with `env`, as if it had been exec'd with it; the temp
    directory, which the parent may have cached from its own TMPDIR, is recomputed."""
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None
