"""`cuda-agent judge-service`: a warm local judge for the `cuda-agent judge` command.

    cuda-agent judge-service [--socket PATH] &           # prints: export CUDA_AGENT_JUDGE_SERVICE=PATH
    CUDA_AGENT_JUDGE_SERVICE=PATH cuda-agent judge task.py model_new.py

It starts one judge zygote (torch, inductor and the judge imported once, as the sandbox server does) and
forks a judge per request, in the caller's working directory and environment, unconfined like the CLI
itself; the judge still runs candidate code only in its own confined workers. The protocol and the
client's checks are in cuda_agent.sandbox.judge.local_service. The socket sits in a directory only this
user can enter, and a peer of another user is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cuda_agent.sandbox.judge import local_service
from cuda_agent.sandbox.server.isolation import unconfined_spec
from cuda_agent.sandbox.server.judge_zygote import JudgeZygote, ZygoteError

STREAM_INTERVAL_S = 0.1


class JudgeService:
    def __init__(self, zygote: JudgeZygote, work: Path) -> None:
        self.zygote = zygote
        self.work = work
        self.digest = local_service.judge_digest()
        self.active = 0
        self.last_activity = time.monotonic()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.active += 1
        try:
            sock = writer.get_extra_info("socket")
            if sock is None or local_service.peer_uid(sock) != os.getuid():
                await _send(writer, {"accepted": False, "reason": "peer runs as another user"})
                return
            request = json.loads(await reader.readline() or b"{}")
            problem = self.check(request)
            if problem:
                await _send(writer, {"accepted": False, "reason": problem})
                return
            await self.judge(request, reader, writer)
        except (ConnectionError, ValueError) as exc:
            with contextlib.suppress(ConnectionError):
                await _send(writer, {"accepted": False, "reason": f"bad request: {exc}"})
        finally:
            self.active -= 1
            self.last_activity = time.monotonic()
            writer.close()

    def check(self, request: dict[str, Any]) -> str | None:
        argv, env, cwd = request.get("argv"), request.get("env"), request.get("cwd")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            return "argv must be a list of strings"
        if local_service.NO_SERVICE_FLAG not in argv:
            return f"argv must carry {local_service.NO_SERVICE_FLAG}"
        if not isinstance(env, dict) or not isinstance(cwd, str):
            return "env must be an object and cwd a string"
        if request.get("judge_digest") != self.digest:
            return "the judge's files changed since this service started (restart it)"
        if not self.zygote.alive:
            return "the service's judge zygote exited (restart the service)"
        return None

    async def judge(
        self, request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        job = Path(tempfile.mkdtemp(prefix="job-", dir=self.work))
        out, err = job / "stdout", job / "stderr"
        spec = unconfined_spec([], {str(k): str(v) for k, v in request["env"].items()}, request["cwd"])
        try:
            judge = await self.zygote.spawn(request["argv"], spec, str(out), str(err))
        except ZygoteError as exc:
            await _send(writer, {"accepted": False, "reason": str(exc)})
            shutil.rmtree(job, ignore_errors=True)
            return
        await _send(writer, {"accepted": True, "pid": judge.pid})
        gone = asyncio.ensure_future(reader.read())  # EOF: the caller went away (Ctrl-C)
        exited = asyncio.ensure_future(judge.exited.wait())
        sent = 0
        try:
            while not exited.done():
                await asyncio.wait(
                    [exited, gone], timeout=STREAM_INTERVAL_S, return_when=asyncio.FIRST_COMPLETED
                )
                if gone.done() and not exited.done():
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(judge.pid, signal.SIGKILL)
                    return
                sent = await _stream_stderr(writer, err, sent)
            await _stream_stderr(writer, err, sent)
            code = judge.returncode if judge.returncode is not None else 1
            await _send(
                writer, {"stdout": out.read_text(errors="replace") if out.exists() else "", "exit": code}
            )
        finally:
            gone.cancel()
            exited.cancel()
            shutil.rmtree(job, ignore_errors=True)


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()


async def _stream_stderr(writer: asyncio.StreamWriter, path: Path, sent: int) -> int:
    """Forward what the judge wrote to stderr since the last call (its phase lines); the new offset."""
    if not path.exists():
        return sent
    with path.open("rb") as handle:
        handle.seek(sent)
        chunk = handle.read()
    if chunk:
        await _send(writer, {"stderr": chunk.decode(errors="replace")})
    return sent + len(chunk)


def _prepare_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a service that did not exit cleanly


def _single_instance(path: Path) -> int | None:
    """Hold `<socket>.lock` for the service's life: a second service for the same socket (two `cuda-agent
    judge` calls starting one at once, local_service.start_service) finds it held and exits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


async def _exit_when_idle(service: JudgeService, idle_exit: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(min(10.0, idle_exit))
        if service.active == 0 and time.monotonic() - service.last_activity >= idle_exit:
            stop.set()


async def serve(path: Path, work: Path, idle_exit: float = 0.0) -> None:
    if _single_instance(path) is None:
        print(f"cuda-agent judge-service: another service already serves {path}", flush=True)
        return
    env = dict(os.environ)
    env.pop(local_service.SERVICE_ENV, None)
    zygote = await JudgeZygote.start(sys.executable, env, str(work / "zygote.log"), isolated=False)
    service = JudgeService(zygote, work)
    _prepare_socket(path)
    server = await asyncio.start_unix_server(service.handle, path=str(path))
    os.chmod(path, 0o600)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"judge service ready (zygote {zygote.hello.get('level')}); to use it:", flush=True)
    print(f"export {local_service.SERVICE_ENV}={path}", flush=True)
    idle = asyncio.create_task(_exit_when_idle(service, idle_exit, stop)) if idle_exit > 0 else None
    try:
        await stop.wait()
    finally:
        if idle is not None:
            idle.cancel()
        server.close()
        await server.wait_closed()
        await zygote.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="cuda-agent judge-service", description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", type=Path, default=local_service.default_socket_path())
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=0.0,
        metavar="S",
        help="exit after S seconds without a request (0: never; the service `cuda-agent judge` starts "
        "by itself on a terminal uses 1800)",
    )
    args = parser.parse_args(list(argv))
    with tempfile.TemporaryDirectory(prefix="cuda-agent-judge-service-") as work:
        try:
            asyncio.run(serve(args.socket, Path(work), args.idle_exit))
        except ZygoteError as exc:
            print(f"cuda-agent judge-service: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
