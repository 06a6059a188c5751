"""The judge zygote: one pre-started process that has imported torch, inductor and the judge and forks a
judge per evaluation (docs/judge.md, "Process model").

A judge started by exec spends seconds importing torch and inductor (and, on a CPU host, running
inductor's ISA probe) before judging anything. The zygote pays that once. It never runs candidate code, never
initialises CUDA (a forked CUDA context is unusable) and holds no secret: a request carries only the
launcher spec (the same one an exec'd judge gets) and the judge's arguments. Each child opens its
output files, applies the spec's confinement (`launcher.confine`: namespaces, rlimits, user switch,
Landlock, seccomp) and runs the judge CLI in-process; the orchestrator then forks its workers, which
inherit the imports too. The zygote reports each child's pid and exit status on its socket.

Protocol (newline-delimited JSON on a socketpair): zygote -> server `{"ready": true, ...}` once, then
`{"id": n, "pid": p}` or `{"id": n, "error": "..."}` per request and `{"id": n, "exit": code}` when that
judge ends (code negative: killed by that signal, as in subprocess). Server -> zygote:
`{"id": n, "argv": [...], "spec": {...}, "stdout": path, "stderr": path}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import importlib
import json
import os
import selectors
import socket
import stat
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

# Imported before any request: what every judge and every worker would otherwise import itself
# ("full"). Inductor asks `torch.cuda.is_available()` at import; answered by the CUDA runtime, that
# makes torch refuse CUDA in every process forked afterwards, so a GPU host's zygote has NVML answer
# it (PYTORCH_NVML_BASED_CUDA_CHECK). Inductor's CPU ISA probe also broke forked CUDA on the H200, so
# it runs only on hosts without a GPU. "minimal" (torch and dynamo) is the fallback when a grandchild
# of a full zygote fails the CUDA self-check (tests/gpu/fork_cuda_check.py).
PRELOAD_MINIMAL = ("torch", "torch._dynamo")
PRELOAD = (
    *PRELOAD_MINIMAL,
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "cuda_agent.sandbox.judge.cli",
    "cuda_agent.sandbox.judge.orchestrator",
    "cuda_agent.sandbox.judge.worker",
)
PRELOAD_LEVELS = {"full": PRELOAD, "minimal": PRELOAD_MINIMAL}
PRELOAD_GPU_EXTRA = ("torch._inductor.runtime.triton_heuristics",)  # what a CUDA worker imports besides
# What a CUDA worker's baseline compile imported on top of the above (the note CUDA_AGENT_JUDGE_DEBUG
# adds; ~0.3 s of a cached evaluation on the H200 host, the backends' custom-op registration included).
# Best effort: a module this torch lacks is skipped, and the self-check below still vets the result.
PRELOAD_COMPILE = (
    "torch._dynamo.backends.inductor",
    "torch._dynamo.backends.cudagraphs",
    "torch._dynamo.dce_extra_outputs",
    "torch._dynamo.repro.after_dynamo",
    "torch._export.passes.add_runtime_assertions_for_constraints_pass",
    "torch._export.passes.collect_tracepoints_pass",
    "torch._inductor.codegen.cpp_wrapper_gpu",
    "torch._inductor.codegen.cuda_combined_scheduling",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.codegen.wrapper_fxir",
    "torch._inductor.compiler_bisector",
    "torch._inductor.fx_passes.efficient_conv_bn_eval",
    "torch._inductor.fx_passes.freezing_patterns",
    "torch._inductor.fx_passes.quantization",
    "torch._inductor.hooks",
    "torch._subclasses.schema_check_mode",
    "torch.distributed.tensor.experimental",
    "torch.export._trace",
    "torch.export._unlift",
    "torch.fx.experimental.validator",
    "torch.utils._cpp_embed_headers",
)
READY_TIMEOUT_S = 300.0


# --- the zygote process ----------------------------------------------------------------------------------


def preload(level: str = "full") -> dict[str, Any]:
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # inductor compiles in-process in the worker
    from cuda_agent.sandbox.judge.confinement import cuda_host

    gpu = cuda_host()
    if gpu:
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    loaded = [*PRELOAD_LEVELS[level], *(PRELOAD_GPU_EXTRA if gpu and level == "full" else ())]
    for name in loaded:
        importlib.import_module(name)
    if gpu and level == "full":
        for name in PRELOAD_COMPILE:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
    if level == "full":
        _warm_inductor_keys()
        if not gpu:
            _warm_cpu_isa()
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError("CUDA was initialised during preload: forked judges could not use it")
    if gpu:
        _release_nvml()
        held = _device_descriptors()
        if held:
            raise RuntimeError(f"the zygote holds device descriptors after preload: {held}")
    if threading.active_count() > 1:
        raise RuntimeError(f"{threading.active_count()} Python threads after preload: forking is unsafe")
    if gpu:
        problem = _grandchild_cuda_problem()
        if problem:
            raise RuntimeError(f"a judge forked from this zygote could not use CUDA: {problem}")
    return {
        "ready": True,
        "pid": os.getpid(),
        "level": level,
        "loaded": loaded,
        "cuda_host": gpu,
        "os_threads": _os_threads(),
    }


def _release_nvml() -> None:
    """NVML answered inductor's import-time availability question and stays initialised, holding
    descriptors to the device nodes. Forked judges and workers close inherited descriptors, which would
    leave their NVML on closed, later reused, descriptors (on the H200: wrong device counts, dynamo
    IndexErrors, unseeded generators). So shut it down here, fully: NVML counts its inits."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return
    for _ in range(1024):
        if nvml.nvmlShutdown() != 0:  # NVML_ERROR_UNINITIALIZED once the count is back at zero
            return


def _device_descriptors() -> list[str]:
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("/dev/nvidia"):
                held.append(f"{fd}->{target}")
    return held


def _os_threads() -> list[str]:
    """Names of this process's OS threads: a fork copies only the calling one, so others are reported."""
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as comm:
            names.append(comm.read().strip())
    return names


def _grandchild_cuda_problem() -> str:
    """Fork the way a judge runs: a judge-like child forks a worker-like grandchild before touching CUDA,
    then both draw seeded CUDA inputs (they must agree: the worker regenerates the judge's inputs) and
    the grandchild also torch.compiles a small function. '' when all is well; the zygote itself never
    touches CUDA."""
    from cuda_agent.sandbox.judge.confinement import close_inherited_fds

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            close_inherited_fds(keep=(write_fd,))  # as a forked judge does, and its workers after it
            grandchild = os.fork()
            if grandchild == 0:
                _report_cuda_problem(write_fd, compile_too=True)
            _, status = os.waitpid(grandchild, 0)
            if os.waitstatus_to_exitcode(status) == 0:
                _report_cuda_problem(write_fd, compile_too=False)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as reader:
        answers = reader.read().decode(errors="replace").split("\n")
    worker, judge = [*answers, "", ""][:2]
    if not worker.startswith("ok ") or not judge.startswith("ok "):
        problems = [a for a in (worker, judge) if a and not a.startswith("ok ")]
        return "; ".join(problems) or "the check processes reported nothing"
    if worker != judge:
        return f"seeded CUDA draws differ between judge and worker ({judge[3:]} vs {worker[3:]})"
    return ""


def _report_cuda_problem(write_fd: int, compile_too: bool) -> NoReturn:
    try:
        answer = _cuda_problem_here(compile_too)
    except Exception as exc:
        answer = f"{type(exc).__name__}: {str(exc)[:2000]}"
    os.write(write_fd, answer.replace("\n", " ").encode() + b"\n")
    os._exit(0)


def _cuda_problem_here(compile_too: bool) -> str:
    """What the judge needs from CUDA in a forked process, tried: a context, one generator per device,
    RNG state (dynamo saves it around tracing), seeded draws that repeat and, in the worker,
    torch.compile. 'ok <draw>' when all of it works, else the problem."""
    import tempfile

    import torch

    if torch.cuda.device_count() < 1:  # asked before the context exists, as the orchestrator does
        return "no CUDA device counted before initialisation"
    torch.empty(1, device="cuda")
    count, generators = torch.cuda.device_count(), len(torch.cuda.default_generators)
    if count != generators:
        return f"{count} devices, {generators} generators"
    torch.cuda.get_rng_state()
    draws = []
    for _ in range(2):
        torch.manual_seed(1234)
        with torch.device("cuda"):
            draws.append(torch.randn(4096).sum().item())
    if draws[0] != draws[1]:
        return "seeded CUDA draws differ within one process"
    if compile_too:
        with tempfile.TemporaryDirectory(prefix="zygote-check-") as cache:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
            os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
            x = torch.randn(4096, device="cuda")
            compiled = torch.compile(lambda t: torch.relu(t) * 2 + 1)(x)
            if not torch.allclose(compiled, torch.relu(x) * 2 + 1):
                return "torch.compile gave a wrong result"
    return f"ok {draws[0]!r}"


def _warm_cpu_isa(answers: Path | None = None) -> None:
    """Inductor's CPU ISA probe builds test programs and loads each in a fresh `python -c "import torch
    ..."` (10 checks on an AMX host: ~40 s of 2 cores) once per process; done here, every judge inherits the
    answer. Each check's outcome is a host fact (CPU, compiler, torch, interpreter), so the outcomes are also
    kept per host key in the zygote user's cache (`answers`; a session server names its own user's cache
    in CUDA_AGENT_ISA_ANSWERS, the zygote's HOME being private to that server): during this warm-up, a
    check already answered on this host is not run again, and the probe's code (and what it records,
    such as AVX512-BF16) runs unchanged on the kept outcomes. A missing or untrusted file (not ours,
    writable by others) means checking as before. No candidate input is read."""
    with contextlib.suppress(Exception):
        from torch._inductor import cpu_vec_isa

        if answers is None:
            answers = Path(os.environ[ISA_ANSWERS_ENV]) if ISA_ANSWERS_ENV in os.environ else ISA_ANSWERS
        path = _isa_answer_path(answers)
        kept = (_read_isa_answer(path) if path is not None else None) or {}
        known = dict(kept)
        check_build = cpu_vec_isa.VecISA.check_build

        def remembered(isa: Any, code: str) -> bool:
            key = hashlib.sha256(f"{isa._arch_flags}\0{code}".encode()).hexdigest()
            if key not in known:
                known[key] = bool(check_build(isa, code))
            return known[key]

        cpu_vec_isa.VecISA.check_build = remembered  # type: ignore[method-assign,assignment]
        try:
            cpu_vec_isa.valid_vec_isa_list()
        finally:
            cpu_vec_isa.VecISA.check_build = check_build  # type: ignore[method-assign]
        if path is not None and known != kept:
            _write_isa_answer(path, known)


ISA_ANSWERS = Path.home() / ".cache" / "cuda-agent" / "inductor-cpu-isa"
# A session server names its own user's cache here: the zygote's HOME is private to that server.
ISA_ANSWERS_ENV = "CUDA_AGENT_ISA_ANSWERS"


def _isa_answer_path(answers: Path) -> Path | None:
    """One file per host key: what decides a check's outcome (the CPU's flags, the C++ compiler and its
    file, torch's version and place, the interpreter)."""
    import platform
    import shutil

    import torch
    from torch._inductor import cpp_builder, cpu_vec_isa

    try:
        found = shutil.which(cpp_builder.get_cpp_compiler())
        if found is None:
            return None
        binary = Path(found).resolve()
        cpu = cpu_vec_isa.x86_isa_checker() if platform.machine() in ("x86_64", "AMD64") else []
        key = json.dumps(
            [
                sys.platform,
                platform.machine(),
                sorted(cpu),
                str(binary),
                binary.stat().st_mtime_ns,
                torch.__version__,
                torch.__file__,
                sys.executable,
            ]
        )
    except Exception:  # no answer kept: the warm-up checks as before
        return None
    return answers / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _read_isa_answer(path: Path) -> dict[str, bool] | None:
    """The kept outcomes, only from a file that this user owns and nobody else may write, below folders
    that only this user or root can change (a root-owned sticky folder such as /tmp counts: nobody else may
    rename what is in it), with no link on the way."""
    try:
        for place in (path, *path.parents):
            info = place.stat(follow_symlinks=False)
            sticky_root = info.st_uid == 0 and info.st_mode & stat.S_ISVTX and place != path
            if info.st_uid not in (os.geteuid(), 0) or place.is_symlink():
                return None
            if info.st_mode & 0o022 and not sticky_root:
                return None
        if path.stat(follow_symlinks=False).st_uid != os.geteuid():
            return None
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
        return None
    return {str(k): v for k, v in value.items()}


def _write_isa_answer(path: Path, outcomes: dict[str, bool]) -> None:
    with contextlib.suppress(OSError):
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(outcomes, sort_keys=True))
        partial.chmod(0o600)
        os.replace(partial, path)


def _warm_inductor_keys() -> None:
    """Inductor keys its caches on hashes of torch's and triton's own source files, computed once per
    process (~0.4 s on the H200 host, inside every worker's baseline compile). Computed here, every
    judge and worker inherits them. Files on disk only: no CUDA, no candidate input."""
    with contextlib.suppress(Exception):
        from torch._inductor import codecache

        codecache.torch_key()
    with contextlib.suppress(Exception):
        from torch._inductor.runtime.triton_compat import HAS_TRITON, triton_key

        if HAS_TRITON:
            triton_key()


def serve(sock: socket.socket) -> None:
    """Fork a judge per request and report how each one ends, until the server closes the socket."""
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ, None)
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.data is None:
                data = sock.recv(1 << 16)
                if not data:
                    return  # the server is gone; judges die with us (parent-death signal)
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    reply = _start(json.loads(line), selector)
                    sock.sendall(json.dumps(reply).encode() + b"\n")
            else:
                request_id, pid = key.data
                selector.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                message = {"id": request_id, "exit": os.waitstatus_to_exitcode(status)}
                sock.sendall(json.dumps(message).encode() + b"\n")


def _start(request: dict[str, Any], selector: selectors.BaseSelector) -> dict[str, Any]:
    request_id = request.get("id")
    try:
        out = _create(request["stdout"])
        err = _create(request["stderr"])
    except (KeyError, OSError) as exc:
        return {"id": request_id, "error": f"output files: {exc}"}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _judge_child(request, out, err)
    os.close(out)
    os.close(err)
    pidfd = os.pidfd_open(pid)
    selector.register(pidfd, selectors.EVENT_READ, (request_id, pid))
    return {"id": request_id, "pid": pid}


def _create(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _judge_child(request: dict[str, Any], out: int, err: int) -> NoReturn:
    """Become an exec'd judge would have been: own session, only stdio open, confined, its environment."""
    from cuda_agent.sandbox.judge import cli, confinement
    from cuda_agent.sandbox.server import launcher

    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        confinement.close_inherited_fds()  # the zygote's socket, other judges' pidfds
        spec = request["spec"]
        launcher.confine(spec)
        confinement.adopt_environment(spec["env"])
        code = cli.main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 2
    except launcher.ConfineError as exc:
        sys.stderr.write(f"judge zygote: {exc}\n")
        code = 126
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main(argv: list[str]) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    try:
        hello = preload(argv[1] if len(argv) > 1 else "full")
    except Exception as exc:
        sock.sendall(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}).encode() + b"\n")
        return 1
    sock.sendall(json.dumps(hello).encode() + b"\n")
    serve(sock)
    return 0


# --- the server's handle ---------------------------------------------------------------------------------


@dataclass
class ZygoteJudge:
    """One forked judge, as the server sees it: pid, exit code once it ended."""

    pid: int
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    returncode: int | None = None


class ZygoteError(RuntimeError):
    pass


class JudgeZygote:
    """Starts the zygote and forwards requests; one reader task resolves replies and exits."""

    def __init__(self, proc: asyncio.subprocess.Process, reader: asyncio.StreamReader, writer: Any) -> None:
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.hello: dict[str, Any] = {}
        self._next_id = 0
        self._started: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._judges: dict[int, ZygoteJudge] = {}
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, python: str, env: dict[str, str], log_path: str, isolated: bool = True
    ) -> JudgeZygote:
        """The fully preloaded zygote, or the minimal one where a full one fails its start-up checks.
        `isolated`: python -I (the server's way); off only where the judge is found through PYTHONPATH."""
        try:
            return await cls.start_level("full", python, env, log_path, isolated)
        except ZygoteError as exc:
            full_error = exc
        try:
            zygote = await cls.start_level("minimal", python, env, log_path, isolated)
        except ZygoteError as exc:
            raise ZygoteError(f"{full_error}; minimal preload: {exc}") from exc
        zygote.hello["full_preload_error"] = str(full_error)
        return zygote

    @classmethod
    async def start_level(
        cls, level: str, python: str, env: dict[str, str], log_path: str, isolated: bool
    ) -> JudgeZygote:
        ours, theirs = socket.socketpair()
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                python,
                *(["-I"] if isolated else []),
                "-m",
                "cuda_agent.sandbox.server.judge_zygote",
                str(theirs.fileno()),
                level,
                pass_fds=(theirs.fileno(),),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        zygote = cls(proc, reader, writer)
        try:
            line = await asyncio.wait_for(reader.readline(), READY_TIMEOUT_S)
            zygote.hello = json.loads(line) if line else {"ready": False, "error": "exited while starting"}
        except (TimeoutError, ValueError) as exc:
            zygote.hello = {"ready": False, "error": f"no ready line: {exc!r}"}
        if not zygote.hello.get("ready"):
            await zygote.close()
            error = zygote.hello.get("error")
            raise ZygoteError(f"judge zygote ({level} preload) did not start: {error} (log: {log_path})")
        zygote._pump = asyncio.create_task(zygote._read_replies())
        return zygote

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and self._pump is not None and not self._pump.done()

    async def spawn(self, argv: list[str], spec: dict[str, Any], stdout: str, stderr: str) -> ZygoteJudge:
        if not self.alive:
            raise ZygoteError("judge zygote is not running")
        self._next_id += 1
        request_id = self._next_id
        started: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._started[request_id] = started
        request = {"id": request_id, "argv": argv, "spec": spec, "stdout": stdout, "stderr": stderr}
        self.writer.write(json.dumps(request).encode() + b"\n")
        await self.writer.drain()
        reply = await started
        if "pid" not in reply:
            raise ZygoteError(f"judge zygote could not start a judge: {reply.get('error')}")
        return self._judges[request_id]

    async def _read_replies(self) -> None:
        try:
            while line := await self.reader.readline():
                message = json.loads(line)
                request_id = message.get("id")
                if "exit" in message:
                    judge = self._judges.pop(request_id, None)
                    if judge is not None:
                        judge.returncode = int(message["exit"])
                        judge.exited.set()
                    continue
                if "pid" in message:
                    self._judges[request_id] = ZygoteJudge(pid=int(message["pid"]))
                future = self._started.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(message)
        finally:
            # The zygote died: nothing more will be reported; unblock everyone waiting.
            for future in self._started.values():
                if not future.done():
                    future.set_result({"error": "judge zygote exited"})
            for judge in self._judges.values():
                judge.exited.set()
            self._started.clear()
            self._judges.clear()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        if self._pump is not None:
            self._pump.cancel()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        await self.proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
