"""The two seccomp layers: the pod's Localhost profile (JSON) and the server's per-process BPF filter.

The BPF filter is tested by installing it in a child through the real launcher without a user switch,
exactly as restricted mode does, so these tests run as any user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuda_agent.sandbox.server.isolation import launch_argv, unconfined_spec
from cuda_agent.sandbox.server.seccomp_bpf import DENIED_ALWAYS, FilterPolicy, build_filter

PROFILE = Path(__file__).parents[2] / "sandbox_image" / "seccomp" / "sandbox.json"

# What Python, torch, compilers and the CUDA driver need; a profile refusing these breaks the sandbox.
NEEDED = [
    "read",
    "write",
    "openat",
    "mmap",
    "mprotect",
    "munmap",
    "mremap",
    "madvise",
    "ioctl",
    "futex",
    "execve",
    "wait4",
    "pipe2",
    "epoll_wait",
    "eventfd2",
    "memfd_create",
    "getrandom",
    "prctl",
    "rseq",
    "sched_setaffinity",
    "set_robust_list",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "setsid",
    "kill",
    "tgkill",
    "socketpair",
    "get_mempolicy",
    "seccomp",
    "statx",
    "flock",
]
# The pod must also refuse what the inner filter refuses, except signal helpers some runtimes use.
POD_MAY_ALLOW = {"tkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"}


def _allowed_names(profile: dict) -> set[str]:  # type: ignore[type-arg]
    return {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}


def test_profile_is_an_allowlist_that_keeps_cuda_working_and_refuses_escapes() -> None:
    profile = json.loads(PROFILE.read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert set(profile["architectures"]) == {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"}
    allowed = _allowed_names(profile)
    assert set(NEEDED) <= allowed, set(NEEDED) - allowed
    must_refuse = set(DENIED_ALWAYS) - POD_MAY_ALLOW
    assert not must_refuse & allowed, must_refuse & allowed
    denied = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ERRNO" for n in rule["names"]}
    assert {
        "ptrace",
        "mount",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "keyctl",
        "unshare",
        "setns",
    } <= denied


def test_profile_allows_clone_and_sockets_only_with_safe_arguments() -> None:
    rules = json.loads(PROFILE.read_text())["syscalls"]
    clone = [r for r in rules if r["names"] == ["clone"]]
    assert clone[0]["args"][0] == {"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    families = {r["args"][0]["value"] for r in rules if r["names"] == ["socket"]}
    assert families == {1, 2, 10, 16}  # unix, inet, inet6, netlink: no AF_PACKET
    raw = [r for r in rules if r["names"] == ["socket"] and r["args"][1]["valueTwo"] == 3]
    assert [r["args"][0]["value"] for r in raw] == [16]  # raw sockets only for netlink


PROBE = r"""
import ctypes, errno, os, socket, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
protected = int(sys.argv[1])
def sys_err(nr, *args):
    rc = libc.syscall(nr, *args)
    return "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()]
def py_err(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
results = {
    "ptrace": sys_err(101, 16, protected, 0, 0),
    "kill_protected": py_err(lambda: os.kill(protected, 0)),
    "kill_all": py_err(lambda: os.kill(-1, 0)),
    "kill_own_group": py_err(lambda: os.kill(0, 0)),
    "inet": py_err(lambda: socket.socket(socket.AF_INET)),
    "inet6": py_err(lambda: socket.socket(socket.AF_INET6)),
    "unix": py_err(lambda: socket.socket(socket.AF_UNIX).close()),
    "unshare_net": sys_err(272, 0x40000000),
    "mount": sys_err(165, b"none", b"/tmp", b"tmpfs", 0, None),
    "bpf": sys_err(321, 0, 0, 0),
    "io_uring": sys_err(425, 1, 0),
    "clone3": sys_err(435, 0, 0),
}
t = threading.Thread(target=lambda: results.__setitem__("thread", "ok"))
t.start(); t.join()
child = os.fork()
if child == 0:  # not a session leader yet, unlike the probe itself (the launcher starts one)
    os._exit({"ok": 0, "EPERM": 1}.get(py_err(os.setsid), 2))
results["fork"] = "ok"
results["setsid"] = {0: "ok", 1: "EPERM"}.get(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]), "?")
print(__import__("json").dumps(results))
"""


def _run_filtered(policy: FilterPolicy) -> dict[str, str]:
    if os.uname().machine not in ("x86_64",):
        pytest.skip("the probe uses x86_64 syscall numbers")
    argv = [sys.executable, "-c", PROBE, str(os.getpid())]
    spec = unconfined_spec(argv, {"PATH": "/usr/bin:/bin"}, "/", seccomp=build_filter(policy).hex())
    out = subprocess.run(
        launch_argv(spec), capture_output=True, text=True, start_new_session=True, timeout=60, check=True
    )
    return json.loads(out.stdout)


def test_agent_filter_refuses_server_signals_ptrace_network_and_namespaces() -> None:
    r = _run_filtered(FilterPolicy(protected_pids=(os.getpid(),)))
    assert r["ptrace"] == r["kill_protected"] == r["kill_all"] == r["setsid"] == "EPERM"
    assert r["unshare_net"] == r["mount"] == r["bpf"] == r["io_uring"] == "EPERM"
    assert r["inet"] == r["inet6"] == "EACCES"
    assert r["clone3"] == "ENOSYS"
    assert r["unix"] == r["kill_own_group"] == r["thread"] == r["fork"] == "ok"


def test_judge_filter_still_lets_the_judge_start_worker_sessions() -> None:
    r = _run_filtered(FilterPolicy(deny_new_session=False, protected_pids=(os.getpid(),)))
    assert r["setsid"] == "ok" and r["ptrace"] == "EPERM" and r["inet"] == "EACCES"


def test_filter_rejects_unknown_architectures() -> None:
    with pytest.raises(ValueError, match="no seccomp syscall table"):
        build_filter(FilterPolicy(), arch="riscv64")
    assert len(build_filter(FilterPolicy(), arch="aarch64")) % 8 == 0


HIDE_PROBE = r"""
import json, os, sys
directory, file = sys.argv[1], sys.argv[2]
result = {"dir_listing": None, "file_text": None}
try:
    result["dir_listing"] = os.listdir(directory)
except OSError as exc:
    result["dir_listing"] = type(exc).__name__
with open(file) as handle:
    result["file_text"] = handle.read()
print(json.dumps(result))
"""


def test_hidden_device_paths_may_be_directories(tmp_path: Path) -> None:
    """GPU hosts have /dev/nvidia-caps, a directory, next to the /dev/nvidia* files: both are hidden."""
    if os.geteuid() != 0:
        pytest.skip("mount namespaces need root")
    caps = tmp_path / "nvidia-caps"
    caps.mkdir()
    (caps / "nvidia-cap1").write_text("secret")
    node = tmp_path / "nvidia0"
    node.write_text("device")
    spec = unconfined_spec(
        [sys.executable, "-c", HIDE_PROBE, str(caps), str(node)],
        {"PATH": "/usr/bin:/bin"},
        "/",
        new_mountns=True,
        hide=[str(caps), str(node)],
    )
    out = subprocess.run(launch_argv(spec), capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["dir_listing"] in ([], "PermissionError")  # root may list the empty tmpfs; nothing leaks
    assert seen["file_text"] == ""
    assert (caps / "nvidia-cap1").read_text() == "secret"  # the server's own view is unchanged
