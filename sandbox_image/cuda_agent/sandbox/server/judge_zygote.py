"""The judge zygote: one pre-started process that has imported torch (and, where no GPU is, inductor and
the judge) and forks a judge per evaluation (docs/judge.md, "Process model").

A judge started by exec spends seconds importing torch and, on a CPU host, running inductor's ISA probe
before judging anything. The zygote pays that once. It never runs candidate code, never
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
import importlib
import json
import os
import selectors
import socket
import sys
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, NoReturn

# Imported before any request: what every judge and every worker would otherwise import itself. On a GPU
# host only torch and dynamo: importing inductor, the judge's own modules or running inductor's CPU ISA
# probe queries the CUDA driver (or NVML, where PYTORCH_NVML_BASED_CUDA_CHECK asks it to), after which
# processes forked below cannot use CUDA, or not correctly (tests/gpu/fork_cuda_check.py, H200). The
# judge imports the rest itself, exactly as an exec'd judge does before forking its workers.
PRELOAD_GPU_HOST = ("torch", "torch._dynamo")
PRELOAD = (
    *PRELOAD_GPU_HOST,
    "torch._inductor.compile_fx",
    "torch._inductor.codecache",
    "cuda_agent.sandbox.judge.cli",
    "cuda_agent.sandbox.judge.orchestrator",
    "cuda_agent.sandbox.judge.worker",
)
READY_TIMEOUT_S = 300.0


# --- the zygote process ----------------------------------------------------------------------------------


def preload() -> dict[str, Any]:
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # inductor compiles in-process in the worker
    from cuda_agent.sandbox.judge.isolation import cuda_host

    gpu = cuda_host()
    loaded = []
    for name in PRELOAD_GPU_HOST if gpu else PRELOAD:
        importlib.import_module(name)
        loaded.append(name)
    if not gpu:
        _warm_cpu_isa()
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError("CUDA was initialised during preload: forked judges could not use it")
    if threading.active_count() > 1:
        raise RuntimeError(f"{threading.active_count()} Python threads after preload: forking is unsafe")
    if gpu:
        problem = _grandchild_cuda_problem()
        if problem:
            raise RuntimeError(f"a judge forked from this zygote could not use CUDA: {problem}")
    return {"ready": True, "pid": os.getpid(), "loaded": loaded, "cuda_host": gpu}


def _grandchild_cuda_problem() -> str:
    """Fork a judge-like child that forks a worker-like grandchild, which tries what a worker needs from
    CUDA; '' when all is well (the zygote itself never touches CUDA)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            grandchild = os.fork()
            if grandchild == 0:
                try:
                    problem = _cuda_problem_here()
                except Exception as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                os.write(write_fd, problem.encode()[:4000] or b"ok")
                os._exit(0)
            os.waitpid(grandchild, 0)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as reader:
        answer = reader.read().decode(errors="replace")
    return "" if answer == "ok" else answer or "the check process reported nothing"


def _cuda_problem_here() -> str:
    """What the judge needs from CUDA in a worker, tried: a context, one generator per device, RNG state
    (dynamo saves it around tracing) and seeded draws that repeat. '' when all of it works."""
    import torch

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
    return "" if draws[0] == draws[1] else "seeded CUDA draws differ"


def _warm_cpu_isa() -> None:
    """Inductor's CPU ISA probe compiles test programs (seconds) once per process; done here, every judge
    inherits the answer. Host facts only, no candidate input."""
    with contextlib.suppress(Exception):
        from torch._inductor import cpu_vec_isa

        cpu_vec_isa.valid_vec_isa_list()


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
    from cuda_agent.sandbox.judge import cli, isolation
    from cuda_agent.sandbox.server import launcher

    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        isolation.close_inherited_fds()  # the zygote's socket, other judges' pidfds
        spec = request["spec"]
        launcher.confine(spec)
        isolation.adopt_environment(spec["env"])
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
        hello = preload()
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
        """`isolated`: python -I (the server's way); off only where the judge is found through PYTHONPATH."""
        ours, theirs = socket.socketpair()
        with open(log_path, "ab") as log:
            proc = await asyncio.create_subprocess_exec(
                python,
                *(["-I"] if isolated else []),
                "-m",
                "cuda_agent.sandbox.server.judge_zygote",
                str(theirs.fileno()),
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
            raise ZygoteError(f"judge zygote did not start: {zygote.hello.get('error')} (log: {log_path})")
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
