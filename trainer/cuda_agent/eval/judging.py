"""Judging candidates, many in flight: local judge processes (`python -m cuda_agent.sandbox.judge.cli
... --json`, i.e. `cuda-agent judge`) or a sandbox server's `/v1/evaluate`.

Builds overlap GPU timing without anything from us: every local judge takes the device lock of its build
cache (`<cache>/locks/device-cuda-N.lock`, FIFO) around verify and profile only, and a sandbox server
passes its per-GPU lock to its judges; so `--jobs N` runs N builds at once while measurements queue.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cuda_agent.api.judge import OPTIONS_JSON_FLAG, Device, JudgeOptions
from cuda_agent.api.sandbox import JudgeResult
from cuda_agent.eval.models import JudgeSettings, RowStatus, TaskResult
from cuda_agent.eval.tasks import Candidate, Task

# Beyond the judge's own --timeout (its phases stop there), time for start-up and the verdict.
_PROCESS_GRACE_S = 120.0
# The line `cuda-agent judge` writes to stderr when a warm judge service judged for it (local_service's
# judge_via_service; tests/eval/test_eval_units.py runs the real CLI against a service to hold them together).
_SERVED_MARK = "cuda-agent judge: judged by the judge service at "


@dataclass
class Judged:
    """What one evaluation gave: the judge's result, or why there is none."""

    status: RowStatus
    result: JudgeResult | None
    message: str | None
    seconds: float
    via_service: bool = False


class Judge(Protocol):
    async def evaluate(self, candidate: Candidate) -> Judged: ...


def task_file(task: Task, workdir: Path) -> Path:
    """A local file holding the task (tasks from s3:// are written under workdir once)."""
    if task.path is not None:
        return task.path
    path = workdir / "tasks" / task.level / f"{task.name}.py"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(task.source)
    return path


def judge_args(settings: JudgeSettings, device: Device) -> list[str]:
    """The judge CLI's device and options: the options as one JudgeOptions JSON, as the session server
    passes them (one path from the settings to the judge's config)."""
    return ["--device", device, OPTIONS_JSON_FLAG, settings.options().model_dump_json(exclude_none=True)]


class LocalJudge:
    """One fresh judge process per evaluation, as the session server runs it (exit 0: a verdict; exit 2:
    a task error or unusable input; anything else: no result)."""

    def __init__(self, settings: JudgeSettings, device: Device, workdir: Path) -> None:
        self.settings = settings
        self.device = device
        self.workdir = workdir

    async def evaluate(self, candidate: Candidate) -> Judged:
        command = [
            sys.executable,
            "-m",
            "cuda_agent.sandbox.judge.cli",
            str(task_file(candidate.task, self.workdir)),
            str(candidate.path if candidate.is_workspace else candidate.model_new),
            "--json",
            *judge_args(self.settings, self.device),
        ]
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(os.environ),
            cwd=self.workdir,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.settings.timeout_s + _PROCESS_GRACE_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return Judged("no-result", None, "the judge process did not finish in time", _since(started))
        seconds = _since(started)
        stderr = err.decode(errors="replace").strip()
        if proc.returncode == 2:
            return Judged("task-error", None, _last_line(stderr) or "judge exit 2", seconds)
        if proc.returncode != 0:
            return Judged("no-result", None, f"judge exit {proc.returncode}: {stderr[-500:]}", seconds)
        try:
            result = JudgeResult.model_validate_json(out.decode().strip())
            return Judged("judged", result, None, seconds, via_service=_SERVED_MARK in stderr)
        except ValueError as exc:
            return Judged("no-result", None, f"unreadable judge output: {str(exc)[:300]}", seconds)


class SandboxJudge:
    """The sandbox server's stateless reward endpoint (`/v1/evaluate`): many requests in flight, the
    server queues them on its judge slots and GPUs."""

    def __init__(self, url: str, settings: JudgeSettings, device: Device) -> None:
        from cuda_agent.sandbox.client import SandboxClient

        self.client = SandboxClient(url, timeout_s=settings.timeout_s + _PROCESS_GRACE_S)
        self.settings = settings
        self.device = device

    async def close(self) -> None:
        await self.client.close()

    def options(self) -> JudgeOptions:
        return self.settings.options()

    async def evaluate(self, candidate: Candidate) -> Judged:
        import aiohttp

        from cuda_agent.api.sandbox import EvaluateRequest, TaskRef
        from cuda_agent.sandbox.client import SandboxError

        name = re.sub(r"[^A-Za-z0-9_.-]", "_", candidate.task.name)[:128] or "task"
        task = TaskRef(source=candidate.task.source, name=name)
        if candidate.is_workspace:
            request = EvaluateRequest(
                task=task, files=candidate.files(), device=self.device, judge=self.options()
            )
        else:
            request = EvaluateRequest(
                task=task, model_new=candidate.model_new.read_text(), device=self.device, judge=self.options()
            )
        started = time.monotonic()
        try:
            result = await self.client.evaluate(request)
        except SandboxError as exc:
            status: RowStatus = "task-error" if exc.status == 422 else "no-result"
            return Judged(status, None, str(exc), _since(started))
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            return Judged("no-result", None, f"sandbox unreachable: {exc!r}", _since(started))
        return Judged("judged", result, None, _since(started))


def _since(started: float) -> float:
    return round(time.monotonic() - started, 3)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def result_row(candidate: Candidate, judged: Judged, solutions: Path | None) -> TaskResult:
    """The results.jsonl row of one judged candidate."""
    where = str(candidate.path.relative_to(solutions)) if solutions else str(candidate.path)
    row = TaskResult(
        key=candidate.key,
        level=candidate.task.level,
        task=candidate.task.name,
        candidate=where,
        status=judged.status,
        error=judged.message,
        seconds=judged.seconds,
    )
    result = judged.result
    if result is None:
        return row
    return row.model_copy(
        update={
            "reward": result.reward,
            "compiled": result.compiled,
            "correct": result.correct,
            "violations": list(result.violations),
            "error": result.error,
            "speedup_eager": result.speedup.get("eager"),
            "speedup_compile": result.speedup.get("compile"),
            "timings_ms": dict(result.timings_ms),
            "precision": result.precision,
            "device": result.device,
            "build_cached": result.build_cached,
            "phase_s": _seconds_map(result.seconds),
            "steps_s": _seconds_map((result.model_extra or {}).get("steps_s")),
            "lock_wait_s": result.lock_wait_s,
            "build_lock_wait_s": _number((result.model_extra or {}).get("build_lock_wait_s")),
            "judge_service": judged.via_service,
        }
    )


def _seconds_map(value: object) -> dict[str, float]:
    """A map of seconds from the judge (`seconds`, `steps_s`), numbers only: a judge of another version
    may print other shapes."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float))}


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
