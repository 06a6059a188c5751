"""The agent's tool set as the server exposes it: the contract's specs (`cuda_agent.sandbox.api`) plus
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

from cuda_agent.sandbox.api import (
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
from cuda_agent.sandbox.server.procs import run_foreground, start_background
from cuda_agent.sandbox.server.sessions import Session, SessionManager
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


async def bash(env: ToolEnv, session: Session, req: BashInput) -> BashResult:
    manager = env.manager
    cfg = manager.config
    if req.run_in_background:
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
        session.jobs[bash_id] = job
        return BashResult(
            output=f"Started background job {bash_id}; read its output with bash_output", bash_id=bash_id
        )
    timeout_s = min(req.timeout / 1000 if req.timeout else cfg.bash_default_timeout_s, cfg.bash_max_timeout_s)
    outcome = await run_foreground(
        _bash_argv(manager, session, req.command), timeout_s, cfg.output_limit_chars, session.command_groups
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


def _in_worker(name: str) -> ToolImpl:
    """File tools run in a worker process: a slow pattern or a huge edit cannot stall other sessions."""

    async def run(env: ToolEnv, session: Session, req: Any) -> ToolResult:
        result: ToolResult = await env.workers.run(session.session_id, name, session.fs, req)
        return result

    return run


async def todo_write(env: ToolEnv, session: Session, req: TodoWriteInput) -> TodoWriteResult:
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
