"""The messages that cross the orchestrator <-> worker channel (channel.py frames' JSON headers).

TypedDicts: free at run time (the worker stays free of pydantic), checked by mypy where each side builds
and reads them. They describe what an honest peer sends; the worker runs candidate code, so the orchestrator
still checks every value it relies on (`.get`, isinstance) before trusting it. Standard library only.

Order: config -> started -> [collect: collected] | [judge: baseline -> load -> imported -> models -> ready
-> trial -> trial_result (per trial) -> profile -> progress* -> profile_result -> finish -> bye]. Any
worker message may instead be one of the failure kinds (candidate_error, forged, task_error, judge_error).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

WorkerMode = Literal["collect", "judge"]

# --- orchestrator -> worker ---------------------------------------------------------------------------------


class WorkerConfig(TypedDict):
    """The first frame: what the worker is and where it works (`env`/`log` added when it is started)."""

    type: Literal["config"]
    mode: WorkerMode
    device: str
    precision: str
    compile_mode: str
    debug: bool
    baseline_cache: str | None
    home: str
    candidate_dir: str
    task_source: str
    task_path: str
    env: NotRequired[dict[str, str]]
    log: NotRequired[str]


class BaselineCommand(TypedDict):
    """Trusted preparation: the model's weight seed and the compile warm-up's input seed."""

    type: Literal["baseline"]
    weight_seed: int
    warmup_seed: int


class WorkspaceExtension(TypedDict):
    name: str
    path: str
    sha256: str


class InlineArtifact(TypedDict):
    path: str
    sha256: str


class LoadCommand(TypedDict):
    """The candidate's built extensions (workspace layout, and load_inline builds keyed by digest)."""

    type: Literal["load"]
    workspace_extensions: list[WorkspaceExtension]
    inline_artifacts: dict[str, InlineArtifact]


class ModelsCommand(TypedDict):
    type: Literal["models"]
    weight_seed: int


class TrialCommand(TypedDict):
    """One verify trial: its input seeds (drawn at trial time) and the shape of the expected outputs."""

    type: Literal["trial"]
    index: int
    order: str
    seed: int
    variant: str
    refill_seed: int
    refill_variant: str
    structure: Any
    meta: list[dict[str, Any]]
    output_bytes: list[int]
    task_mutates_inputs: bool


class ProfileCommand(TypedDict):
    """The timed loops: seeds, which calls are checked (`loops`), and ProfileSettings as a plain dict."""

    type: Literal["profile"]
    warmup_seed: int
    loops: dict[str, Any]
    order_seed: int
    structure: Any
    meta: list[dict[str, Any]]
    settings: dict[str, Any]
    task_mutates_inputs: bool


class FinishCommand(TypedDict):
    type: Literal["finish"]


Command = BaselineCommand | LoadCommand | ModelsCommand | TrialCommand | ProfileCommand | FinishCommand

# --- worker -> orchestrator ---------------------------------------------------------------------------------


class Started(TypedDict):
    type: Literal["started"]
    isolation: dict[str, str]


class Collected(TypedDict):
    """A collect worker's load_inline calls, recorded while importing the candidate."""

    type: Literal["collected"]
    specs: list[dict[str, Any]]
    import_error: str | None


class Imported(TypedDict):
    type: Literal["imported"]
    violations: list[str]
    ext_functions: list[str]
    custom_ops: list[str]
    notes: list[str]
    steps: dict[str, float]


class Ready(TypedDict):
    type: Literal["ready"]
    violations: list[str]


class CallReport(TypedDict):
    """One candidate call's checks and its outputs: described in `outputs`, sent as blobs, or exported to
    the orchestrator's device memory (`shared`, CUDA IPC)."""

    label: NotRequired[str]
    # what the recorders saw (observed calls only; recorder.CallRecord; tuples arrive as lists)
    ops: NotRequired[list[tuple[str, bool, int]]]
    profiler_ops: NotRequired[list[tuple[str, bool]]]
    ext_calls: NotRequired[dict[str, int]]
    kernels: NotRequired[list[dict[str, Any]]]
    current_stream: NotRequired[int | None]
    profiler_error: NotRequired[str | None]
    balanced: NotRequired[bool]
    violations: NotRequired[list[str]]
    outputs: NotRequired[list[dict[str, Any]]]
    shared: NotRequired[Any]
    ipc_error: NotRequired[str]


class TimedCallReport(CallReport):
    loop: str
    index: int


class TrialResult(TypedDict):
    type: Literal["trial_result"]
    index: int
    input_digest: str
    first: CallReport
    second: CallReport
    tamper: list[str]
    steps: dict[str, float]


class Progress(TypedDict):
    """Finished timed trials (display only)."""

    type: Literal["progress"]
    done: int


class ProfileResult(TypedDict):
    """Timings per function (`device`, `latency`, `host`: see timing.py and policy.py), the checked timed
    calls' outputs (`timed`) and what the worker saw."""

    type: Literal["profile_result"]
    method: str
    device: dict[str, Any]
    latency: dict[str, Any]
    host: dict[str, Any]
    notes: list[str]
    compile_seconds: float | None
    violations: list[str]
    timed: list[TimedCallReport]
    tamper: list[str]
    steps: dict[str, float]


class Bye(TypedDict):
    type: Literal["bye"]
    tamper: list[str]


class CandidateError(TypedDict):
    """Candidate code failed (`early_exit`: it tried to end the worker before reporting)."""

    type: Literal["candidate_error"]
    error: str
    early_exit: bool


class Forged(TypedDict):
    type: Literal["forged"]
    error: str


class TaskError(TypedDict):
    type: Literal["task_error"]
    error: str


class JudgeError(TypedDict):
    type: Literal["judge_error"]
    error: str


Report = Started | Collected | Imported | Ready | TrialResult | Progress | ProfileResult | Bye
Failure = CandidateError | Forged | TaskError | JudgeError
Message = WorkerConfig | Command | Report | Failure
