"""The judge's fixtures as data: example tasks, legitimate solutions and one candidate per known attack.

Shared by the CPU tests (tests/judge/test_*.py), the H200 script (tests/gpu/judge_gpu.py) and the
benchmark (bench/judge_bench.py), so it uses the standard library only (the GPU image has no pydantic).

Layout it reads:
  examples/tasks/<task>.py                                   KernelBench-format tasks
  examples/solutions/<task>/<variant>/                       variant: cpu | cpu_ws | cuda | cuda_ws
  tests/judge/attacks/<attack>/{model_new.py, expect.json}   plus kernels/ for self-contained workspaces
  tests/judge/attacks/_kit/<device>/kernels/                 shared honest kernels ("kit": true attacks)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO / "examples" / "tasks"
SOLUTIONS_DIR = REPO / "examples" / "solutions"
ATTACKS_DIR = REPO / "tests" / "judge" / "attacks"
KIT_DIR = ATTACKS_DIR / "_kit"

DEVICES = ("cpu", "cuda")
SOLUTION_VARIANTS = {"cpu": "cpu", "cpu_ws": "cpu", "cuda": "cuda", "cuda_ws": "cuda"}
# Error kinds an expectation may name, matched against the start of the report's `error`.
ERROR_KINDS = {"wrong-result": "wrong result", "timeout": "timeout", "crash": "crash"}
# Outcomes that are not violation codes: "pass" (reward >= 1, correct) and "build-failed" (compiled false).
OUTCOMES = ("pass", "build-failed")
# Violation codes of the judge's contract (docs/judge.md); an expect.json naming anything else is a typo.
VIOLATION_CODES = frozenset(
    {
        "static.thread",
        "static.process",
        "static.socket",
        "static.ctypes",
        "static.monkeypatch",
        "static.try-except",
        "static.inherits-model",
        "static.introspection",
        "static.judge-access",
        "static.cpp",
        "static.import",
        "torch-compute",
        "no-custom-kernel",
        "side-stream",
        "output-aliases-input",
        "input-mutated",
        "output-type",
        "output-structure",
        "output-shape",
        "output-dtype",
        "output-device",
        "nonfinite",
        "precision",
        "judge-tampered",
        "timing-mismatch",
        "caching",
        "early-exit",
        "output-forged",
        "timed-wrong-result",
        "implausible-speed",
    }
)
KNOWN_CODES = VIOLATION_CODES | set(ERROR_KINDS) | set(OUTCOMES)
EXPECT_KEYS = {"task", "devices", "kit", "expected", "attack", "stopped_by"}


class FixtureError(ValueError):
    """A fixture file is malformed; the message names the file and the field."""


@dataclass(frozen=True)
class Attack:
    """One attack candidate and the outcomes that count as the judge stopping it (any one suffices)."""

    name: str
    directory: Path
    task: str
    devices: tuple[str, ...]
    kit: bool
    expected: tuple[str, ...]
    attack: str
    stopped_by: str

    @property
    def task_path(self) -> Path:
        return TASKS_DIR / f"{self.task}.py"

    @property
    def is_workspace(self) -> bool:
        return self.kit or (self.directory / "kernels").is_dir()

    @property
    def static_only(self) -> bool:
        """Stopped by the static screen alone: nothing is built or run, so the test is fast."""
        return all(code.startswith("static.") for code in self.expected)

    @property
    def expects_pass(self) -> bool:
        return self.expected == ("pass",)


@dataclass(frozen=True)
class Solution:
    """A legitimate solution: must earn reward >= 1 with correct=true on its device."""

    task: str
    variant: str
    directory: Path

    @property
    def name(self) -> str:
        return f"{self.task}/{self.variant}"

    @property
    def device(self) -> str:
        return SOLUTION_VARIANTS[self.variant]

    @property
    def task_path(self) -> Path:
        return TASKS_DIR / f"{self.task}.py"

    @property
    def candidate(self) -> Path:
        """A workspace directory (kernels/ + model_new.py) or a single model_new.py file."""
        return self.directory if (self.directory / "kernels").is_dir() else self.directory / "model_new.py"


@dataclass(frozen=True)
class JudgeCliRun:
    """One judge process: its parsed report plus the raw streams for failure messages."""

    report: dict[str, Any]
    stdout: str
    stderr: str
    seconds: float


# run_judge(task, candidate, device="cpu", *extra_cli_args) -> JudgeCliRun  (the tests' fixture)
RunJudge = Callable[..., JudgeCliRun]


def _field(meta: dict[str, Any], key: str, kind: type, where: Path) -> Any:
    value = meta.get(key)
    if not isinstance(value, kind):
        raise FixtureError(f"{where}: field {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def _codes(meta: dict[str, Any], where: Path) -> tuple[str, ...]:
    expected = _field(meta, "expected", list, where)
    if not expected or not all(isinstance(code, str) and code for code in expected):
        raise FixtureError(f"{where}: field 'expected' must be a non-empty list of outcome codes")
    unknown = [code for code in expected if code not in KNOWN_CODES]
    if unknown:
        raise FixtureError(f"{where}: field 'expected': unknown code(s) {unknown}")
    if "pass" in expected and len(expected) > 1:
        raise FixtureError(f"{where}: field 'expected': 'pass' cannot be combined with failure codes")
    return tuple(expected)


def load_attack(directory: Path) -> Attack:
    where = directory / "expect.json"
    try:
        meta = json.loads(where.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise FixtureError(f"{where}: cannot read: {exc}") from exc
    if not isinstance(meta, dict):
        raise FixtureError(f"{where}: must hold a JSON object")
    unknown = set(meta) - EXPECT_KEYS
    if unknown:
        raise FixtureError(f"{where}: unknown field(s) {sorted(unknown)}")
    devices = _field(meta, "devices", list, where)
    if not devices or any(d not in DEVICES for d in devices):
        raise FixtureError(f"{where}: field 'devices' must list some of {DEVICES}, got {devices!r}")
    attack = Attack(
        name=directory.name,
        directory=directory,
        task=_field(meta, "task", str, where),
        devices=tuple(devices),
        kit=_field(meta, "kit", bool, where),
        expected=_codes(meta, where),
        attack=_field(meta, "attack", str, where),
        stopped_by=_field(meta, "stopped_by", str, where),
    )
    if not attack.task_path.is_file():
        raise FixtureError(f"{where}: field 'task': no task file {attack.task_path}")
    if not (directory / "model_new.py").is_file():
        raise FixtureError(f"{directory}: model_new.py is missing")
    return attack


def load_attacks(device: str | None = None) -> list[Attack]:
    """Every attack (or those that run on `device`), sorted by name."""
    attacks = [
        load_attack(d) for d in sorted(ATTACKS_DIR.iterdir()) if d.is_dir() and not d.name.startswith("_")
    ]
    return [a for a in attacks if device is None or device in a.devices]


def load_solutions(device: str | None = None) -> list[Solution]:
    """Every solution directory (or those for `device`), sorted by task then variant."""
    found: list[Solution] = []
    for task_dir in sorted(p for p in SOLUTIONS_DIR.iterdir() if p.is_dir()):
        if not (TASKS_DIR / f"{task_dir.name}.py").is_file():
            raise FixtureError(f"{task_dir}: no task examples/tasks/{task_dir.name}.py")
        for variant_dir in sorted(p for p in task_dir.iterdir() if p.is_dir()):
            if variant_dir.name not in SOLUTION_VARIANTS:
                raise FixtureError(f"{variant_dir}: variant must be one of {sorted(SOLUTION_VARIANTS)}")
            if not (variant_dir / "model_new.py").is_file():
                raise FixtureError(f"{variant_dir}: model_new.py is missing")
            found.append(Solution(task_dir.name, variant_dir.name, variant_dir))
    return [s for s in found if device is None or s.device == device]


def materialise(attack: Attack, device: str, workdir: Path) -> Path:
    """The candidate the judge is given: a clean copy (no expect.json), with the kit's kernels where used.

    Every kit attack gets byte-identical kernel sources, so the judge's content-addressed cache builds the
    kit once per device and serves every later attack from it.
    """
    target = workdir / attack.name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    # model_new.py and any other file at the root (the released layout keeps binding files there).
    for path in attack.directory.iterdir():
        if path.is_file() and path.name != "expect.json":
            shutil.copy2(path, target / path.name)
    if attack.kit:
        shutil.copytree(KIT_DIR / device / "kernels", target / "kernels")
    elif (attack.directory / "kernels").is_dir():
        shutil.copytree(attack.directory / "kernels", target / "kernels")
    return target if attack.is_workspace else target / "model_new.py"


def task_at_scale(task_path: Path, scale: str, workdir: Path) -> Path:
    """A copy of the task whose built-in default scale is `scale`.

    The judge's worker runs with a scrubbed environment, so CUDA_AGENT_TASK_SCALE set for the judge may not
    reach the worker's copy of the task; switching the default in the file itself keeps both sides on one
    shape set.
    """
    default_line = 'DEFAULT_SCALE = "small"'
    text = task_path.read_text()
    if text.count(default_line) != 1:
        raise FixtureError(f"{task_path}: expected exactly one line {default_line!r}")
    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / task_path.name
    copy.write_text(text.replace(default_line, f'DEFAULT_SCALE = "{scale}"'))
    return copy


def parse_single_json(stdout: str) -> dict[str, Any]:
    """The judge's stdout must be exactly one JSON object (whitespace around it is fine)."""
    text = stdout.strip()
    if not text:
        raise ValueError("stdout is empty")
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"stdout is not JSON: {exc}: {text[:300]!r}") from exc
    if text[end:].strip():
        raise ValueError(f"stdout holds more than one JSON value; after the first: {text[end:][:300]!r}")
    if not isinstance(value, dict):
        raise ValueError(f"stdout JSON is a {type(value).__name__}, not an object")
    return value


def outcome_codes(report: dict[str, Any]) -> set[str]:
    """Everything a report says went wrong: violation code prefixes, error kinds, build failure."""
    codes = {str(v).split(":", 1)[0].strip() for v in report.get("violations") or []}
    error = report.get("error") or ""
    codes |= {kind for kind, prefix in ERROR_KINDS.items() if error.startswith(prefix)}
    if report.get("compiled") is False:
        codes.add("build-failed")
    return codes


def judge_attack_verdict(attack: Attack, report: dict[str, Any]) -> str | None:
    """None when the report meets the attack's expectation, else why not (one line)."""
    reward = report.get("reward")
    if attack.expects_pass:
        if reward in (1, 2, 3) and report.get("correct") is True:
            return None
        return f"expected a pass (reward >= 1), got reward {reward}: {summarise(report)}"
    if reward != -1:
        return f"expected reward -1, got {reward}: {summarise(report)}"
    codes = outcome_codes(report)
    if not codes & set(attack.expected):
        got = sorted(codes) or "no violation"
        return f"expected one of {list(attack.expected)}, got {got}: {summarise(report)}"
    return None


def judge_solution_verdict(report: dict[str, Any]) -> str | None:
    if report.get("reward") in (1, 2, 3) and report.get("correct") is True:
        return None
    return f"expected reward >= 1 and correct, got reward {report.get('reward')}: {summarise(report)}"


def summarise(report: dict[str, Any]) -> str:
    """One line: reward, violations, error (trimmed) and speedups: what a failure message needs."""
    parts = [f"reward={report.get('reward')}"]
    if report.get("violations"):
        parts.append("violations=" + "; ".join(str(v)[:160] for v in report["violations"][:4]))
    if report.get("error"):
        parts.append(f"error={str(report['error'])[:300]!r}")
    speedup = report.get("speedup") or {}
    if speedup.get("eager") is not None or speedup.get("compile") is not None:
        parts.append(f"speedup eager={speedup.get('eager')} compile={speedup.get('compile')}")
    return " ".join(parts)


class ZygoteRunner:
    """Judges forked from one judge zygote (the session server's way), driven from a synchronous script
    (judge_bench, judge_gpu; any thread) through an event loop on its own thread. Its start-up is
    printed, not charged to evaluations. Imports cuda_agent only when constructed."""

    def __init__(self, env: dict[str, str], out: Path) -> None:
        from cuda_agent.sandbox.server.judge_zygote import JudgeZygote

        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.env = env
        started = time.monotonic()
        start = JudgeZygote.start(sys.executable, env, str(out / "zygote.log"), isolated=False)
        self.zygote = asyncio.run_coroutine_threadsafe(start, self.loop).result()
        hello = {k: v for k, v in self.zygote.hello.items() if k != "loaded"}
        seconds = time.monotonic() - started
        print(f"judge zygote ready in {seconds:.1f} s (once per server): {json.dumps(hello)}", flush=True)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.zygote.close(), self.loop).result()

    def run(
        self, argv: list[str], work: Path, timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        from cuda_agent.sandbox.server.isolation import unconfined_spec

        job = Path(tempfile.mkdtemp(prefix="job-", dir=work))
        spec = unconfined_spec([], {**self.env, **(env or {})}, str(REPO))

        async def judge() -> int | None:
            forked = await self.zygote.spawn(argv, spec, str(job / "out"), str(job / "err"))
            try:
                await asyncio.wait_for(forked.exited.wait(), timeout)
            except TimeoutError:
                os.killpg(forked.pid, 9)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            return forked.returncode

        code = asyncio.run_coroutine_threadsafe(judge(), self.loop).result()
        out, err = (job / "out").read_text(), (job / "err").read_text()
        return subprocess.CompletedProcess(argv, code if code is not None else -1, out, err)
