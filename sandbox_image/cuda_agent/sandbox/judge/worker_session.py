"""One judge worker process as the orchestrator sees it: forked early, started with its key and config,
and every message it sends turned into either the expected reply or a verdict (timeout, forgery, crash,
candidate error), never a hang."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

import torch

from cuda_agent.api.judge import JudgeVerdict
from cuda_agent.sandbox.judge import channel, confinement, protocol, worker
from cuda_agent.sandbox.judge.errors import RunStopped, TaskFailure

M = TypeVar("M")
Reply = tuple[M, list[bytearray]]  # a worker message and its blobs


class WorkerSession:
    """One worker process and its authenticated channel; every failure becomes a verdict, never a hang.

    The process is forked at construction, before this process holds a secret (the master seed, another
    worker's key) or a CUDA context: the child inherits the imported modules (torch, inductor where
    preloaded) instead of importing them again, and nothing a candidate could use. `start` then sends it
    its key and config."""

    def __init__(self) -> None:
        if threading.active_count() > 1 or torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            raise RuntimeError("judge workers are forked: start them before any thread or CUDA context")
        to_worker_r, to_worker_w = os.pipe()
        to_orch_r, to_orch_w = os.pipe()
        channel.widen_pipe(to_orch_w)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            worker.run_forked(to_worker_r, to_orch_w)
        os.close(to_worker_r)
        os.close(to_orch_w)
        self.pid = pid
        self.returncode: int | None = None
        self.read_fd, self.write_fd = to_orch_r, to_worker_w
        self.endpoint = channel.Endpoint(b"", to_orch_r, to_worker_w, is_worker=False)
        self.phase = "build"
        # Display only: the worker's count of finished timed trials, relayed to the CLI's progress bar.
        self.on_progress: Callable[[int], None] | None = None
        self.phase_start = time.monotonic()
        self.deadline = time.monotonic()

    def start(self, workspace: confinement.Workspace, config: protocol.WorkerConfig) -> None:
        key = channel.new_key()
        self.endpoint = channel.Endpoint(key, self.read_fd, self.write_fd, is_worker=False)
        config = config.copy()
        config["env"] = confinement.worker_env(workspace, config["device"])
        config["log"] = str(workspace.log)
        try:
            channel.send_key(self.write_fd, key)
            self.endpoint.send(config)
        except BrokenPipeError:
            pass

    def enter(self, phase: str, limit: float, total_deadline: float) -> None:
        self.phase = phase
        self.phase_start = time.monotonic()
        self.deadline = min(self.phase_start + limit, total_deadline)

    def send(self, message: protocol.Command) -> None:
        # A dead worker: the receive that follows reports how it ended.
        with contextlib.suppress(BrokenPipeError):
            self.endpoint.send(message)

    # The worker's reply each step waits for: `expected` names the message kind, and its type follows.
    @overload
    def receive(self, expected: Literal["started"], result: JudgeVerdict) -> Reply[protocol.Started]: ...
    @overload
    def receive(self, expected: Literal["collected"], result: JudgeVerdict) -> Reply[protocol.Collected]: ...
    @overload
    def receive(self, expected: Literal["imported"], result: JudgeVerdict) -> Reply[protocol.Imported]: ...
    @overload
    def receive(self, expected: Literal["ready"], result: JudgeVerdict) -> Reply[protocol.Ready]: ...
    @overload
    def receive(
        self, expected: Literal["trial_result"], result: JudgeVerdict
    ) -> Reply[protocol.TrialResult]: ...
    @overload
    def receive(
        self, expected: Literal["profile_result"], result: JudgeVerdict
    ) -> Reply[protocol.ProfileResult]: ...
    @overload
    def receive(self, expected: Literal["bye"], result: JudgeVerdict) -> Reply[protocol.Bye]: ...

    def receive(self, expected: str, result: JudgeVerdict) -> Reply[Any]:
        """The next frame of type `expected`; anything else ends the run with the matching verdict. Its
        fields are the worker's word (it runs candidate code): callers check what they rely on."""
        header, blobs = self._frame(result)
        kind = header.get("type")
        while kind == "progress" and expected == "profile_result":
            done = header.get("done")
            if self.on_progress is not None and isinstance(done, int):
                self.on_progress(done)
            header, blobs = self._frame(result)
            kind = header.get("type")
        if kind == expected:
            return header, blobs
        self.kill()
        if kind == "candidate_error":
            if header.get("early_exit"):
                result.violations.append(str(header["error"]))
            else:
                result.error = f"{header['error']} (in {self.phase})"
        elif kind == "forged":
            result.violations.append(
                f"output-forged: {header.get('error')} (on the worker's command channel)"
            )
        elif kind == "task_error":
            raise TaskFailure(str(header.get("error")))
        elif kind == "judge_error":
            result.error = f"judge error in {self.phase}: {header.get('error')}"
        else:
            result.violations.append(f"output-forged: unexpected message {kind!r} in {self.phase}")
        raise RunStopped()

    def _frame(self, result: JudgeVerdict) -> Reply[dict[str, Any]]:
        """The next authenticated frame; a timeout, forgery or dead worker ends the run with its verdict."""
        try:
            return self.endpoint.receive(deadline=self.deadline)
        except channel.ChannelTimeout:
            self.kill()
            result.error = f"timeout after {self.deadline - self.phase_start:.0f} s in {self.phase}"
            raise RunStopped() from None
        except channel.ChannelForged as exc:
            self.kill()
            result.violations.append(f"output-forged: {exc} (on the judge's channel, in {self.phase})")
            raise RunStopped() from None
        except channel.ChannelClosed:
            rc = self.wait()
            if rc == 0:
                result.violations.append(f"early-exit: worker exited before reporting (in {self.phase})")
            else:
                result.error = f"crash: exit code {rc} in {self.phase}"
            raise RunStopped() from None

    def wait(self, timeout: float = 10.0) -> int:
        """The worker's exit code (negative: killed by that signal); killed first if it outlives timeout."""
        end = time.monotonic() + timeout
        while self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
            elif time.monotonic() > end:
                self.kill()
            else:
                time.sleep(0.005)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            return
        for kill in (os.killpg, os.kill):  # the group once the child has called setsid, else the pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(self.pid, 9)
        _, status = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        self.kill()
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
