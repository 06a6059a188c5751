"""Runs in the child between fork and the agent's (or judge's) program: isolate, drop privileges, exec.

Started as `python -I -S launcher.py SPEC` by the server (never imported), single-threaded, so every step
here is fork-safe, unlike a preexec_fn inside the multi-threaded server. SPEC is the hex of a `marshal`ed
dict: marshal is built in, while importing json (and re) would double this process's startup time. The
order matters: namespaces and mounts need the server's privileges (or, restricted, a user namespace), so
they come first; with a PID namespace the launcher forks once and waits as the command's parent; rlimits,
then the user switch; no_new_privs and the seccomp filter last, because after them nothing can be undone.
Any failure exits 126 with one line naming the step, so a tool result says why nothing ran.
"""

import ctypes
import marshal
import os
import resource
import sys
from typing import Any

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
AF_INET, SOCK_DGRAM, SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 2, 2, 0x8913, 0x8914, 0x1
SIGKILL = 9

_libc = ctypes.CDLL(None, use_errno=True)


# Landlock (same numbers on x86_64 and aarch64): filesystem rights by ABI version.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
LL_FILE_RIGHTS = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | (1 << 14) | (1 << 15)  # + truncate, ioctl_dev
LL_SCOPE_ABSTRACT_UNIX, LL_SCOPE_SIGNAL = 1 << 0, 1 << 1
LL_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}


SYS_OPENAT2, AT_FDCWD, RESOLVE_NO_SYMLINKS, ELOOP, ENOSYS = 437, -100, 0x04, 40, 38


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else s.encode()

    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _loopback_up() -> None:
    # A fresh network namespace has only `lo`, and it is down; tests inside the sandbox may want it.
    # struct ifreq: char name[16]; short flags; (padded to 40 bytes). Raw libc keeps `socket` unimported.
    fd = _libc.socket(AF_INET, SOCK_DGRAM, 0)
    if fd < 0:
        _check(-1, "socket")
    try:
        ifr = ctypes.create_string_buffer(b"lo", 40)
        _check(min(0, _libc.ioctl(fd, SIOCGIFFLAGS, ifr)), "SIOCGIFFLAGS")
        flags = ctypes.c_short.from_buffer(ifr, 16)
        flags.value |= IFF_UP
        _check(min(0, _libc.ioctl(fd, SIOCSIFFLAGS, ifr)), "SIOCSIFFLAGS")
    finally:
        os.close(fd)


def _enter_user_namespace() -> None:
    """Restricted mode: an unprivileged user namespace mapping only our own uid and gid, so that the
    PID, IPC, mount and network namespaces that follow can be created without privileges. Capabilities
    held inside it are lost at exec (the mapped uid is not 0), and seccomp refuses a second one."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _become_pid_namespace_init() -> None:
    """After unshare(CLONE_NEWPID) only children enter the new namespace: fork, and let this process
    wait and exit as its child did. The child is the namespace's init; when it ends, the kernel kills
    everything left in the namespace, so nothing a command starts can outlive it."""
    server = os.getppid()
    pid = os.fork()
    if pid == 0:
        return
    # The child's own death signal will point at us: we in turn must die with the server.
    _check(_libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != server:  # it is already gone
        os.kill(pid, SIGKILL)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # die of the same signal (SIG_DFL first: Python handles SIGINT, ignores SIGPIPE)
        _libc.signal(-code, 0)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _scatter_pids() -> None:
    """Start this PID namespace's pids at a random place. Programs name temporary files by pid (inductor's
    cache writes `.<pid>.<thread>.tmp` beside its entries); judges sharing a cache would otherwise count
    alike from 2 and write the same file. Best effort: a read-only /proc/sys leaves pids from 2."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            span = max(1, int(f.read()) // 2)
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(300 + int.from_bytes(os.urandom(4), "little") % span))
    except (OSError, ValueError):
        pass


def _mask_paths(masks: list[dict[str, Any]], hide: list[str], new_proc: bool) -> None:
    """Cover each mask path with its `source` bound over it (a session's own /tmp, say) or with an empty
    tmpfs, bind its `expose` subpaths back in, mount a /proc of the child's PID namespace, hide devices."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    for mask in masks:
        if not os.path.isdir(mask["path"]):
            continue
        # O_PATH fds keep the covered directories reachable after the tmpfs hides them.
        keep = [(p, os.open(p, os.O_PATH | os.O_CLOEXEC)) for p in mask["expose"] if os.path.isdir(p)]
        source = mask.get("source")
        if source:
            src = os.open(source, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            _mount(f"/proc/self/fd/{src}", mask["path"], None, MS_BIND, None)
            os.close(src)
        else:
            size = mask.get("size_kib", 64)
            _mount(
                "tmpfs",
                mask["path"],
                "tmpfs",
                MS_NOSUID | MS_NODEV,
                f"mode={mask.get('mode', '0755')},size={size}k",
            )
        for path, fd in keep:
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
            os.close(fd)
    if new_proc:
        # Only this PID namespace's processes: no other session's (or the host's) command lines.
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    for path in hide:
        # /dev/nvidia-caps is a directory on GPU hosts: a file cannot be bound over it, an empty tmpfs can.
        if os.path.isdir(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "mode=000,size=4k")
        elif os.path.exists(path):
            _mount("/dev/null", path, None, MS_BIND, None)


def _open_rule_path(path: str, no_symlinks: bool) -> int:
    """An O_PATH fd for a Landlock rule. `no_symlinks`: no component of the path may be a symbolic link
    (openat2 RESOLVE_NO_SYMLINKS): a path below the state directory that an agent had replaced with a
    link would otherwise move the rule, and everything it grants, onto the link's target."""
    flags = os.O_PATH | os.O_CLOEXEC
    if not no_symlinks:
        return os.open(path, flags)
    how = _OpenHow(flags, 0, RESOLVE_NO_SYMLINKS)
    fd = _libc.syscall(SYS_OPENAT2, ctypes.c_int(AT_FDCWD), path.encode(), ctypes.byref(how),
                       ctypes.c_size_t(ctypes.sizeof(how)))  # fmt: skip
    if fd >= 0:
        return int(fd)
    err = ctypes.get_errno()
    if err != ENOSYS:
        raise OSError(err, os.strerror(err), path)
    # Kernels before 5.6 (none of them has Landlock either): walk the components without following.
    fd = os.open("/", flags | os.O_DIRECTORY)
    try:
        for part in [p for p in path.split("/") if p]:
            nxt = os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if os.fstat(fd).st_mode & 0o170000 == 0o120000:  # S_IFLNK
                raise OSError(ELOOP, os.strerror(ELOOP), path)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _landlock(
    read: list[str],
    write: list[str],
    write_files: list[str] | tuple[str, ...] = (),
    no_symlinks: list[str] | tuple[str, ...] = (),
) -> None:
    """Confine the filesystem view: read-only beneath `read`, everything beneath `write`, reading and
    writing existing files (no creation, no ioctl) beneath `write_files`, nothing else. Rule paths in
    `no_symlinks` (the server's own directories below the state directory) are refused if any component
    is a symbolic link.

    Restricted mode runs every session under one uid, so this is what keeps one session out of another's
    workspace (and out of judge snapshots). Kernels without Landlock run unconfined (reported at startup).
    """
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return
    handled = LL_RIGHTS_BY_ABI.get(abi, (1 << 16) - 1)
    # ABI 6 scopes signals and abstract Unix sockets to the domain: one command cannot signal
    # another session's processes (or the server) even under the same uid.
    attr = (ctypes.c_uint64 * 3)(handled, 0, LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 8
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, attr, ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        update = (LL_READ_FILE | LL_READ_DIR | LL_WRITE_FILE | (1 << 14)) & handled  # + truncate
        for paths, rights in (
            (read, LL_EXECUTE | LL_READ_FILE | LL_READ_DIR),
            (write, handled),
            (write_files, update),
        ):
            for path in paths:
                try:
                    fd = _open_rule_path(path, path in no_symlinks)
                except OSError as exc:
                    if exc.errno == ELOOP:
                        raise OSError(ELOOP, f"landlock rule for {path}: a symbolic link") from None
                    continue  # vanished since the server listed it
                try:
                    is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
                    allowed = rights if is_dir else rights & LL_FILE_RIGHTS & handled
                    rule = _PathBeneath(allowed, fd)
                    rc = _libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1),
                                       ctypes.byref(rule), ctypes.c_uint32(0))  # fmt: skip
                    _check(min(0, rc), f"landlock rule for {path}")
                finally:
                    os.close(fd)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        _check(min(0, _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))),
               "landlock_restrict_self")  # fmt: skip
    finally:
        os.close(ruleset)


def _install_seccomp(program: bytes) -> None:
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
    buf = ctypes.create_string_buffer(program)
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp filter")


class ConfineError(Exception):
    """One confinement step failed; the message names it."""


def confine(spec: dict[str, Any]) -> None:
    """Every step but the exec (also run by the judge zygote in each forked judge, then no exec)."""
    step = "namespaces"
    try:
        if spec.get("new_userns"):
            _enter_user_namespace()
        flags = (CLONE_NEWNET if spec["new_netns"] else 0) | (CLONE_NEWNS if spec["new_mountns"] else 0)
        flags |= (CLONE_NEWIPC if spec.get("new_ipcns") else 0) | (
            CLONE_NEWPID if spec.get("new_pidns") else 0
        )
        if flags:
            _check(_libc.unshare(flags), "unshare")
        if spec.get("new_pidns"):
            step = "PID namespace"
            _become_pid_namespace_init()
        if spec["new_netns"]:
            step = "loopback"
            _loopback_up()
        if spec["new_mountns"]:
            step = "mounts"
            _mask_paths(spec["masks"], spec["hide"], bool(spec.get("new_pidns")))
        if spec.get("new_pidns"):
            _scatter_pids()
        step = "oom_score_adj"
        if spec.get("oom_score_adj") is not None:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(spec["oom_score_adj"]))
        step = "rlimits"
        for name, (soft, hard) in spec["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (soft, hard))
        step = "user switch"
        if spec["uid"] is not None:
            os.setgroups(spec["groups"])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        step = "parent-death signal"
        _check(_libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
        step = "landlock"
        if spec.get("landlock"):
            rules = spec["landlock"]
            extra = (rules.get("write_files", ()), rules.get("no_symlinks", ()))
            _landlock(rules["read"], rules["write"], *extra)
        step = "seccomp"
        if spec.get("seccomp"):
            _install_seccomp(bytes.fromhex(spec["seccomp"]))
        step = "chdir"
        os.chdir(spec["cwd"])
        os.umask(spec["umask"])
    except Exception as exc:
        raise ConfineError(f"{step} failed: {exc}") from None


def launch(spec: dict[str, Any]) -> None:
    try:
        confine(spec)
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except ConfineError as exc:  # any failure becomes one readable line
        message = str(exc)
    except Exception as exc:
        message = f"exec failed: {exc}"
    sys.stderr.write(f"sandbox launcher: {message}\n")
    sys.stderr.flush()
    os._exit(126)


if __name__ == "__main__":
    launch(marshal.loads(bytes.fromhex(sys.argv[1])))
