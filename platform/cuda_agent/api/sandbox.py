"""The sandbox's contract: every request and response body of its HTTP API and the agent's tool specs.

The client, the server and the platform's API models import this module, so it depends on pydantic
only (no aiohttp, no torch, no server module); what it says of the judge (its options, device and reward
scale) is cuda_agent.api.judge. Tool inputs use the agent's own argument names (`file_path`, `old_string`,
`-A`...), so an agent loop can forward a model's tool call unchanged. Every tool result carries `output`, the
text the model sees, and `is_error`: an error is a result the agent reads, never an HTTP failure.
`/v1/status` is camelCase because the operator's autoscaler reads it next to Kubernetes objects.
"""

from __future__ import annotations

import copy
import glob
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from cuda_agent.api.judge import Device, JudgeOptions, Reward

# The server's port: a pool's Service, NetworkPolicy and readiness probes, the trainer's sandbox URL and the
# operator's load probes all use it (the operator imports it from here).
SANDBOX_PORT = 8470
# A second listener that serves GET /metrics only: a NetworkPolicy can let Prometheus scrape it without
# letting the scraper reach the session API on SANDBOX_PORT.
SANDBOX_METRICS_PORT = 9470

# A candidate workspace holds at most this many files: the judge's snapshot refuses more.
MAX_CANDIDATE_FILES = 5000
MAX_PATH_CHARS = 4096
MAX_PATTERN_CHARS = 4096
JudgeStage = Literal["compile", "verify", "profile"]


def machine_gpus() -> int:
    """The GPUs a sandbox server on this machine shares when its config names no count (`gpus: None`):
    the device nodes /dev/nvidia0, /dev/nvidia1... The server and the operator's local executor both count
    them this way, so what a local run's sessions ask for is what its server judges on."""
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# ---------------------------------------------------------------- tasks, judge options, judge results


class TaskRef(_Strict):
    """A KernelBench-format task: inline source, or an s3:// reference fetched through cuda_agent.storage."""

    source: str | None = Field(
        default=None, description="the task's Python source (class Model, get_inputs...)"
    )
    uri: str | None = Field(default=None, description="s3://bucket/key of the task source")
    name: str = Field(default="task", pattern=r"^[A-Za-z0-9_.-]{1,128}$")

    @model_validator(mode="after")
    def _exactly_one(self) -> TaskRef:
        if (self.source is None) == (self.uri is None):
            raise ValueError("give exactly one of task.source or task.uri")
        return self


class JudgeResult(BaseModel):
    """The judge CLI's JSON as the server reads it: the judge's own verdict model
    (`cuda_agent.api.judge.JudgeVerdict`, the strict writer) loosened so that a judge command of
    another version or a stand-in still reads. Every field here is one of the writer's, with the writer's
    reward scale; nested objects read as maps; unknown keys are kept in `model_extra`. A test checks that
    every field is the writer's and that whatever the writer prints reads back unchanged."""

    model_config = ConfigDict(extra="allow")

    reward: Reward
    compiled: bool
    correct: bool
    violations: list[str] = []
    error: str | None = None
    timings_ms: dict[str, float | None] = {}
    speedup: dict[str, float | None] = {}
    cv: dict[str, float | None] = {}
    precision: str | None = None
    device: str | None = None
    build_log: str | None = None
    seconds: dict[str, float] = {}
    lock_wait_s: float | None = None
    build_cached: bool | None = None


class JudgeRun(_Strict):
    """One judge process as the server saw it: its result, or why there is none."""

    stage: JudgeStage
    result: JudgeResult | None = None
    error: str | None = Field(
        default=None, description="set when the judge produced no result (task error, crash)"
    )
    exit_code: int | None = None
    queue_wait_s: float = 0.0
    lock_wait_s: float = 0.0
    wall_s: float = 0.0
    text: str = Field(default="", description="the summary the agent's compile/verify/profile command prints")


# ---------------------------------------------------------------- sessions


class CreateSessionRequest(_Strict):
    task: TaskRef
    device: Device = "cpu"
    ttl_s: float | None = Field(
        default=None, gt=0, le=86400, description="idle lifetime; server default if None"
    )
    judge: JudgeOptions = JudgeOptions()


class BackgroundJobInfo(_Strict):
    bash_id: str
    command: str
    status: Literal["running", "exited", "killed"]
    exit_code: int | None = None


class SessionInfo(_Strict):
    session_id: str
    workspace: str
    device: Device
    gpu: int | None
    task_name: str
    created_at: float
    last_activity: float
    expires_at: float
    background_jobs: list[BackgroundJobInfo] = []
    judge_runs: int = 0


class SessionList(_Strict):
    sessions: list[SessionInfo]


class DeleteSessionResponse(_Strict):
    session_id: str
    deleted: bool
    processes_killed: int


class SessionJudgeRequest(_Strict):
    stage: JudgeStage = "profile"


def candidate_path_problem(path: str) -> str | None:
    """Why `path` cannot name a file inside a candidate workspace, or None: relative, normalised, no NUL."""
    if not path or len(path) > MAX_PATH_CHARS:
        return f"a path must have 1 to {MAX_PATH_CHARS} characters"
    if "\x00" in path or "\\" in path:
        return "a path must not contain NUL or backslash"
    if path.startswith("/"):
        return "a path must be relative to the workspace"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "a path must be normalised: no empty, '.' or '..' components"
    if any(len(part.encode()) > 255 for part in parts):
        return "a path component must be at most 255 bytes"
    return None


class EvaluateRequest(_Strict):
    """Stateless reward: a task and a candidate, judged once in a fresh workspace."""

    task: TaskRef
    model_new: str | None = Field(default=None, description="a model_new.py source (e.g. load_inline)")
    files: dict[str, str] | None = Field(
        default=None,
        max_length=MAX_CANDIDATE_FILES,
        description="a workspace in the CUDA Agent layout: relative path -> content",
    )
    device: Device = "cpu"
    judge: JudgeOptions = JudgeOptions()

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str] | None) -> dict[str, str] | None:
        for path in files or {}:
            problem = candidate_path_problem(path)
            if problem:
                raise ValueError(f"files[{path[:200]!r}]: {problem}")
        # A path cannot be both a file and a directory ("a" and "a/b"): the snapshot could hold only one.
        directories = {path.rsplit("/", i)[0] for path in files or {} for i in range(1, path.count("/") + 1)}
        clash = sorted(directories.intersection(files or {}))
        if clash:
            raise ValueError(f"files[{clash[0][:200]!r}]: is a file and also a directory of other files")
        return files

    @model_validator(mode="after")
    def _one_candidate(self) -> EvaluateRequest:
        if (self.model_new is None) == (self.files is None):
            raise ValueError("give exactly one of model_new or files")
        return self


class ErrorResponse(_Strict):
    error: str
    detail: list[dict[str, Any]] | None = None


# ---------------------------------------------------------------- tools


class ToolResult(_Strict):
    is_error: bool = False
    output: str = Field(default="", description="what the agent reads")


class BashInput(_Strict):
    command: str = Field(min_length=1, max_length=100_000)
    timeout: float | None = Field(
        default=None, gt=0, description="milliseconds, as the agent's Bash tool gives it"
    )
    run_in_background: bool = False
    description: str | None = None


class BashResult(ToolResult):
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    bash_id: str | None = None
    duration_s: float = 0.0


class BashOutputInput(_Strict):
    bash_id: str = Field(max_length=64)
    filter: str | None = Field(
        default=None,
        max_length=MAX_PATTERN_CHARS,
        description="regex (RE2 syntax: linear time); only matching lines are returned",
    )


class BashOutputResult(ToolResult):
    status: Literal["running", "exited", "killed"] | None = None
    exit_code: int | None = None
    dropped_bytes: int = 0


class KillBashInput(_Strict):
    bash_id: str = Field(alias="shell_id", max_length=64)


class ReadInput(_Strict):
    file_path: str = Field(max_length=MAX_PATH_CHARS)
    offset: int | None = Field(default=None, ge=1, description="first line to read (1-based)")
    limit: int | None = Field(default=None, ge=1, description="number of lines")


class ReadResult(ToolResult):
    total_lines: int | None = None


class WriteInput(_Strict):
    file_path: str = Field(max_length=MAX_PATH_CHARS)
    content: str


class EditInput(_Strict):
    file_path: str = Field(max_length=MAX_PATH_CHARS)
    old_string: str
    new_string: str
    replace_all: bool = False


class EditOperation(_Strict):
    old_string: str
    new_string: str
    replace_all: bool = False


class MultiEditInput(_Strict):
    file_path: str = Field(max_length=MAX_PATH_CHARS)
    edits: list[EditOperation] = Field(min_length=1, max_length=1000)


class EditResult(ToolResult):
    replacements: int = 0


class GlobInput(_Strict):
    pattern: str = Field(min_length=1, max_length=MAX_PATTERN_CHARS)
    path: str | None = Field(default=None, max_length=MAX_PATH_CHARS)


class GlobResult(ToolResult):
    files: list[str] = []


class GrepInput(_Strict):
    pattern: str = Field(
        max_length=MAX_PATTERN_CHARS, description="regex in RE2 syntax (linear time: no backreferences)"
    )
    path: str | None = Field(default=None, max_length=MAX_PATH_CHARS)
    glob: str | None = Field(default=None, max_length=MAX_PATTERN_CHARS)
    output_mode: Literal["content", "files_with_matches", "count"] = "files_with_matches"
    case_insensitive: bool = Field(default=False, alias="-i")
    line_numbers: bool = Field(default=True, alias="-n")
    before: int | None = Field(default=None, ge=0, le=100, alias="-B")
    after: int | None = Field(default=None, ge=0, le=100, alias="-A")
    context: int | None = Field(default=None, ge=0, le=100, alias="-C")
    head_limit: int | None = Field(default=None, ge=1)
    multiline: bool = False


class GrepResult(ToolResult):
    matches: int = 0


class NotebookEditInput(_Strict):
    notebook_path: str = Field(max_length=MAX_PATH_CHARS)
    new_source: str = ""
    cell_id: str | None = None
    cell_type: Literal["code", "markdown"] | None = None
    edit_mode: Literal["replace", "insert", "delete"] = "replace"


class TodoItem(_Strict):
    content: str = Field(min_length=1)
    status: Literal["pending", "in_progress", "completed"]
    active_form: str | None = Field(default=None, alias="activeForm")
    id: str | None = None


class TodoWriteInput(_Strict):
    todos: list[TodoItem] = Field(max_length=1000)


class TodoWriteResult(ToolResult):
    todos: list[TodoItem] = []


class ToolInfo(_Strict):
    """A tool as `GET /v1/tools` lists it: name, description and the JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


class ToolList(_Strict):
    tools: list[ToolInfo]


# ---------------------------------------------------------------- status


class _Camel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class GpuStatus(_Camel):
    index: int
    sessions: int
    busy_fraction: float = Field(description="share of the last minute a judge held this GPU's lock")
    lock_queue: int
    lock_held: bool
    lock_wait_total_s: float


class ServerStatus(_Camel):
    """What the operator's autoscaler reads from GET /v1/status."""

    version: str
    isolation: Literal["root", "restricted"]
    uptime_s: float
    active_sessions: int
    max_sessions: int
    queued_judge_jobs: int = Field(description="judge runs waiting for a judge slot or a GPU lock")
    running_judge_jobs: int
    gpu_busy_fraction: float = Field(description="mean busy fraction over the GPUs (0 without GPUs)")
    gpus: list[GpuStatus]
    build_cache_hits: int
    build_cache_misses: int
    judge_runs_total: int
    judge_intact: bool = Field(description="False once a judge file's hash changed; no more runs then")
    judge_zygote: bool = Field(
        default=False, description="judges are forked from a running zygote (torch pre-imported)"
    )
    judge_zygote_preload: Literal["full", "minimal"] | None = Field(
        default=None,
        description="what the running zygote imported: full (torch, inductor, the judge) or minimal "
        "(torch and dynamo: the full preload failed its start-up checks, see the server log)",
    )


# ---------------------------------------------------------------- tool specs


class ToolName(StrEnum):
    """The agent's tools, by the name the server routes (`/v1/sessions/{id}/tools/<name>`)."""

    BASH = "bash"
    BASH_OUTPUT = "bash_output"
    KILL_BASH = "kill_bash"
    READ = "read"
    WRITE = "write"
    EDIT = "edit"
    MULTI_EDIT = "multi_edit"
    GLOB = "glob"
    GREP = "grep"
    NOTEBOOK_EDIT = "notebook_edit"
    TODO_WRITE = "todo_write"


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the contract states it; the server's tool table adds only the implementation."""

    name: ToolName
    description: str
    input_model: type[BaseModel]
    result_model: type[ToolResult]

    def input_schema(self) -> dict[str, Any]:
        """The input's JSON schema under the agent's argument names, with nested models inlined."""
        return inline_refs(self.input_model.model_json_schema(by_alias=True))

    def openai_schema(self) -> dict[str, Any]:
        """The OpenAI function-calling form, which open models' chat templates render as well."""
        parameters = _for_llm(self.input_schema())
        parameters.pop("description", None)
        return {
            "type": "function",
            "function": {"name": str(self.name), "description": self.description, "parameters": parameters},
        }

    def info(self) -> ToolInfo:
        return ToolInfo(name=self.name, description=self.description, input_schema=self.input_schema())


def inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Replace every `$ref` into `$defs` by a copy of its target: chat templates do not resolve refs."""
    defs: dict[str, Any] = schema.get("$defs", {})

    def resolve(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [resolve(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            if name in seen:
                raise ValueError(f"recursive schema {name!r} cannot be inlined")
            target = resolve(copy.deepcopy(defs[name]), (*seen, name))
            extra = {k: resolve(v, seen) for k, v in node.items() if k != "$ref"}
            return {**target, **extra}
        return {k: resolve(v, seen) for k, v in node.items() if k != "$defs"}

    resolved: dict[str, Any] = resolve(schema, ())
    return resolved


def _for_llm(node: Any) -> Any:
    """Drop generated titles and collapse `X | None = None` to X: less for a small model to read."""
    if isinstance(node, list):
        return [_for_llm(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _for_llm(v) for k, v in node.items() if k not in ("title", "properties")}
    if "properties" in node:
        out["properties"] = {name: _for_llm(sub) for name, sub in node["properties"].items()}
    variants = out.get("anyOf")
    if isinstance(variants, list) and len(variants) == 2 and {"type": "null"} in variants:
        if out.get("default", ...) is None:
            out.pop("default")
        (kept,) = [v for v in variants if v != {"type": "null"}]
        out.pop("anyOf")
        out = {**kept, **out}
    return out


TOOL_SPECS: dict[str, ToolSpec] = {
    s.name: s
    for s in (
        ToolSpec(
            ToolName.BASH,
            "Run a bash command in the workspace (fresh shell, no network). Foreground commands "
            "are killed after `timeout` ms; set run_in_background for long runs.",
            BashInput,
            BashResult,
        ),
        ToolSpec(
            ToolName.BASH_OUTPUT,
            "Read new output of a background job (optionally only lines matching `filter`).",
            BashOutputInput,
            BashOutputResult,
        ),
        ToolSpec(
            ToolName.KILL_BASH, "Kill a background job and everything it started.", KillBashInput, ToolResult
        ),
        ToolSpec(
            ToolName.READ,
            "Read a file with line numbers; `offset` (1-based) and `limit` select lines.",
            ReadInput,
            ReadResult,
        ),
        ToolSpec(ToolName.WRITE, "Create or overwrite a file.", WriteInput, ToolResult),
        ToolSpec(
            ToolName.EDIT,
            "Replace `old_string` with `new_string` in a file; old_string must be unique unless "
            "replace_all is set.",
            EditInput,
            EditResult,
        ),
        ToolSpec(
            ToolName.MULTI_EDIT,
            "Apply several edits to one file in order, all or none.",
            MultiEditInput,
            EditResult,
        ),
        ToolSpec(
            ToolName.GLOB,
            "List files matching a glob pattern (`**` for any depth), newest first.",
            GlobInput,
            GlobResult,
        ),
        ToolSpec(
            ToolName.GREP,
            "Search file contents with a regular expression; filter files with `glob`; "
            "output_mode content|files_with_matches|count; -A/-B/-C context lines.",
            GrepInput,
            GrepResult,
        ),
        ToolSpec(
            ToolName.NOTEBOOK_EDIT,
            "Replace, insert or delete a cell of a Jupyter notebook.",
            NotebookEditInput,
            ToolResult,
        ),
        ToolSpec(ToolName.TODO_WRITE, "Replace the session's todo list.", TodoWriteInput, TodoWriteResult),
    )
}
if set(TOOL_SPECS) != set(ToolName):  # one spec per name, checked when the contract is imported
    raise ImportError(f"TOOL_SPECS and ToolName disagree: {sorted(set(ToolName) ^ set(TOOL_SPECS))}")
