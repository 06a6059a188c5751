"""Clients of the sandbox server: `SandboxClient` (asyncio, for agent loops) and `SyncSandboxClient`.

    async with SandboxClient("http://127.0.0.1:8470") as sandbox:
        session = await sandbox.create_session(task_source, device="cuda")
        result = await sandbox.tool(session.session_id, "bash", {"command": "verify"})
        print(result.output)
        reward = (await sandbox.judge(session.session_id, "profile")).result
        await sandbox.delete_session(session.session_id)

Both speak the models of the contract module cuda_agent.api.sandbox (never a server module); a tool
call takes the tool's name and its input as the model emitted it, and returns the tool's typed result.
HTTP errors raise SandboxError with the server's message; tool failures are
results (`is_error`), not exceptions. Every request carries the trace context (W3C `traceparent`)
when OpenTelemetry is installed, so the server's spans join the caller's trace: SandboxClient's requests
are CLIENT spans of OpenTelemetry's aiohttp instrumentation where that is installed (the trainer's
dependencies); SyncSandboxClient's are CLIENT spans it makes itself with the same attributes
(`_client_span`), wherever cuda_agent.telemetry is importable.
"""

from __future__ import annotations

import functools
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from cuda_agent.api.judge import Device, JudgeOptions
from cuda_agent.api.sandbox import (
    TOOL_SPECS,
    CreateSessionRequest,
    DeleteSessionResponse,
    EvaluateRequest,
    JudgeResult,
    JudgeRun,
    JudgeStage,
    ServerStatus,
    SessionInfo,
    SessionJudgeRequest,
    SessionList,
    TaskRef,
    ToolList,
    ToolResult,
)

M = TypeVar("M", bound=BaseModel)


class SandboxError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"sandbox server answered {status}: {message}")
        self.status = status
        self.message = message


def _session_request(
    task_source: str | None,
    task_uri: str | None,
    device: Device,
    ttl_s: float | None,
    judge: JudgeOptions | None,
    name: str,
) -> CreateSessionRequest:
    return CreateSessionRequest(
        task=TaskRef(source=task_source, uri=task_uri, name=name),
        device=device,
        ttl_s=ttl_s,
        judge=judge or JudgeOptions(),
    )


def _tool_input(name: str, arguments: dict[str, Any] | BaseModel) -> tuple[str, BaseModel, type[ToolResult]]:
    if name not in TOOL_SPECS:
        raise ValueError(f"unknown tool {name!r}; tools: {', '.join(TOOL_SPECS)}")
    tool = TOOL_SPECS[name]
    body = arguments if isinstance(arguments, BaseModel) else tool.input_model.model_validate(arguments)
    return f"tools/{name}", body, tool.result_model


def _http_trace_configs() -> list[Any]:
    """OpenTelemetry's aiohttp client instrumentation, as cuda_agent.telemetry configures it: a CLIENT
    span per request with the stable HTTP semantic conventions, whose context the request's
    `traceparent` carries. [] where it is not installed (OpenTelemetry is an optional dependency of this
    client); requests then carry the caller's context (_trace_headers)."""
    try:
        from cuda_agent.telemetry.tracing import http_client_trace_configs
    except ImportError:
        return []
    return http_client_trace_configs()


def _trace_headers() -> dict[str, str]:
    """The current span's W3C trace context headers; {} outside a span or without OpenTelemetry (an
    optional dependency of this client)."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    headers: dict[str, str] = {}
    propagate.inject(headers)
    return headers


@functools.cache
def _telemetry_importable() -> bool:
    """Whether OpenTelemetry and cuda_agent.telemetry can be imported here, asked once per process: a
    failed import searches sys.path again each time, and _client_span runs on every request."""
    try:
        import opentelemetry.trace  # noqa: F401

        import cuda_agent.telemetry.tracing  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def _client_span(method: str, url: str, headers: dict[str, str]) -> Iterator[Callable[[int], None]]:
    """A CLIENT span around one urllib request, named and described as OpenTelemetry's HTTP client
    instrumentations do (stable HTTP semantic conventions: `http.request.method`, `url.full`,
    `server.address`, `server.port`, then `http.response.status_code`, and `error.type` with an ERROR
    status for a 4xx/5xx answer or an exception), with `traceparent` in `headers` naming it. Yields the
    function that records the answer's status. OpenTelemetry's urllib instrumentation is not used: it
    replaces urllib's `OpenerDirector.open` for the whole process (it has no per-client switch) and takes
    its attribute names only from OTEL_SEMCONV_STABILITY_OPT_IN. Without cuda_agent.telemetry the request
    carries the caller's context and no span is made."""
    if not _telemetry_importable():
        headers.update(_trace_headers())
        yield lambda status: None
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    from cuda_agent.telemetry.tracing import tracer

    parts = urlsplit(url)
    attributes: dict[str, str | int] = {
        "http.request.method": method,
        # never credentials in a span: url.full leaves out a user:password@ part
        "url.full": urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])),
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
    }
    with tracer(__name__).start_as_current_span(method, kind=SpanKind.CLIENT, attributes=attributes) as span:
        headers.update(_trace_headers())  # the CLIENT span's context: the server's span is its child

        def answered(status: int) -> None:
            span.set_attribute("http.response.status_code", status)
            if status >= 400:
                span.set_attribute("error.type", str(status))
                span.set_status(Status(StatusCode.ERROR))

        try:
            yield answered
        except Exception as error:
            span.set_attribute("error.type", type(error).__qualname__)
            raise  # the span records the exception and an ERROR status


def _error_message(status: int, payload: bytes) -> SandboxError:
    try:
        message = json.loads(payload)["error"]
    except (ValueError, KeyError, TypeError):
        message = payload.decode("utf-8", "replace")[:500]
    return SandboxError(status, message)


class SandboxClient:
    """Async client; one aiohttp session with a connection pool sized for many concurrent sessions."""

    def __init__(self, base_url: str, timeout_s: float = 3600.0, max_connections: int = 256) -> None:
        import aiohttp

        self.base_url = base_url.rstrip("/")
        trace_configs = _http_trace_configs()
        # With the instrumentation, it injects its CLIENT span's context; without, the caller's is sent.
        self._inject_trace = not trace_configs
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            connector=aiohttp.TCPConnector(limit=max_connections),
            trace_configs=trace_configs,
        )

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

    async def _call(self, method: str, path: str, body: BaseModel | None, out: type[M]) -> M:
        data = body.model_dump_json(by_alias=True, exclude_none=True) if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self._inject_trace:
            headers.update(_trace_headers())
        async with self._http.request(method, f"{self.base_url}{path}", data=data, headers=headers) as resp:
            payload = await resp.read()
            if resp.status >= 400:
                raise _error_message(resp.status, payload)
        return out.model_validate_json(payload)

    async def create_session(
        self,
        task_source: str | None = None,
        *,
        task_uri: str | None = None,
        device: Device = "cpu",
        ttl_s: float | None = None,
        judge: JudgeOptions | None = None,
        name: str = "task",
    ) -> SessionInfo:
        req = _session_request(task_source, task_uri, device, ttl_s, judge, name)
        return await self._call("POST", "/v1/sessions", req, SessionInfo)

    async def get_session(self, session_id: str) -> SessionInfo:
        return await self._call("GET", f"/v1/sessions/{session_id}", None, SessionInfo)

    async def list_sessions(self) -> SessionList:
        return await self._call("GET", "/v1/sessions", None, SessionList)

    async def delete_session(self, session_id: str) -> DeleteSessionResponse:
        return await self._call("DELETE", f"/v1/sessions/{session_id}", None, DeleteSessionResponse)

    async def tool(self, session_id: str, name: str, arguments: dict[str, Any] | BaseModel) -> ToolResult:
        path, body, result_model = _tool_input(name, arguments)
        return await self._call("POST", f"/v1/sessions/{session_id}/{path}", body, result_model)

    async def judge(self, session_id: str, stage: JudgeStage = "profile") -> JudgeRun:
        return await self._call(
            "POST", f"/v1/sessions/{session_id}/judge", SessionJudgeRequest(stage=stage), JudgeRun
        )

    async def evaluate(self, request: EvaluateRequest) -> JudgeResult:
        return await self._call("POST", "/v1/evaluate", request, JudgeResult)

    async def status(self) -> ServerStatus:
        return await self._call("GET", "/v1/status", None, ServerStatus)

    async def tools(self) -> ToolList:
        return await self._call("GET", "/v1/tools", None, ToolList)


class SyncSandboxClient:
    """Blocking client on the standard library, for scripts and tests."""

    def __init__(self, base_url: str, timeout_s: float = 3600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Raw access: (status, body), errors included, for callers that check status codes."""
        url = f"{self.base_url}{path}"
        headers = {"Content-Type": "application/json"} if body else {}
        with _client_span(method, url, headers) as answered:
            req = urllib.request.Request(url, data=body, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    status, payload = resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                status, payload = exc.code, exc.read()
            answered(status)
        return status, payload

    def _call(self, method: str, path: str, body: BaseModel | None, out: type[M]) -> M:
        data = body.model_dump_json(by_alias=True, exclude_none=True).encode() if body is not None else None
        status, payload = self.request(method, path, data)
        if status >= 400:
            raise _error_message(status, payload)
        return out.model_validate_json(payload)

    def create_session(
        self,
        task_source: str | None = None,
        *,
        task_uri: str | None = None,
        device: Device = "cpu",
        ttl_s: float | None = None,
        judge: JudgeOptions | None = None,
        name: str = "task",
    ) -> SessionInfo:
        req = _session_request(task_source, task_uri, device, ttl_s, judge, name)
        return self._call("POST", "/v1/sessions", req, SessionInfo)

    def get_session(self, session_id: str) -> SessionInfo:
        return self._call("GET", f"/v1/sessions/{session_id}", None, SessionInfo)

    def delete_session(self, session_id: str) -> DeleteSessionResponse:
        return self._call("DELETE", f"/v1/sessions/{session_id}", None, DeleteSessionResponse)

    def tool(self, session_id: str, name: str, arguments: dict[str, Any] | BaseModel) -> ToolResult:
        path, body, result_model = _tool_input(name, arguments)
        return self._call("POST", f"/v1/sessions/{session_id}/{path}", body, result_model)

    def judge(self, session_id: str, stage: JudgeStage = "profile") -> JudgeRun:
        return self._call(
            "POST", f"/v1/sessions/{session_id}/judge", SessionJudgeRequest(stage=stage), JudgeRun
        )

    def evaluate(self, request: EvaluateRequest) -> JudgeResult:
        return self._call("POST", "/v1/evaluate", request, JudgeResult)

    def status(self) -> ServerStatus:
        return self._call("GET", "/v1/status", None, ServerStatus)
