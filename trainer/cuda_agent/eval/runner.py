"""One evaluation run: judge every pending candidate (or run every pending episode) with `jobs` in flight,
append each row to results.jsonl as it finishes, then write the report.

Resumable: a rerun into the same directory skips keys already in results.jsonl (the last line of a key
wins; rows without a verdict, `no-result`, are tried again), and refuses to mix runs whose judge settings,
device or source differ (run.json records them).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from cuda_agent.api.judge import Device
from cuda_agent.eval.allclose import MARKER
from cuda_agent.eval.judging import Judge, LocalJudge, SandboxJudge, result_row, task_file
from cuda_agent.eval.models import AllcloseCheck, EvalConfig, EvalReport, TaskResult
from cuda_agent.eval.report import build_report, plot, to_markdown
from cuda_agent.eval.tasks import Candidate, Task, find_candidates, load_tasks

RESULTS = "results.jsonl"
RUN_FILE = "run.json"
_ALLCLOSE_TIMEOUT_S = 900.0


class ResultLog:
    """results.jsonl: one TaskResult per line, appended (and flushed) as each evaluation finishes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, TaskResult] = {}
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):  # end a line cut by a kill, so the next row starts fresh
                with path.open("a") as f:
                    f.write("\n")
            for number, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    row = TaskResult.model_validate_json(line)
                except ValueError:  # a line cut by a kill mid-write: that evaluation runs again
                    print(f"{path}:{number}: unreadable row skipped", file=sys.stderr)
                    continue
                self.rows[row.key] = row

    def done(self, key: str) -> bool:
        row = self.rows.get(key)
        return row is not None and row.status != "no-result"

    def append(self, row: TaskResult) -> None:
        self.rows[row.key] = row
        with self.path.open("a") as f:
            f.write(row.model_dump_json() + "\n")


def _identity(cfg: EvalConfig) -> dict[str, Any]:
    """What must agree for results in one directory to be one run's."""
    return {
        "tasks": cfg.tasks,
        "solutions": str(cfg.solutions) if cfg.solutions else None,
        "policy": cfg.policy,
        "device": cfg.device,
        "judge": cfg.judge.model_dump(),
    }


def check_run_file(cfg: EvalConfig) -> None:
    path = cfg.out_dir / RUN_FILE
    identity = _identity(cfg)
    if path.exists():
        before = json.loads(path.read_text())
        changed = [k for k in identity if before.get(k) != identity[k]]
        if changed:
            raise ValueError(
                f"--out {cfg.out_dir} holds results of another run ({', '.join(changed)} differ: "
                f"{ {k: before.get(k) for k in changed} }); use another --out directory"
            )
    path.write_text(json.dumps(identity, indent=2) + "\n")


async def _fan_out(
    items: Sequence[Any], jobs: int, work: Callable[[Any], Awaitable[None]], progress: bool, what: str
) -> None:
    from tqdm import tqdm

    bar = tqdm(total=len(items), desc=what, unit="eval", file=sys.stderr, disable=not progress)
    gate = asyncio.Semaphore(jobs)

    async def one(item: Any) -> None:
        async with gate:
            await work(item)
        bar.update(1)

    try:
        await asyncio.gather(*(one(item) for item in items))
    finally:
        bar.close()


def _verdict(output: str, exit_note: str) -> AllcloseCheck:
    verdicts = [line for line in output.splitlines() if line.startswith(MARKER)]
    if not verdicts:
        return AllcloseCheck(accepted=False, detail=f"no verdict ({exit_note})")
    return AllcloseCheck.model_validate_json(verdicts[-1].removeprefix(MARKER))


_WORKSPACE = AllcloseCheck(accepted=False, detail="not checked: a workspace needs our judge's build")


async def allclose_check(candidate: Candidate, device: str, workdir: Path) -> AllcloseCheck:
    """The plain harness (cuda_agent.eval.allclose) on a copy of the candidate, in a process of its own.
    UNCONFINED: candidate code runs with this user's rights (docs/eval.md)."""
    if candidate.is_workspace:
        return _WORKSPACE
    scratch = Path(tempfile.mkdtemp(prefix="allclose-", dir=workdir))
    try:
        model_new = scratch / "model_new.py"
        shutil.copyfile(candidate.model_new, model_new)
        task = task_file(candidate.task, workdir)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cuda_agent.eval.allclose", str(task), str(model_new), "--device", device,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=scratch,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), _ALLCLOSE_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return AllcloseCheck(accepted=False, detail="the harness timed out")
        return _verdict(out.decode(errors="replace"), f"harness exit {proc.returncode}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def sandbox_allclose_check(url: str, candidate: Candidate, device: Device) -> AllcloseCheck:
    """The same harness as an agent command in a fresh sandbox session: the server's agent confinement
    (its own uid, namespaces, seccomp, Landlock, no network), the session's python, model.py as the task."""
    from cuda_agent.eval import allclose
    from cuda_agent.sandbox.client import SandboxClient, SandboxError

    if candidate.is_workspace:
        return _WORKSPACE
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", candidate.task.name)[:128] or "task"
    async with SandboxClient(url, timeout_s=_ALLCLOSE_TIMEOUT_S) as client:
        try:
            session = await client.create_session(candidate.task.source, device=device, name=name)
        except SandboxError as exc:
            return AllcloseCheck(accepted=False, detail=f"not checked: {exc}")
        sid = session.session_id
        try:
            harness = Path(allclose.__file__).read_text()
            await client.tool(sid, "write", {"file_path": "allclose_harness.py", "content": harness})
            await client.tool(
                sid, "write", {"file_path": "model_new.py", "content": candidate.model_new.read_text()}
            )
            command = f"python allclose_harness.py model.py model_new.py --device {device}"
            result = await client.tool(sid, "bash", {"command": command, "timeout": 600_000})
            return _verdict(result.output, "the harness printed none")
        except SandboxError as exc:
            return AllcloseCheck(accepted=False, detail=f"not checked: {exc}")
        finally:
            await client.delete_session(sid)


async def judge_solutions(
    cfg: EvalConfig, tasks: list[Task], log: ResultLog, progress: bool
) -> tuple[list[str], int, int | None]:
    """(keys of this run, evaluations made, GPUs they shared)."""
    assert cfg.solutions is not None
    candidates, missing = find_candidates(tasks, cfg.solutions, cfg.device)
    for task in missing:
        if not log.done(task.key):
            log.append(TaskResult(key=task.key, level=task.level, task=task.name, status="no-candidate",
                                  error=f"no candidate under {cfg.solutions}"))  # fmt: skip
    pending = [c for c in candidates if not log.done(c.key)]
    judge: Judge
    gpus = cfg.gpus
    if cfg.sandbox_url:
        sandbox = SandboxJudge(cfg.sandbox_url, cfg.judge, cfg.device)
        judge = sandbox
        if gpus is None and cfg.device == "cuda":
            gpus = len((await sandbox.client.status()).gpus) or None
    else:
        judge = LocalJudge(cfg.judge, cfg.device, cfg.out_dir)
        # Local judges all measure on the default device (cuda:0) under its lock.
        gpus = gpus or (1 if cfg.device == "cuda" else None)

    async def evaluate(candidate: Candidate) -> None:
        log.append(result_row(candidate, await judge.evaluate(candidate), cfg.solutions))

    try:
        await _fan_out(pending, cfg.jobs, evaluate, progress, "judge")
    finally:
        if isinstance(judge, SandboxJudge):
            await judge.close()
    if cfg.compare_allclose:
        # After all judging: the harness's own GPU work must not overlap a judge's timed calls.
        by_key = {c.key: c for c in candidates}
        unchecked = [
            by_key[k]
            for k, r in log.rows.items()
            if k in by_key and r.refused_not_build and r.allclose is None
        ]

        async def check(candidate: Candidate) -> None:
            if cfg.sandbox_url:
                verdict = await sandbox_allclose_check(cfg.sandbox_url, candidate, cfg.device)
            else:
                verdict = await allclose_check(candidate, cfg.device, cfg.out_dir)
            verdict.confined = bool(cfg.sandbox_url)
            log.append(log.rows[candidate.key].model_copy(update={"allclose": verdict}))

        await _fan_out(unchecked, min(cfg.jobs, 4), check, progress, "allclose")
    keys = [c.key for c in candidates] + [t.key for t in missing]
    return keys, len(pending), gpus


async def run_policy(
    cfg: EvalConfig, tasks: list[Task], log: ResultLog, progress: bool, options: dict[str, Any]
) -> tuple[list[str], int, int | None]:
    """One agent-loop episode per pending task against the sandbox at `cfg.sandbox_url`."""
    from cuda_agent.agent.config import AgentConfig
    from cuda_agent.agent.loop import AgentLoop
    from cuda_agent.agent.records import TrajectoryWriter
    from cuda_agent.api.sandbox import TaskRef
    from cuda_agent.eval.policy import PolicyBackends, PolicySpec, episode_row, load_codec
    from cuda_agent.rollout.base import SamplingParams
    from cuda_agent.sandbox.client import SandboxClient

    assert cfg.policy is not None and cfg.sandbox_url is not None
    spec = PolicySpec.parse(cfg.policy, **options.get("spec", {}))
    # A TrainingRun's evaluation episodes (--run): its maxTurnsEval, context and tools.
    if cfg.episode is not None:
        agent = AgentConfig.for_episode(cfg.episode, evaluation=True)
    else:
        agent = AgentConfig(max_turns=options.get("max_turns", 200))
    judging = {"device": cfg.device, "judge": cfg.judge.options()}
    agent = agent.model_copy(update={**judging, "judge_timeout_s": cfg.judge.timeout_s + 300})
    codec = load_codec(spec, [str(t) for t in agent.tools])
    backends = PolicyBackends(spec, codec, options.get("policy_device", "cpu"))
    sampling = SamplingParams(
        temperature=options.get("temperature", 0.0), max_tokens=options.get("max_tokens", 4096), seed=0
    )
    pending = [t for t in tasks if not log.done(t.key)]
    writer = TrajectoryWriter(str(cfg.out_dir / "trajectories"))
    async with SandboxClient(cfg.sandbox_url) as sandbox:
        gpus = cfg.gpus
        if gpus is None and cfg.device == "cuda":
            gpus = len((await sandbox.status()).gpus) or None

        async def episode(task: Task) -> None:
            loop = AgentLoop(backends.for_task(task), sandbox, codec, agent, writer)
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", task.name)[:128] or "task"
            episode_id = "eval-" + re.sub(r"[^A-Za-z0-9_.-]", "_", task.key)
            trajectory = await loop.run(TaskRef(source=task.source, name=name), sampling, episode_id)
            # The episode's verdict carries no device or precision: they are the ones this run asked for.
            row = episode_row(task, trajectory)
            log.append(row.model_copy(update={"device": cfg.device, "precision": cfg.judge.precision}))

        try:
            await _fan_out(pending, cfg.jobs, episode, progress, "episodes")
        finally:
            await writer.close()
            await backends.close()
    return [t.key for t in tasks], len(pending), gpus


def run(
    cfg: EvalConfig, *, progress: bool = True, policy_options: dict[str, Any] | None = None
) -> EvalReport:
    """The whole run: tasks, evaluations (resumed), report files in cfg.out_dir."""
    tasks = load_tasks(cfg.tasks, cfg.levels, cfg.only)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    check_run_file(cfg)
    log = ResultLog(cfg.out_dir / RESULTS)
    started = time.monotonic()
    if cfg.solutions is not None:
        keys, evaluated, gpus = asyncio.run(judge_solutions(cfg, tasks, log, progress))
    elif cfg.sandbox_url:
        keys, evaluated, gpus = asyncio.run(run_policy(cfg, tasks, log, progress, policy_options or {}))
    else:
        from cuda_agent.eval.policy import local_sandbox

        with local_sandbox() as url:
            local = cfg.model_copy(update={"sandbox_url": url})
            keys, evaluated, gpus = asyncio.run(run_policy(local, tasks, log, progress, policy_options or {}))
    wall = time.monotonic() - started
    rows = [log.rows[k] for k in keys if k in log.rows]
    report = build_report(cfg, rows, evaluated, wall, gpus)
    write_report(report, rows, cfg.out_dir)
    return report


def write_report(report: EvalReport, rows: Sequence[TaskResult], out_dir: Path) -> None:
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2) + "\n")
    (out_dir / "report.md").write_text(to_markdown(report, rows))
    plot(report, rows, out_dir)
