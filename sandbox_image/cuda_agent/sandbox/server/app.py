"""The sandbox server's HTTP API (aiohttp): sessions, tools, judging, status, metrics, OpenAPI.

Routes are declared once in ROUTES with their request and response models; the same table validates
bodies, renders responses and generates /openapi.json. Handlers never let an exception reach aiohttp:
bad input is 400/422 naming the field, an unknown session 404, anything unexpected 500 with the server
still serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema

from cuda_agent.api.sandbox import (
    CreateSessionRequest,
    DeleteSessionResponse,
    ErrorResponse,
    EvaluateRequest,
    GpuStatus,
    JudgeResult,
    JudgeRun,
    ServerStatus,
    SessionInfo,
    SessionJudgeRequest,
    SessionList,
    TaskRef,
    ToolList,
    ToolResult,
)
from cuda_agent.sandbox.server.config import SandboxServerConfig
from cuda_agent.sandbox.server.isolation import Isolation
from cuda_agent.sandbox.server.judge_runner import Candidate, JudgeJob, JudgeService
from cuda_agent.sandbox.server.metrics import Metrics
from cuda_agent.sandbox.server.sessions import CapacityError, Session, SessionManager, UnknownSessionError
from cuda_agent.sandbox.server.tool_workers import ToolWorkers, cap_output
from cuda_agent.sandbox.server.tools import TOOLS, Tool, ToolEnv
from cuda_agent.sandbox.server.workspace_fs import ToolError
from cuda_agent.telemetry import attached, span

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20
# Probes and scrapes every few seconds would bury the episodes' traces; they are not traced.
UNTRACED_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json", "/v1/status"})
BUSY_WINDOW_S = 60.0
Handler = Callable[["SandboxServer", web.Request, Any], Awaitable[BaseModel | web.StreamResponse]]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    handler: Handler
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    content_type: str = "application/json"


def _package_version() -> str:
    try:
        return version("cuda-agent")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass
class _SessionGate:
    running: asyncio.Semaphore
    in_flight: int = 0


class SandboxServer:
    """Holds the server's parts; the aiohttp app's handlers are its methods via ROUTES."""

    def __init__(self, config: SandboxServerConfig, isolation: Isolation, gpus: int) -> None:
        self.config = config
        self.isolation = isolation
        self.gpus = gpus
        self.metrics = Metrics()
        self.judge = JudgeService(config, isolation, self.metrics, gpus)
        self.sessions = SessionManager(config, isolation, self.judge, self.metrics, gpus)
        self.tool_workers = ToolWorkers(
            config.tool_workers,
            config.max_tool_workers_per_session,
            config.tool_timeout_s,
            config.tool_memory_mib,
            config.output_limit_chars,
        )
        self.tool_env = ToolEnv(self.sessions, self.tool_workers)
        self._gates: dict[str, _SessionGate] = {}
        self.started = time.monotonic()
        self.version = _package_version()
        self._busy_samples: list[deque[tuple[float, float]]] = [deque() for _ in range(gpus)]
        self._scraped: ServerStatus | None = None  # the status a /metrics scrape reads, taken once per scrape
        self._register_gauges()

    # ------------------------------------------------------------------ status

    def _lock_states(self) -> list[Any]:
        return [lock.read() for lock in self.judge.gpu_locks]

    def _busy_fractions(self, states: list[Any]) -> list[float]:
        """Share of the last minute each GPU's lock was held, from (time, busy-seconds) samples."""
        now = time.time()
        fractions = []
        for samples, state in zip(self._busy_samples, states, strict=True):
            busy = state.busy_total_s + (now - state.held_since if state.held_since else 0.0)
            samples.append((now, busy))
            while len(samples) > 2 and samples[1][0] < now - BUSY_WINDOW_S:
                samples.popleft()
            t0, b0 = samples[0]
            fractions.append(
                min(1.0, (busy - b0) / (now - t0))
                if now - t0 > 1e-3
                else (1.0 if state.holder is not None else 0.0)
            )
        return fractions

    async def sample_busy(self) -> None:
        await asyncio.to_thread(self.status)

    def status(self) -> ServerStatus:
        states = self._lock_states()
        fractions = self._busy_fractions(states)
        per_gpu_sessions = [0] * self.gpus
        for s in self.sessions.sessions.values():
            if s.gpu is not None:
                per_gpu_sessions[s.gpu] += 1
        gpus = [
            GpuStatus(
                index=i,
                sessions=per_gpu_sessions[i],
                busy_fraction=fractions[i],
                lock_queue=st.queued,
                lock_held=st.holder is not None,
                lock_wait_total_s=st.wait_total_s,
            )
            for i, st in enumerate(states)
        ]
        m = self.metrics
        return ServerStatus(
            version=self.version,
            isolation="root" if self.isolation.is_root else "restricted",
            uptime_s=time.monotonic() - self.started,
            active_sessions=len(self.sessions.sessions),
            max_sessions=self.config.max_sessions,
            queued_judge_jobs=self.judge.waiting_for_slot + sum(st.queued for st in states),
            running_judge_jobs=self.judge.running,
            gpu_busy_fraction=sum(fractions) / len(fractions) if fractions else 0.0,
            gpus=gpus,
            build_cache_hits=int(m.counter_value("build_cache_hits_total")),
            build_cache_misses=int(m.counter_value("build_cache_misses_total")),
            judge_runs_total=int(m.counter_sum("judge_runs_total")),
            judge_intact=self.judge.intact,
            judge_zygote=self.judge.zygote_running,
            judge_zygote_preload=self.judge.zygote_preload,
        )

    def _register_gauges(self) -> None:
        m = self.metrics
        m.gauge("active_sessions", "sessions open now", lambda: [({}, len(self.sessions.sessions))])
        m.gauge("max_sessions", "session capacity", lambda: [({}, self.config.max_sessions)])
        m.gauge("running_judge_jobs", "judge processes running", lambda: [({}, self.judge.running)])
        m.gauge(
            "judge_intact",
            "1 while the judge files match their startup hashes",
            lambda: [({}, 1.0 if self.judge.intact else 0.0)],
        )
        m.gauge(
            "judge_zygote_up",
            "1 while judges are forked from a running zygote (0: exec'd, or the zygote is starting)",
            lambda: [({}, 1.0 if self.judge.zygote_running else 0.0)],
        )
        m.gauge(
            "judge_runs_in_flight",
            "judge runs admitted and not finished (waiting for a judge slot or running)",
            lambda: [({}, self.judge.waiting_for_slot + self.judge.running)],
        )
        # Read from the status taken once per scrape (render_metrics): it samples the GPU locks.
        m.gauge(
            "queued_judge_jobs",
            "judge runs waiting for a judge slot or a GPU lock",
            lambda: [({}, self._scrape().queued_judge_jobs)],
        )
        m.gauge(
            "gpu_busy_ratio",
            "share of the last minute the GPU lock was held",
            lambda: [({"gpu": str(g.index)}, g.busy_fraction) for g in self._scrape().gpus],
        )
        m.gauge(
            "gpu_lock_queue",
            "judge runs waiting for this GPU",
            lambda: [({"gpu": str(g.index)}, g.lock_queue) for g in self._scrape().gpus],
        )
        m.counter_callback(
            # Not `gpu_lock_wait_seconds_total`: that is the histogram gpu_lock_wait_seconds's family.
            "gpu_lock_queued_seconds_total",
            "time judge runs spent queued for this GPU's lock",
            lambda: [({"gpu": str(g.index)}, g.lock_wait_total_s) for g in self._scrape().gpus],
        )

    def _scrape(self) -> ServerStatus:
        return self._scraped if self._scraped is not None else self.status()

    def render_metrics(self, accept: str = "") -> tuple[bytes, str]:
        """/metrics and its content type: every family, the state-derived ones from one status snapshot."""
        self._scraped = self.status()
        try:
            return self.metrics.render(accept)
        finally:
            self._scraped = None

    # ------------------------------------------------------------------ handlers

    async def h_health(self, request: web.Request, body: None) -> web.StreamResponse:
        ok = self.judge.intact
        return web.json_response({"ok": ok, "judge_intact": ok}, status=200 if ok else 503)

    async def h_openapi(self, request: web.Request, body: None) -> web.StreamResponse:
        return web.json_response(openapi_document(self.version))

    async def h_metrics(self, request: web.Request, body: None) -> web.StreamResponse:
        accept = request.headers.get("Accept", "")
        exposition, content_type = await asyncio.to_thread(self.render_metrics, accept)
        return web.Response(body=exposition, headers={"Content-Type": content_type})

    async def h_status(self, request: web.Request, body: None) -> ServerStatus:
        return await asyncio.to_thread(self.status)

    async def h_tools(self, request: web.Request, body: None) -> ToolList:
        return tool_list()

    async def h_create(self, request: web.Request, body: CreateSessionRequest) -> SessionInfo:
        source = await self._task_source(body.task)
        try:
            session = await self.sessions.create(body, source)
        except CapacityError as exc:
            raise HttpError(503, str(exc)) from None
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        return session.info()

    async def h_list(self, request: web.Request, body: None) -> SessionList:
        return SessionList(sessions=[s.info() for s in self.sessions.sessions.values() if not s.closing])

    async def h_get(self, request: web.Request, body: None) -> SessionInfo:
        return self.sessions.get(request.match_info["session_id"]).info()

    async def h_delete(self, request: web.Request, body: None) -> DeleteSessionResponse:
        sid = request.match_info["session_id"]
        killed = await self.sessions.delete(sid)
        return DeleteSessionResponse(session_id=sid, deleted=True, processes_killed=killed)

    async def h_session_judge(self, request: web.Request, body: SessionJudgeRequest) -> JudgeRun:
        session = self.sessions.get(request.match_info["session_id"])
        async with self._admitted(session.session_id):
            return await self.sessions.judge_session(session, body.stage)

    async def h_evaluate(self, request: web.Request, body: EvaluateRequest) -> JudgeResult:
        if body.device == "cuda" and self.gpus == 0:
            raise HttpError(400, "device 'cuda' requested but this sandbox server has no GPU")
        source = await self._task_source(body.task)
        files = body.files if body.files is not None else {"model_new.py": body.model_new or ""}
        gpu = None
        if body.device == "cuda":
            queues = [st.queued for st in await asyncio.to_thread(self._lock_states)]
            gpu = queues.index(min(queues))
        slot = await self.sessions.evaluate_slot()
        try:
            run = await self.judge.run(
                JudgeJob(
                    stage="profile",
                    task_source=source,
                    candidate=Candidate(files=files),
                    device=body.device,
                    gpu=gpu,
                    options=body.judge,
                    slot=slot,
                    cache_dir=None,
                )
            )
        finally:
            self.sessions.release_evaluate_slot(slot)
        if run.result is None:
            status = 422 if run.exit_code == 2 else 503
            raise HttpError(status, run.error or "judge produced no result")
        return run.result

    async def _task_source(self, task: TaskRef) -> str:
        if task.source is not None:
            return task.source
        assert task.uri is not None
        if not task.uri.startswith("s3://"):
            raise HttpError(400, f"task.uri must be an s3:// URI, got {task.uri!r}")
        try:
            from cuda_agent.storage import StorageError, open_store
        except ImportError as exc:
            raise HttpError(400, f"s3 task references need cuda_agent.storage: {exc}") from None
        try:
            data = await asyncio.to_thread(lambda: open_store(task.uri or "").get_bytes(task.uri or ""))
        except (StorageError, ImportError) as exc:
            raise HttpError(400, f"cannot fetch task {task.uri}: {exc}") from None
        return data.decode("utf-8", "replace")

    @contextlib.asynccontextmanager
    async def _admitted(self, session_id: str) -> AsyncIterator[asyncio.Semaphore]:
        """Counts the session's requests in flight (429 past the limit), so one session cannot hold
        every connection and worker; yields the session's semaphore of running tool calls."""
        gate = self._gates.get(session_id)
        if gate is None:
            gate = self._gates[session_id] = _SessionGate(
                asyncio.Semaphore(self.config.max_tool_calls_per_session)
            )
        if gate.in_flight >= self.config.max_requests_per_session:
            raise HttpError(
                429,
                f"session {session_id} has {gate.in_flight} requests in flight "
                f"(limit {self.config.max_requests_per_session}); wait for them",
            )
        gate.in_flight += 1
        try:
            yield gate.running
        finally:
            gate.in_flight -= 1
            if gate.in_flight == 0:
                del self._gates[session_id]

    async def h_tool(self, tool: Tool, request: web.Request, body: BaseModel) -> BaseModel:
        session = self.sessions.get(request.match_info["session_id"])
        async with self._admitted(session.session_id) as running, running:
            # A judge run the command starts (`verify` over the session's judge channel) belongs under
            # this tool call; the channel's task carries the context of the request that created it.
            self.judge.tool_call_contexts[session.slot.index] = otel_context.get_current()
            try:
                return await self._run_tool(tool, session, body)
            finally:
                self.judge.tool_call_contexts.pop(session.slot.index, None)

    async def _run_tool(self, tool: Tool, session: Session, body: BaseModel) -> ToolResult:
        start = time.monotonic()
        try:
            result = await tool.impl(self.tool_env, session, body)
        except ToolError as exc:
            result = tool.result_model(is_error=True, output=str(exc))
        capped = cap_output(result.output, self.config.output_limit_chars)
        if capped is not result.output:
            result = result.model_copy(update={"output": capped})
        outcome = "error" if result.is_error else "ok"
        self.metrics.inc(
            "tool_calls_total", "tool calls, by tool and outcome", tool=tool.name, outcome=outcome
        )
        self.metrics.observe(
            "tool_call_seconds", "server-side tool call latency", time.monotonic() - start, tool=tool.name
        )
        session.touch()
        return result


def _tool_handler(tool: Tool) -> Handler:
    async def handler(server: SandboxServer, request: web.Request, body: Any) -> BaseModel:
        return await server.h_tool(tool, request, body)

    return handler


def _method(name: str) -> Handler:
    async def handler(
        server: SandboxServer, request: web.Request, body: Any
    ) -> BaseModel | web.StreamResponse:
        result: BaseModel | web.StreamResponse = await getattr(server, name)(request, body)
        return result

    return handler


SESSION = "/v1/sessions/{session_id}"
ROUTES: list[Route] = [
    Route("GET", "/healthz", "liveness; 503 once the judge files changed", _method("h_health")),
    Route("GET", "/openapi.json", "this API as an OpenAPI 3.1 document", _method("h_openapi")),
    Route("GET", "/metrics", "Prometheus metrics", _method("h_metrics"), content_type="text/plain"),
    Route(
        "GET", "/v1/status", "load and capacity for the autoscaler", _method("h_status"), None, ServerStatus
    ),
    Route(
        "GET", "/v1/tools", "the agent's tools with their input schemas", _method("h_tools"), None, ToolList
    ),
    Route(
        "POST",
        "/v1/sessions",
        "create a session from a task",
        _method("h_create"),
        CreateSessionRequest,
        SessionInfo,
        201,
    ),
    Route("GET", "/v1/sessions", "list sessions", _method("h_list"), None, SessionList),
    Route("GET", SESSION, "describe a session", _method("h_get"), None, SessionInfo),
    Route(
        "DELETE",
        SESSION,
        "delete a session and kill its processes",
        _method("h_delete"),
        None,
        DeleteSessionResponse,
    ),
    Route(
        "POST",
        SESSION + "/judge",
        "judge the session's workspace (compile | verify | profile)",
        _method("h_session_judge"),
        SessionJudgeRequest,
        JudgeRun,
    ),
    Route(
        "POST",
        "/v1/evaluate",
        "stateless reward: judge a candidate against a task",
        _method("h_evaluate"),
        EvaluateRequest,
        JudgeResult,
    ),
    *(
        Route(
            "POST",
            f"{SESSION}/tools/{t.name}",
            t.description,
            _tool_handler(t),
            t.input_model,
            t.result_model,
        )
        for t in TOOLS.values()
    ),
]


def _error(status: int, message: str, detail: list[dict[str, Any]] | None = None) -> web.Response:
    # A message may quote a file name that is not UTF-8; JSON must be.
    message = message.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    body = ErrorResponse(error=message, detail=detail).model_dump_json(exclude_none=True)
    return web.Response(text=body, status=status, content_type="application/json")


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()
    ]


async def _parse_body(request: web.Request, model: type[BaseModel]) -> BaseModel | web.Response:
    """The request body as `model`, or the 4xx that says why not: 413 too large, 400 not JSON (invalid
    UTF-8, lone surrogates, nesting or numbers beyond the parser's limits), 422 naming the field."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
    try:
        # pydantic's Rust JSON parser bounds recursion and number size and rejects invalid UTF-8 and
        # unpaired surrogates, none of which json.loads refuses.
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        detail = _validation_detail(exc)
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            invalid = next(e for e in detail if e["type"] == "json_invalid")
            return _error(400, f"request body is not valid JSON: {invalid['msg']}", detail)
        first = detail[0]
        return _error(422, f"invalid {model.__name__}: {first['loc']}: {first['msg']}", detail)


def _wrap(server: SandboxServer, route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    name = f"{route.method} {route.path}"

    async def handle(request: web.Request) -> web.StreamResponse:
        if route.path in UNTRACED_PATHS:
            return await _respond(server, route, request)
        # The caller's W3C traceparent makes this request's span a child of the caller's (the agent
        # loop's tool call), so one trace follows an episode into this server and its judge.
        with attached(request.headers), span(name, kind=SpanKind.SERVER) as current:
            current.set_attribute("http.request.method", route.method)
            current.set_attribute("http.route", route.path)
            if "session_id" in request.match_info:
                current.set_attribute("cuda_agent.session_id", request.match_info["session_id"])
            response = await _respond(server, route, request)
            current.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                current.set_status(StatusCode.ERROR, f"answered {response.status}")
            return response

    return handle


async def _respond(server: SandboxServer, route: Route, request: web.Request) -> web.StreamResponse:
    try:
        body = None
        if route.request is not None:
            parsed = await _parse_body(request, route.request)
            if isinstance(parsed, web.Response):
                return parsed
            body = parsed
        result = await route.handler(server, request, body)
        if isinstance(result, web.StreamResponse):
            return result
        text = result.model_dump_json(by_alias=True)
    except UnknownSessionError as exc:
        return _error(404, f"unknown session {exc.args[0]!r}")
    except HttpError as exc:
        return _error(exc.status, str(exc))
    except Exception as exc:  # the server keeps serving whatever one request does
        log.exception("%s %s failed", route.method, route.path)
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")
    return web.Response(text=text, status=route.status, content_type="application/json")


def tool_list() -> ToolList:
    return ToolList(tools=[t.spec.info() for t in TOOLS.values()])


def openapi_document(api_version: str) -> dict[str, Any]:
    models = {m for r in ROUTES for m in (r.request, r.response) if m is not None} | {ErrorResponse}
    _, schemas = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)],
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        op: dict[str, Any] = {"summary": r.summary, "operationId": _operation_id(r)}
        if "{session_id}" in r.path:
            op["parameters"] = [
                {"name": "session_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ]
        if r.request is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _ref(r.request)}},
            }
        ok: dict[str, Any] = {"description": "OK"}
        if r.response is not None:
            ok["content"] = {"application/json": {"schema": _ref(r.response)}}
        elif r.content_type == "text/plain":
            ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
        else:
            ok["content"] = {"application/json": {"schema": {"type": "object"}}}
        err = {"description": "error", "content": {"application/json": {"schema": _ref(ErrorResponse)}}}
        op["responses"] = {str(r.status): ok, "default": err}
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "cuda-agent sandbox server", "version": api_version},
        "paths": paths,
        "components": {"schemas": schemas.get("$defs", {})},
    }


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _operation_id(route: Route) -> str:
    words = [w for w in route.path.replace("{session_id}", "").split("/") if w and w != "v1"]
    return route.method.lower() + "_" + "_".join(w.replace(".", "_") for w in words)


async def _housekeeping(server: SandboxServer) -> None:
    """TTL reaping, the quota watchdog and busy-fraction sampling, every few seconds."""
    while True:
        await asyncio.sleep(min(5.0, server.config.session_ttl_s / 4))
        for step in (server.sessions.reap_expired, server.sessions.watch_quotas, server.sample_busy):
            try:
                await step()
            except Exception:  # one failed round must not end housekeeping
                log.exception("housekeeping step %s failed", step.__name__)


def _raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: sessions' connections and judge channels share it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def build_metrics_app(server: SandboxServer) -> web.Application:
    """The metrics-only listener (`metrics_port`): the same exposition as /metrics on the API port, and
    every other path 404, so what a scraper may reach is this one read-only page."""
    app = web.Application(client_max_size=1024)
    route = next(r for r in ROUTES if r.path == "/metrics")
    app.router.add_route("GET", "/metrics", _wrap(server, route))
    return app


def build_app(server: SandboxServer) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _wrap(server, route))

    async def lifecycle(app: web.Application) -> Any:
        _raise_open_files_limit()
        server.judge.prepare_dirs()
        server.sessions.prepare()
        server.status()  # the first busy sample: the busy fraction's window starts at startup
        task = asyncio.create_task(_housekeeping(server))
        # Imports torch and inductor once, in the background; the first judge run waits for it.
        zygote = asyncio.create_task(server.judge.zygote_for_judging())
        await server.tool_workers.prestart()
        yield
        server.tool_workers.close()
        task.cancel()
        zygote.cancel()
        await server.sessions.close_all()
        await server.judge.close()

    app.cleanup_ctx.append(lifecycle)
    return app
