"""The agent's tool set as the server exposes it: the contract's specs (`cuda_agent.api.sandbox`) plus
the implementations.

One table drives the HTTP routes, the OpenAPI document and `GET /v1/tools` (the schemas an agent loop
hands to the model), so the three cannot disagree with each other or with the client.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from cuda_agent.api.sandbox import (
    TOOL_SPECS,
    BashInput,
    BashOutputInput,
    BashOutputResult,
    BashResult,
    KillBashInput,
    TodoWriteInput,
    TodoWriteResult,
    ToolResult,
    ToolSpec,
)
from cuda_agent.sandbox.server import file_tools
from cuda_agent.sandbox.server.isolation import kill_group
from cuda_agent.sandbox.server.procs import run_foreground, start_background
from cuda_agent.sandbox.server.sessions import MAX_FINISHED_JOBS, Session, SessionManager, UnknownSessionError
from cuda_agent.sandbox.server.tool_workers import ToolWorkers
from cuda_agent.sandbox.server.workspace_fs import ToolError


@dataclass(frozen=True)
class ToolEnv:
    """What a tool implementation may use besides its session: the session manager and the worker pool."""

    manager: SessionManager
    workers: ToolWorkers


ToolImpl = Callable[[ToolEnv, Session, Any], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    """A contract spec (name, description, input and result models) with the server's implementation."""

    spec: ToolSpec
    impl: ToolImpl

    @property
    def name(self) -> str:
        return str(self.spec.name)

    @property
    def description(self) -> str:
        return self.spec.description

    @property
    def input_model(self) -> type[BaseModel]:
        return self.spec.input_model

    @property
    def result_model(self) -> type[ToolResult]:
        return self.spec.result_model


def _bash_argv(manager: SessionManager, session: Session, command: str) -> list[str]:
    argv = ["/bin/bash", "--noprofile", "--norc", "-c", command]
    env = manager.agent_env(session)
    writable = [str(session.directory)]
    spec = manager.isolation.agent_spec(session.slot, argv, env, str(session.workspace), writable)
    return manager.isolation.launch_argv(spec)


def ensure_open(session: Session) -> None:
    """Every tool call checks that its session still exists right before it starts work: a call queued
    behind the session's running calls must not start a process in a session deleted meanwhile."""
    if session.closing:
        raise UnknownSessionError(session.session_id)


def _forget_finished_jobs(session: Session) -> None:
    """Keep the newest MAX_FINISHED_JOBS finished jobs (and their unread output): server memory per
    session stays bounded however many jobs it has run."""
    finished = [bash_id for bash_id, job in session.jobs.items() if job.finished]
    for bash_id in finished[: max(0, len(finished) - MAX_FINISHED_JOBS)]:
        del session.jobs[bash_id]


async def bash(env: ToolEnv, session: Session, req: BashInput) -> BashResult:
    manager = env.manager
    cfg = manager.config
    ensure_open(session)
    if req.run_in_background:
        _forget_finished_jobs(session)
        running = [j for j in session.jobs.values() if j.status == "running"]
        if len(running) >= cfg.max_background_jobs:
            raise ToolError(
                f"{len(running)} background jobs are running (limit {cfg.max_background_jobs}); "
                "kill one with kill_bash first"
            )
        bash_id = f"bash_{uuid.uuid4().hex[:8]}"
        job = await start_background(
            bash_id,
            req.command,
            _bash_argv(manager, session, req.command),
            max_pending=cfg.output_limit_chars * 8,
        )
        if session.closing:  # deleted while it started: its kill loop has already run
            job.kill()
            raise UnknownSessionError(session.session_id)
        session.jobs[bash_id] = job
        return BashResult(
            output=f"Started background job {bash_id}; read its output with bash_output", bash_id=bash_id
        )
    timeout_s = min(req.timeout / 1000 if req.timeout else cfg.bash_default_timeout_s, cfg.bash_max_timeout_s)
    outcome = await run_foreground(
        _bash_argv(manager, session, req.command),
        timeout_s,
        cfg.output_limit_chars,
        session.command_groups,
        on_start=lambda pgid: kill_group(pgid) if session.closing else None,
    )
    output = outcome.output
    over = await manager.enforce_quota(session)
    if over:
        output += f"\n[{over}]"
    return BashResult(
        is_error=outcome.timed_out or outcome.exit_code != 0 or bool(over),
        output=output if output.strip() else f"(no output; exit code {outcome.exit_code})",
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        truncated=outcome.truncated,
        duration_s=outcome.duration_s,
    )


def _job(session: Session, bash_id: str) -> Any:
    job = session.jobs.get(bash_id)
    if job is None:
        known = ", ".join(session.jobs) or "none"
        raise ToolError(f"no background job {bash_id!r} in this session (known: {known})")
    return job


async def bash_output(env: ToolEnv, session: Session, req: BashOutputInput) -> BashOutputResult:
    job = _job(session, req.bash_id)
    await asyncio.sleep(0)  # let the pump deliver what is already in the pipe
    text, dropped = job.take_output(None)
    if req.filter:
        text = await env.workers.run(session.session_id, "filter_lines", req.filter, text)
    note = f"[{dropped} earlier bytes were dropped: output not read in time]\n" if dropped else ""
    status = job.status
    tail = f"\n[status: {status}" + (f", exit code {job.proc.returncode}]" if status != "running" else "]")
    if job.timed_out:
        limit = env.manager.config.background_job_timeout_s
        tail += f"\n[killed after {limit:g} s, the background job limit]"
    return BashOutputResult(
        output=note + text + tail, status=status, exit_code=job.proc.returncode, dropped_bytes=dropped
    )


async def kill_bash(env: ToolEnv, session: Session, req: KillBashInput) -> ToolResult:
    job = _job(session, req.bash_id)
    if job.status != "running":
        return ToolResult(output=f"job {req.bash_id} had already ended ({job.status})")
    job.kill()
    await job.proc.wait()
    return ToolResult(output=f"Killed background job {req.bash_id} and its process group")


WRITING_TOOLS = frozenset({"write", "edit", "multi_edit", "notebook_edit"})


def _in_worker(name: str) -> ToolImpl:
    """File tools run in a worker process: a slow pattern or a huge edit cannot stall other sessions.
    Those that write are refused while the session is over its quota, and the quota is measured after
    each of them, as after every command (restricted mode; root mode's tmpfs says ENOSPC itself)."""

    async def run(env: ToolEnv, session: Session, req: Any) -> ToolResult:
        ensure_open(session)
        writes = name in WRITING_TOOLS and not session.tmpfs
        if writes and session.quota_problem:
            raise ToolError(f"{session.quota_problem}: file writes are refused until files are deleted")
        result: ToolResult = await env.workers.run(session.session_id, name, session.fs, req)
        if writes:
            over = await env.manager.enforce_quota(session)
            if over:
                result = result.model_copy(update={"is_error": True, "output": f"{result.output}\n[{over}]"})
        return result

    return run


async def todo_write(env: ToolEnv, session: Session, req: TodoWriteInput) -> TodoWriteResult:
    ensure_open(session)
    return file_tools.todo_write(session.todos, req)


IMPLEMENTATIONS: dict[str, ToolImpl] = {
    "bash": bash,
    "bash_output": bash_output,
    "kill_bash": kill_bash,
    "read": _in_worker("read"),
    "write": _in_worker("write"),
    "edit": _in_worker("edit"),
    "multi_edit": _in_worker("multi_edit"),
    "glob": _in_worker("glob"),
    "grep": _in_worker("grep"),
    "notebook_edit": _in_worker("notebook_edit"),
    "todo_write": todo_write,
}
TOOLS: dict[str, Tool] = {name: Tool(spec, IMPLEMENTATIONS[name]) for name, spec in TOOL_SPECS.items()}
