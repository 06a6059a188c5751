"""The two seccomp layers: the pod's Localhost profile (JSON) and the server's per-process BPF filter.

The BPF filter is tested by installing it in a child through the real launcher without a user switch,
exactly as restricted mode does, so these tests run as any user.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import FAKE_JUDGE, FAKE_JUDGE_DIR, REAL_JUDGE_DIR, TASK, state_root

from cuda_agent.sandbox.client import SyncSandboxClient
from cuda_agent.sandbox.server import launcher
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
    results: dict[str, str] = json.loads(out.stdout)
    return results


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


# --- The Localhost profile variant for pools with spec.security.userNamespaces: Required -----------------

USERNS_PROFILE = PROFILE.with_name("sandbox-userns.json")
# What the launcher unshares (launcher.confine) and the mount flags it uses (launcher._mask_paths).
LAUNCHER_NAMESPACES = (
    launcher.CLONE_NEWUSER | launcher.CLONE_NEWPID | launcher.CLONE_NEWIPC | launcher.CLONE_NEWNS
) | launcher.CLONE_NEWNET
LAUNCHER_MOUNT_FLAGS = (launcher.MS_RDONLY | launcher.MS_NOSUID | launcher.MS_NODEV | launcher.MS_NOEXEC) | (
    launcher.MS_BIND | launcher.MS_REC | launcher.MS_PRIVATE
)


def _only_bits(index: int, allowed: int) -> dict[str, int | str]:
    # 32-bit masks: Helm reads the profile's numbers as float64 (exact below 2^53); the kernel refuses
    # unknown high bits of unshare's flags (EINVAL), and mount's high bits mean nothing.
    return {"index": index, "value": 0xFFFFFFFF & ~allowed, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}


def userns_profile(base: dict) -> dict:  # type: ignore[type-arg]
    """The base profile plus what the launcher needs to build an agent command's namespaces inside the
    pod's user namespace: `unshare` of exactly the five namespaces it creates and `mount` with exactly
    the flags it uses. Everything else stays as it is: setns, umount2, pivot_root, the new mount API and
    clone with namespace flags are still refused, and the agent filter refuses both calls to agent code."""
    opened = {"unshare", "mount"}
    rules = []
    for rule in base["syscalls"]:
        if rule["action"] == "SCMP_ACT_ERRNO" and opened & set(rule["names"]):
            rule = {**rule, "names": [n for n in rule["names"] if n not in opened]}
        rules.append(rule)
        if rule["names"] == ["clone"]:
            rules += [
                {
                    "names": ["unshare"],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [_only_bits(0, LAUNCHER_NAMESPACES)],
                    "comment": "user, PID, IPC, mount and network namespaces only (the launcher's)",
                },
                {
                    "names": ["mount"],
                    "action": "SCMP_ACT_ALLOW",
                    "args": [_only_bits(3, LAUNCHER_MOUNT_FLAGS)],
                    "comment": "bind, tmpfs and proc mounts and private propagation only (no remount, "
                    "move or shared); the kernel allows them only in a mount namespace of the command's "
                    "own user namespace",
                },
            ]
    return {**base, "syscalls": rules}


def _rule_key(rule: dict) -> str:  # type: ignore[type-arg]
    return json.dumps({k: v for k, v in rule.items() if k != "comment"}, sort_keys=True)


def test_userns_profile_is_the_base_plus_the_launchers_namespaces_and_mounts_only() -> None:
    base, variant = json.loads(PROFILE.read_text()), json.loads(USERNS_PROFILE.read_text())
    assert variant == userns_profile(base), "stale: `python tests/sandbox/test_seccomp.py` rewrites it"
    # Still an allowlist refusing by default, on the same architectures.
    assert {k: v for k, v in variant.items() if k != "syscalls"} == {
        k: v for k, v in base.items() if k != "syscalls"
    }
    # The only new permissions: two argument-filtered rules; every other rule as in the base.
    added = [r for r in variant["syscalls"] if _rule_key(r) not in {_rule_key(b) for b in base["syscalls"]}]
    changed_denials = [r for r in added if r["action"] == "SCMP_ACT_ERRNO"]
    assert [r["names"] for r in added if r["action"] == "SCMP_ACT_ALLOW"] == [["unshare"], ["mount"]]
    assert all(r["args"] for r in added if r["action"] == "SCMP_ACT_ALLOW")
    (denials,) = changed_denials
    (base_denials,) = [b for b in base["syscalls"] if b.get("comment") == denials.get("comment")]
    assert set(base_denials["names"]) - set(denials["names"]) == {"unshare", "mount"}
    assert _allowed_names(variant) - _allowed_names(base) == {"unshare", "mount"}
    refused = set(denials["names"])
    assert {"setns", "umount2", "pivot_root", "fsopen", "open_tree", "move_mount", "mount_setattr"} <= refused
    assert {"ptrace", "bpf", "keyctl", "userfaultfd", "io_uring_setup", "init_module"} <= refused
    # unshare: exactly the launcher's five (no cgroup, UTS or time namespace; no CLONE_FS/FILES tricks).
    (unshare,) = [r for r in added if r["names"] == ["unshare"]]
    mask = unshare["args"][0]["value"]
    assert 0xFFFFFFFF & ~mask == 0x78020000  # NEWNS | NEWIPC | NEWUSER | NEWPID | NEWNET
    (mount,) = [r for r in added if r["names"] == ["mount"]]
    assert mount["args"][0]["index"] == 3 and 0xFFFFFFFF & ~mount["args"][0]["value"] == 0x4500F
    # clone keeps refusing namespace flags: the launcher uses unshare, never clone, to create them.
    (clone,) = [r for r in variant["syscalls"] if r["names"] == ["clone"]]
    assert clone["args"][0]["value"] == 0x7E020000


def test_chart_ships_both_profiles() -> None:
    chart = PROFILE.parents[2] / "charts" / "cuda-agent" / "files" / "seccomp"
    for profile in (PROFILE, USERNS_PROFILE):
        assert (chart / profile.name).read_text() == profile.read_text()


if __name__ == "__main__":
    USERNS_PROFILE.write_text(json.dumps(userns_profile(json.loads(PROFILE.read_text())), indent=2) + "\n")


# Loads an OCI/Docker seccomp profile into libseccomp as runc and crun do (a rule whose action is the
# default is skipped, unknown names are ignored), then execs the rest of argv under it.
OCI_LOADER = r"""
import ctypes, json, os, sys
lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
lib.seccomp_init.restype = ctypes.c_void_p
class Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]
OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
       "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}
def action(name, errno_ret):
    return 0x7FFF0000 if name == "SCMP_ACT_ALLOW" else 0x00050000 | (errno_ret & 0xFFFF)
profile = json.load(open(sys.argv[1]))
default = action(profile["defaultAction"], profile.get("defaultErrnoRet", 1))
ctx = ctypes.c_void_p(lib.seccomp_init(ctypes.c_uint32(default)))
for rule in profile["syscalls"]:
    act = action(rule["action"], rule.get("errnoRet", 1))
    if act == default:
        continue
    args = rule.get("args") or []
    cmps = [Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in args]
    array = (Arg * max(1, len(args)))(*cmps)
    for name in rule["names"]:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            continue
        rc = lib.seccomp_rule_add_array(ctx, ctypes.c_uint32(act), nr, ctypes.c_uint(len(args)), array)
        assert rc == 0, (name, rc)
assert lib.seccomp_load(ctx) == 0
os.execv(sys.argv[2], sys.argv[2:])
"""

NAMESPACE_PROBE = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def sys_err(nr, *args):
    return "ok" if libc.syscall(nr, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
def listing(path):
    try:
        return os.listdir(path)
    except OSError as exc:
        return type(exc).__name__
print(json.dumps({
    "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
    "tmp": os.listdir("/tmp"),
    "masked": listing(sys.argv[1]),
    "device_dir": listing(sys.argv[2]),
    "device": open(sys.argv[3]).read(),
    "mount_shared": sys_err(165, None, b"/tmp", None, 0x100000, None),
    "unshare_uts": sys_err(272, 0x04000000),
    "mount": sys_err(165, b"none", b"/tmp", b"tmpfs", 0, None),
    "unshare_user": sys_err(272, 0x10000000),
}))
"""


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A scratch directory that stays visible after the command's /tmp is replaced."""
    path = Path(tempfile.mkdtemp(prefix="cuda-agent-seccomp-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def _interpreter_below_tmp() -> list[str]:
    """A checkout cloned under /tmp (CI may clone there) keeps its virtualenv there: bound back into the
    command's /tmp, as the server's own masks do (isolation._mask), or the command could not start."""
    prefix = os.path.realpath(sys.prefix)
    return [prefix] if prefix.startswith("/tmp/") else []


def _launch_under_profile(
    profile: Path, agent_filter: bool, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """The agent command's launcher spec of restricted mode with user namespaces (isolation.agent_spec:
    five namespaces, a private /tmp bound from the session, a tmpfs mask, a read-only tmpfs over a
    device directory and /dev/null over a device node, its own /proc) under the pod profile `profile`."""
    if os.uname().machine != "x86_64":
        pytest.skip("the probe uses x86_64 syscall numbers")
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        pytest.skip("libseccomp.so.2 (what container runtimes load profiles with) is not installed")
    session_tmp, masked, device_dir = tmp_path / "session-tmp", tmp_path / "masked", tmp_path / "nvidia-caps"
    for directory in (session_tmp, masked, device_dir):
        directory.mkdir(parents=True)
    (session_tmp / "own").write_text("")
    (masked / "secret").write_text("")
    (device_dir / "nvidia-cap1").write_text("")
    (device := tmp_path / "nvidia0").write_text("device")
    names = ("new_userns", "new_netns", "new_mountns", "new_ipcns", "new_pidns")
    spec = unconfined_spec(
        [sys.executable, "-c", NAMESPACE_PROBE, str(masked), str(device_dir), str(device)],
        {"PATH": "/usr/bin:/bin"},
        "/",
        **dict.fromkeys(names, True),
        masks=[
            {"path": "/tmp", "expose": _interpreter_below_tmp(), "source": str(session_tmp)},
            {"path": str(masked), "expose": []},
        ],
        hide=[str(device_dir), str(device)],
        seccomp=build_filter(FilterPolicy(protected_pids=(os.getpid(),))).hex() if agent_filter else None,
    )
    argv = [sys.executable, "-I", "-c", OCI_LOADER, str(profile), *launch_argv(spec)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_base_profile_stops_the_launchers_user_namespace(outside_tmp: Path) -> None:
    """What a restricted pod as shipped gets: the server's probe fails here and it falls back (auto)
    or refuses to start (--user-namespaces on)."""
    out = _launch_under_profile(PROFILE, agent_filter=True, tmp_path=outside_tmp)
    assert out.returncode == 126
    assert "unshare(CLONE_NEWUSER): Operation not permitted" in out.stderr


def test_userns_profile_lets_the_launcher_build_the_namespaces_and_the_agent_filter_closes_them(
    outside_tmp: Path,
) -> None:
    """Under the variant the launcher builds every namespace and mount of an agent command; the command
    itself (agent filter installed, as the server always does) can neither unshare nor mount again.
    Run as this test's uid: what is tested is the profile, the same for root and the pod's uid."""
    out = _launch_under_profile(USERNS_PROFILE, agent_filter=True, tmp_path=outside_tmp)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["pids"] == ["1"]  # its own PID namespace and /proc
    exposed = {Path(p).relative_to("/tmp").parts[0] for p in _interpreter_below_tmp()}
    assert sorted(seen["tmp"]) == sorted({"own", *exposed})  # the session's tmp/ bound over /tmp
    assert seen["masked"] == [] and seen["device_dir"] in ([], "PermissionError") and seen["device"] == ""
    assert seen["unshare_user"] == seen["mount"] == seen["unshare_uts"] == seen["mount_shared"] == "EPERM"
    # Without the agent filter only the variant's argument checks stand: the launcher's kinds of
    # namespace and mount pass (so agent code must never run without the filter), any other is refused.
    bare = _launch_under_profile(USERNS_PROFILE, agent_filter=False, tmp_path=outside_tmp / "bare")
    assert bare.returncode == 0, bare.stderr
    unfiltered = json.loads(bare.stdout)
    assert unfiltered["unshare_user"] == unfiltered["mount"] == "ok"
    assert unfiltered["unshare_uts"] == unfiltered["mount_shared"] == "EPERM"


@pytest.fixture
def pod_profiles() -> Iterator[Path]:
    """Skips where the profiles cannot be loaded as a runtime loads them; yields a state root."""
    if os.uname().machine != "x86_64":
        pytest.skip("OCI_LOADER resolves names for this machine only; the profiles are tested on x86_64")
    try:
        ctypes.CDLL("libseccomp.so.2")
    except OSError:
        pytest.skip("libseccomp.so.2 (what container runtimes load profiles with) is not installed")
    state = state_root("sbx-seccomp-", mode=0o755)
    yield state
    shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def _server_under_profile(
    profile: Path, state: Path, user_namespaces: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`cuda-agent sandbox serve` in restricted mode, as a pool's pod runs it, under the pod profile
    `profile`; yields the process and its first stdout line (the "serving" JSON, or "" if it exited)."""
    serve = [sys.executable, "-m", "cuda_agent.cli", "sandbox", "serve", "--port", "0", "--state-dir"]
    judge = ["--judge-command", f"{sys.executable} {FAKE_JUDGE}", "--judge-dir", str(FAKE_JUDGE_DIR)]
    flags = ["--isolation", "restricted", "--user-namespaces", user_namespaces, "--judge-zygote", "off"]
    frozen = ["--frozen-dir", str(REAL_JUDGE_DIR / "frozen")]
    argv = [sys.executable, "-I", "-c", OCI_LOADER, str(profile), *serve, str(state), *judge, *frozen, *flags]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield proc, proc.stdout.readline()
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_server_requiring_user_namespaces_refuses_the_base_profile(pod_profiles: Path) -> None:
    """What the operator's `user_namespaces: "on"` buys: under the shipped base profile the server exits
    2 naming the refusal (the pod crash-loops visibly) instead of serving with the fallback's residuals."""
    with _server_under_profile(PROFILE, pod_profiles / "base", "on") as (proc, first_line):
        assert first_line == "" and proc.wait(timeout=60) == 2
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    assert "--user-namespaces on, but this environment refuses them" in stderr
    assert "unshare(CLONE_NEWUSER): Operation not permitted" in stderr


PROC_VIEW = (
    "ls /proc 2>/dev/null | grep -c '^[0-9]'; "
    "{ tr '\\0' ' ' < /proc/1/cmdline; } 2>&1 | tr -d '\\n' | tail -c 60; echo; ls /run | wc -l; "
    "python -c 'import multiprocessing; multiprocessing.Lock(); print(\"lock\")' 2>&1 | tail -1"
)


@pytest.mark.parametrize(
    ("profile", "user_namespaces"), [(PROFILE, "auto"), (USERNS_PROFILE, "on")], ids=["base", "userns"]
)
def test_agent_commands_under_each_pod_profile(
    pod_profiles: Path, profile: Path, user_namespaces: str
) -> None:
    """The whole server under each pod profile, through its HTTP API: the base profile (any restricted
    pool: the fallback, with its residuals) and the variant (a userNamespaces: Required pool: the
    command's own PID namespace, /proc, empty /run and working POSIX semaphores). Tools and the judge
    work under both."""
    with _server_under_profile(profile, pod_profiles / profile.stem, user_namespaces) as (proc, first_line):
        assert first_line, proc.stderr.read() if proc.stderr else ""
        serving = json.loads(first_line)
        assert serving["user_namespaces"] is (profile == USERNS_PROFILE)
        client = SyncSandboxClient(serving["url"])
        sid = client.create_session(TASK).session_id
        pids, init, run_entries, lock = client.tool(sid, "bash", {"command": PROC_VIEW}).output.splitlines()
        assert not client.tool(sid, "write", {"file_path": "model_new.py", "content": "x = 1\n"}).is_error
        assert "model_new.py" in client.tool(sid, "grep", {"pattern": "x = 1", "path": "."}).output
        judged = client.judge(sid, "verify").result
        assert judged is not None and judged.reward == 3  # the fake judge's answer
        client.delete_session(sid)
    if profile == USERNS_PROFILE:
        assert int(pids) <= 4 and "multiprocessing.Lock()" in init  # pid 1 is the command itself
        assert (run_entries, lock) == ("0", "lock")
    else:  # restricted pods without user namespaces (docs/sandbox.md)
        # Landlock leaves the command no /proc/<pid> but its own: no process list, no pid 1 command line.
        assert pids == "0" and init.strip().endswith("/proc/1/cmdline: Permission denied")
        assert lock.startswith("PermissionError")  # no /dev/shm for agents without a mount namespace
