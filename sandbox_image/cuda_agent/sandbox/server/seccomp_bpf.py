"""The per-process seccomp filter the server installs on every agent command and judge run.

The pod's Localhost profile (sandbox_image/seccomp/sandbox.json) is the outer wall and applies to the
server too; this filter is the inner one, stricter, and is what protects the server when no user switch
is possible (restricted pod): agent code then runs under the server's uid, so the filter refuses the calls
that would reach the server (signals to its pid, ptrace, reading another process's memory) plus the
network and namespace escapes. Built here as raw classic BPF, so no libseccomp is needed; numbers come
from the kernel's unistd headers (x86_64: asm/unistd_64.h, aarch64: asm-generic/unistd.h).
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# Syscalls refused outright. Names are shared by both tables below.
DENIED_ALWAYS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open", "pidfd_getfd",
    "pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "tkill",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",  # io_uring ops bypass seccomp checks
    "open_by_handle_at", "swapon", "swapoff", "reboot", "acct", "syslog", "quotactl",
    "fanotify_init", "settimeofday", "clock_settime", "adjtimex", "sethostname", "setdomainname",
    "vhangup", "lookup_dcookie",
)  # fmt: skip
# Agent commands may not leave their process group, so a timeout or session end kills all of them.
DENIED_FOR_AGENT = ("setsid", "setpgid")
# System V IPC objects live in the IPC namespace, outside every workspace and past every session: refused
# wherever the child cannot get an IPC namespace of its own.
SYSV_IPC = (
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop",
    "msgget", "msgsnd", "msgrcv", "msgctl",
)  # fmt: skip

SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "socket": 41, "clone": 56, "kill": 62, "ptrace": 101, "syslog": 103, "setpgid": 109,
        "setsid": 112, "rt_sigqueueinfo": 129, "vhangup": 153, "pivot_root": 155, "adjtimex": 159,
        "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "init_module": 175,
        "delete_module": 176, "quotactl": 179, "tkill": 200, "lookup_dcookie": 212,
        "clock_settime": 227, "tgkill": 234, "kexec_load": 246, "add_key": 248, "request_key": 249,
        "keyctl": 250, "unshare": 272, "rt_tgsigqueueinfo": 297, "perf_event_open": 298,
        "fanotify_init": 300, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
        "userfaultfd": 323, "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
        "mount_setattr": 442, "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65,
        "semctl": 66, "shmdt": 67, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
        "semtimedop": 220,
    },
    "aarch64": {
        "lookup_dcookie": 18, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51, "vhangup": 58,
        "quotactl": 60, "acct": 89, "unshare": 97, "kexec_load": 104, "init_module": 105,
        "delete_module": 106, "clock_settime": 112, "syslog": 116, "ptrace": 117, "kill": 129,
        "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "reboot": 142, "setpgid": 154,
        "setsid": 157, "sethostname": 161, "setdomainname": 162, "settimeofday": 170, "adjtimex": 171,
        "socket": 198, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220, "swapon": 224,
        "swapoff": 225, "rt_tgsigqueueinfo": 240, "perf_event_open": 241, "fanotify_init": 262,
        "open_by_handle_at": 265, "setns": 268, "process_vm_readv": 270, "process_vm_writev": 271,
        "kcmp": 272, "finit_module": 273, "bpf": 280, "userfaultfd": 282, "kexec_file_load": 294,
        "pidfd_send_signal": 424, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
        "fsmount": 432, "fspick": 433, "pidfd_open": 434, "clone3": 435, "pidfd_getfd": 438,
        "mount_setattr": 442, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190,
        "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196,
        "shmdt": 197,
    },
}  # fmt: skip

AF_INET, AF_INET6, AF_NETLINK, AF_PACKET = 2, 10, 16, 17
CLONE_NAMESPACE_FLAGS = (
    0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x02000000
)

# Classic BPF opcodes and seccomp return actions (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
# seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]. Args are read by their low 32 bits (little endian).
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16
X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class FilterPolicy:
    """What one filter refuses. `protected_pids` may not be signalled (the server, its process group)."""

    deny_network: bool = True
    deny_new_session: bool = True
    deny_sysv_ipc: bool = False
    # Netlink's sock_diag lists every socket of the network namespace (with the pod's: every session's
    # judge socket path): refused where the child shares the pod's network namespace.
    deny_netlink: bool = False
    protected_pids: tuple[int, ...] = ()


class _Program:
    """A tiny assembler: forward jumps to labels, resolved once the program is complete."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, str | int, str | int, int]] = []
        self.labels: dict[str, int] = {}

    def stmt(self, code: int, k: int) -> None:
        self.ops.append((code, 0, 0, k))

    def jump(self, code: int, k: int, jt: str | int, jf: str | int) -> None:
        self.ops.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ops)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (code, jt, jf, k) in enumerate(self.ops):
            jt_off = self._offset(index, jt)
            jf_off = self._offset(index, jf)
            out += struct.pack("<HBBI", code, jt_off, jf_off, k & 0xFFFFFFFF)
        return bytes(out)

    def _offset(self, index: int, target: str | int) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - index - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"seccomp filter jump to {target!r} out of range ({offset})")
        return offset


def build_filter(policy: FilterPolicy, arch: str | None = None) -> bytes:
    """The filter as packed `struct sock_filter` records, ready for PR_SET_SECCOMP."""
    arch = arch or platform.machine()
    if arch not in SYSCALLS:
        raise ValueError(f"no seccomp syscall table for architecture {arch!r}")
    nr = SYSCALLS[arch]
    denied = list(DENIED_ALWAYS) + (list(DENIED_FOR_AGENT) if policy.deny_new_session else [])
    denied += list(SYSV_IPC) if policy.deny_sysv_ipc else []
    p = _Program()
    p.stmt(_LD_W_ABS, _OFF_ARCH)
    p.jump(_JEQ_K, AUDIT_ARCH[arch], 0, "kill")
    p.stmt(_LD_W_ABS, _OFF_NR)
    if arch == "x86_64":
        p.jump(_JGE_K, X32_SYSCALL_BIT, "eperm", 0)
    for name in denied:
        p.jump(_JEQ_K, nr[name], "eperm", 0)
    # glibc falls back from clone3 to clone on ENOSYS, and clone's flags can be inspected.
    p.jump(_JEQ_K, nr["clone3"], "enosys", 0)
    p.jump(_JEQ_K, nr["clone"], "clone", 0)
    p.jump(_JEQ_K, nr["kill"], "signal_target", 0)
    p.jump(_JEQ_K, nr["tgkill"], "signal_target", 0)
    if policy.deny_network:
        p.jump(_JEQ_K, nr["socket"], "socket", 0)
    p.stmt(_RET_K, RET_ALLOW)

    p.label("clone")
    p.stmt(_LD_W_ABS, _OFF_ARG0)
    p.jump(_JSET_K, CLONE_NAMESPACE_FLAGS, "eperm", 0)
    p.stmt(_RET_K, RET_ALLOW)

    # kill(pid)/tgkill(tgid): pid_t is 32-bit, so the low word decides. -1 is "every process I may signal".
    p.label("signal_target")
    p.stmt(_LD_W_ABS, _OFF_ARG0)
    p.jump(_JEQ_K, 0xFFFFFFFF, "eperm", 0)
    for pid in policy.protected_pids:
        p.jump(_JEQ_K, pid, "eperm", 0)
        p.jump(_JEQ_K, (-pid) & 0xFFFFFFFF, "eperm", 0)
    p.stmt(_RET_K, RET_ALLOW)

    if policy.deny_network:
        p.label("socket")
        p.stmt(_LD_W_ABS, _OFF_ARG0)
        for family in (AF_INET, AF_INET6, AF_PACKET, *([AF_NETLINK] if policy.deny_netlink else [])):
            p.jump(_JEQ_K, family, "eacces", 0)
        p.stmt(_RET_K, RET_ALLOW)

    p.label("eacces")
    p.stmt(_RET_K, RET_ERRNO | errno.EACCES)
    p.label("eperm")
    p.stmt(_RET_K, RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.stmt(_RET_K, RET_ERRNO | errno.ENOSYS)
    p.label("kill")
    p.stmt(_RET_K, RET_KILL_PROCESS)
    return p.assemble()
