"""Runs the judge CLI on a read-only snapshot of a candidate, as the slot's judge user, one GPU at a time.

The judge is only ever a subprocess (`python -m cuda_agent.sandbox.judge.cli TASK CANDIDATE --json
--options-json JSON`, the run's JudgeOptions as the contract's JSON):
its files are hashed at startup and re-checked before every run, and a changed hash stops all judging
(a tampered judge makes every later reward worthless). Builds run concurrently up to
`max_concurrent_judges`; on a GPU the judge itself takes the per-GPU FIFO lock (its state file is passed
in CUDA_AGENT_GPU_LOCK) around verify and profile only, so builds of many sessions overlap while no two
sessions' measurements do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span
from pydantic import ValidationError

from cuda_agent.api.judge import OPTIONS_JSON_FLAG
from cuda_agent.api.judge_files import (
    FROZEN_FILES,
    JUDGE_CACHE_ENV,
    JUDGE_CONTRACT_MODULES,
    JUDGE_SEED_ENV,
    JUDGE_USER,
    SKIP_DIRS,
    changed_paths,
    contract_dir,
    hash_judge_files,
    package_judge_dir,
)
from cuda_agent.api.sandbox import MAX_CANDIDATE_FILES
from cuda_agent.sandbox.gpu_lock import GPU_LOCK_ENV, GpuTicketLock
from cuda_agent.sandbox.server.config import SandboxServerConfig, default_judge_command
from cuda_agent.sandbox.server.isolation import Isolation, Slot, kill_group, kill_uid_processes
from cuda_agent.sandbox.server.judge_zygote import ISA_ANSWERS_ENV, JudgeZygote, ZygoteError
from cuda_agent.sandbox.server.metrics import Metrics
from cuda_agent.sandbox.server.models import Device, JudgeOptions, JudgeResult, JudgeRun, JudgeStage
from cuda_agent.sandbox.server.procs import end_group, spawn
from cuda_agent.sandbox.server.workspace_fs import remove_tree
from cuda_agent.telemetry import Stage, past_span, span

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 256 << 20
MAX_SNAPSHOT_FILES = MAX_CANDIDATE_FILES  # one home: the contract caps evaluate's `files` alike
_STDOUT_LIMIT = 8 << 20
_STDERR_TAIL = 4000
_SKIP_DIRS = {"__pycache__", ".git"}  # never part of a candidate's snapshot
_MAX_STEP_ATTRIBUTES = 64  # a judge of another version must not flood a span


def writable_judge_files(root: Path, mode: str) -> list[str]:
    """Judge paths an agent or judge uid could change (group/other-writable, or owned by non-root): under
    root, and the judge's contract modules of cuda_agent.api, which are hashed with it."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        paths += [Path(dirpath, name) for name in [".", *filenames]]
    paths += [contract_dir() / name for name in JUDGE_CONTRACT_MODULES]
    exposed = []
    for path in paths:
        st = os.lstat(path)
        if st.st_mode & 0o022 or (mode == "root" and st.st_uid != 0):
            exposed.append(str(path))
    return exposed


@dataclass
class Candidate:
    """Where the candidate lives before the snapshot: a workspace directory, or files given inline."""

    workspace: Path | None = None
    files: dict[str, str] | None = None


@dataclass(frozen=True)
class JudgeJob:
    """One judge run's inputs: what is judged (task, candidate), how far (stage, options), and where (device,
    GPU, the slot whose judge uid runs it, the session's build cache; None for /evaluate)."""

    stage: JudgeStage
    task_source: str
    candidate: Candidate
    device: Device
    gpu: int | None
    options: JudgeOptions
    slot: Slot
    cache_dir: Path | None


class JudgeService:
    def __init__(
        self, config: SandboxServerConfig, isolation: Isolation, metrics: Metrics, gpus: int
    ) -> None:
        self.config = config
        self.isolation = isolation
        self.metrics = metrics
        self.judge_dir = config.judge_dir or package_judge_dir()
        self.baseline = hash_judge_files(self.judge_dir)
        self.intact = True
        self.jobs_dir = config.state_dir / "jobs"
        self.gpu_dir = config.state_dir / "gpu"
        self.shared_cache = config.state_dir / "judge-cache"
        self.gpu_locks = [GpuTicketLock(self.gpu_dir / f"gpu{i}.lock") for i in range(gpus)]
        self.zygote_dir = config.state_dir / "judge-zygote"
        # Judges forked from a pre-started zygote (torch already imported) when the judge is this package's
        # own CLI; any other judge command is exec'd as given.
        self.use_zygote = config.judge_zygote == "on" and config.judge_command == default_judge_command()
        self.zygote: JudgeZygote | None = None
        self._zygote_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(config.max_concurrent_judges)
        # One judge run per session slot at a time: a run's cleanup kills every process of the slot's
        # judge uid, which must never be a later session's judge on the same slot.
        self._slot_locks: dict[int, asyncio.Lock] = {}
        self.waiting_for_slot = 0
        self.running = 0
        # Trace context of the tool call running in a session slot now (set by the server's tool handler):
        # the parent of a judge run the agent's command starts over the session's judge channel.
        self.tool_call_contexts: dict[int, otel_context.Context] = {}

    def prepare_dirs(self) -> None:
        group = self.isolation.judge_group if self.isolation.is_root else os.getgid()
        shared = [(self.shared_cache, 0o2770)] if self.config.shared_judge_cache else []
        dirs = ((self.jobs_dir, 0o711), (self.gpu_dir, 0o770), (self.zygote_dir, 0o700), *shared)
        for path, mode in dirs:
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, os.getuid(), os.getgid() if path in (self.jobs_dir, self.zygote_dir) else group)
            os.chmod(path, mode)
        for lock in self.gpu_locks:
            lock.create(group)
        exposed = writable_judge_files(self.judge_dir, self.isolation.mode) if self.judge_dir.is_dir() else []
        if exposed:
            log.warning(
                "judge files writable beyond the server: %s; the hash check is their only guard", exposed[:5]
            )

    def changed_judge_files(self) -> list[str]:
        return changed_paths(self.baseline, hash_judge_files(self.judge_dir))

    async def run(self, job: JudgeJob) -> JudgeRun:
        """One judge run, traced as a `judge_run` span with the judge's build / verify / profile phases
        as children (the judge process itself exports nothing: candidate code runs inside it)."""
        # A request for this run (/judge, /evaluate) is the current, live span. A run over the session's
        # judge channel finds only the long-ended span of the request that created the session: it goes
        # under the tool call running the agent's command instead.
        live = trace.get_current_span().is_recording()
        parent = None if live else self.tool_call_contexts.get(job.slot.index)
        token = otel_context.attach(parent) if parent is not None else None
        try:
            with span(
                Stage.JUDGE_RUN, stage=job.stage, device=job.device, gpu=job.gpu, slot=job.slot.index
            ) as current:
                run = await self._run(job)
                _trace_run(current, run)
                return run
        finally:
            if token is not None:
                otel_context.detach(token)

    async def _run(self, job: JudgeJob) -> JudgeRun:
        start = time.monotonic()
        changed = await asyncio.to_thread(self.changed_judge_files) if self.intact else []
        if changed or not self.intact:
            self.intact = False
            self.metrics.inc("judge_tamper_detected_total", "judge runs refused because judge files changed")
            error = (
                f"judge-tampered: judge files changed since startup ({', '.join(changed[:5]) or 'earlier'})"
            )
            return JudgeRun(stage=job.stage, error=error, text=f"{job.stage}: refused: {error}")
        self.waiting_for_slot += 1
        try:
            slot_lock = self._slot_locks.setdefault(job.slot.index, asyncio.Lock())
            await slot_lock.acquire()
            try:
                await self._slots.acquire()
            except BaseException:
                slot_lock.release()
                raise
        finally:
            self.waiting_for_slot -= 1
        queue_wait = time.monotonic() - start
        self.running += 1
        try:
            run = await self._run_in_slot(job)
        finally:
            self.running -= 1
            self._slots.release()
            slot_lock.release()
        run.queue_wait_s = queue_wait
        run.wall_s = time.monotonic() - start
        self._record(run)
        return run

    async def _run_in_slot(self, job: JudgeJob) -> JudgeRun:
        job_dir = self.jobs_dir / uuid.uuid4().hex[:16]
        try:
            candidate_arg = await asyncio.to_thread(
                self._snapshot, job_dir, job.task_source, job.candidate, job.slot
            )
            env = self._env(job_dir, job.device, job.gpu, job.cache_dir)
            argv = [
                *self.config.judge_command,
                str(job_dir / "task.py"),
                candidate_arg,
                "--device",
                job.device,
                "--json",
                "--no-service",  # rewards never come from a service a session could stand up
                OPTIONS_JSON_FLAG,  # the options as the contract's model, serialised once
                stage_options(job.stage, job.options).model_dump_json(exclude_none=True),
            ]
            scratch = str(job_dir / "scratch")
            writable = [scratch] + ([env[JUDGE_CACHE_ENV]] if JUDGE_CACHE_ENV in env else [])
            if job.gpu is not None and GPU_LOCK_ENV in env:  # the judge takes its GPU's lock itself
                lock = self.gpu_locks[job.gpu]
                writable += [str(lock.path), str(lock.owners_dir)]
            # The seed (checked at startup: no judge or agent can write it) is read, never written.
            readable = [str(job_dir), *([env[JUDGE_SEED_ENV]] if JUDGE_SEED_ENV in env else [])]
            spec = self.isolation.judge_spec(
                job.slot, argv, env, scratch, writable, readable, self.config.shared_judge_cache
            )
            run = None
            zygote = await self.zygote_for_judging()
            if zygote is not None:
                cli_args = argv[len(self.config.judge_command) :]
                with contextlib.suppress(ZygoteError):  # it died just now: this run is exec'd instead
                    run = await self._spawn_forked(job.stage, zygote, cli_args, spec, job_dir)
            if run is None:
                run = await self._spawn(job.stage, self.isolation.launch_argv(spec))
            if run.result is not None:
                run.lock_wait_s = run.result.lock_wait_s or 0.0
            return run
        except SnapshotError as exc:
            return JudgeRun(stage=job.stage, error=str(exc), text=f"{job.stage}: {exc}")
        finally:
            if self.isolation.is_root:
                await asyncio.to_thread(kill_uid_processes, job.slot.judge_uid)
            await asyncio.to_thread(remove_tree, job_dir)

    async def _spawn(self, stage: JudgeStage, argv: list[str]) -> JudgeRun:
        proc, exited = await spawn(argv, merge_stderr=False, limit=_STDOUT_LIMIT)
        assert proc.stdout is not None and proc.stderr is not None
        out_task = asyncio.create_task(_read_bounded(proc.stdout, _STDOUT_LIMIT))
        err_task = asyncio.create_task(_read_bounded(proc.stderr, _STDOUT_LIMIT))
        try:
            await asyncio.wait_for(exited.wait(), self.config.judge_timeout_s)
        except TimeoutError:
            return self._timed_out(stage)
        finally:
            # Also on cancellation (the agent's command was interrupted): stop judging for it.
            await end_group(proc)
            for task in (out_task, err_task):
                if not task.done():
                    task.cancel()
        stdout = out_task.result() if not out_task.cancelled() else b""
        stderr = err_task.result() if not err_task.cancelled() else b""
        return verdict(stage, proc.returncode, stdout, stderr)

    async def _spawn_forked(
        self, stage: JudgeStage, zygote: JudgeZygote, argv: list[str], spec: dict[str, Any], job_dir: Path
    ) -> JudgeRun:
        """The same judge, forked by the zygote instead of exec'd: its output goes to files in the job."""
        out, err = job_dir / "judge.stdout", job_dir / "judge.stderr"
        judge = await zygote.spawn(argv, spec, str(out), str(err))
        try:
            await asyncio.wait_for(judge.exited.wait(), self.config.judge_timeout_s)
        except TimeoutError:
            return self._timed_out(stage)
        finally:
            if judge.returncode is None:  # timed out, cancelled, or the zygote died: end it
                kill_group(judge.pid)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(judge.exited.wait(), 5)
        if judge.returncode is None:
            error = "judge zygote exited while judging"
            return JudgeRun(stage=stage, error=error, exit_code=None, text=f"{stage}: {error}")
        stdout, stderr = await asyncio.to_thread(lambda: (_read_file(out), _read_file(err)))
        return verdict(stage, judge.returncode, stdout, stderr)

    def _timed_out(self, stage: JudgeStage) -> JudgeRun:
        error = f"judge timed out after {self.config.judge_timeout_s:g} s"
        return JudgeRun(stage=stage, error=error, exit_code=None, text=f"{stage}: {error}")

    @property
    def zygote_running(self) -> bool:
        return self.use_zygote and self.zygote is not None and self.zygote.alive

    @property
    def zygote_preload(self) -> Literal["full", "minimal"] | None:
        level = self.zygote.hello.get("level") if self.zygote_running and self.zygote else None
        return "full" if level == "full" else "minimal" if level == "minimal" else None

    async def zygote_for_judging(self) -> JudgeZygote | None:
        """The running zygote, started (or restarted) on demand; None: judges are exec'd instead."""
        if not self.use_zygote:
            return None
        async with self._zygote_lock:
            if self.zygote is not None and self.zygote.alive:
                return self.zygote
            if self.zygote is not None:
                log.warning("judge zygote exited (code %s); starting a new one", self.zygote.proc.returncode)
                self.metrics.inc("judge_zygote_restarts_total", "judge zygotes started again after exiting")
            try:
                self.zygote = await JudgeZygote.start(
                    self.config.judge_command[0], self.zygote_env(), str(self.zygote_dir / "zygote.log")
                )
            except (ZygoteError, OSError) as exc:
                log.warning("%s; judges are exec'd instead (slower start, same checks)", exc)
                self.use_zygote = False
                return None
            hello = self.zygote.hello
            if "full_preload_error" in hello:
                log.warning("judge zygote: full preload refused (%s)", hello["full_preload_error"])
            log.info("judge zygote %d ready (%s preload)", self.zygote.proc.pid, hello.get("level"))
            return self.zygote

    def zygote_env(self) -> dict[str, str]:
        """The judges' environment, plus where the zygote keeps inductor's CPU ISA check outcomes: the
        server user's own cache, not the zygote's private HOME, so that every server of this user on this
        host shares them (judge_zygote._warm_cpu_isa)."""
        env = self._process_env(str(self.zygote_dir))
        env[ISA_ANSWERS_ENV] = str(Path.home() / ".cache" / "cuda-agent" / "inductor-cpu-isa")
        return env

    def _process_env(self, home: str) -> dict[str, str]:
        """What every judge process starts with, the zygote included: the allowlisted environment, the
        judge's PATH, a private HOME, and JUDGE_USER (without it a zygote run by a uid with no passwd
        entry fails its start-up and every judge is exec'd: ~10x slower cached runs on an H200)."""
        env = self.isolation.base_env()
        env.update(
            PATH=self._judge_path(),
            HOME=home,
            TMPDIR=home,
            USER=JUDGE_USER,
            LOGNAME=JUDGE_USER,
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONUNBUFFERED="1",
        )
        return env

    def _judge_path(self) -> str:
        return os.pathsep.join(
            [
                os.path.dirname(self.config.judge_command[0]),
                "/usr/local/cuda/bin",
                "/usr/local/bin",
                "/usr/bin",
                "/bin",
            ]
        )

    async def close(self) -> None:
        if self.zygote is not None:
            await self.zygote.close()

    def _env(self, job_dir: Path, device: Device, gpu: int | None, cache_dir: Path | None) -> dict[str, str]:
        env = self._process_env(str(job_dir / "scratch"))
        env.update(
            MAX_JOBS=str(max(1, (os.cpu_count() or 2) // self.config.max_concurrent_judges)),
            CUDA_VISIBLE_DEVICES=str(gpu) if device == "cuda" and gpu is not None else "",
        )
        if self.config.shared_judge_cache:
            cache_dir = self.shared_cache
        if self.config.judge_seed_dir is not None:
            env[JUDGE_SEED_ENV] = str(self.config.judge_seed_dir)
        if cache_dir is not None:
            env[JUDGE_CACHE_ENV] = str(cache_dir)
            env["TORCH_EXTENSIONS_DIR"] = str(cache_dir / "torch_extensions")
        if device == "cuda" and gpu is not None:
            env[GPU_LOCK_ENV] = str(self.gpu_locks[gpu].path)
        return env

    def _snapshot(self, job_dir: Path, task_source: str, candidate: Candidate, slot: Slot) -> str:
        """Copy task and candidate into a job directory the judge can read but not change."""
        root = self.isolation.is_root
        group = slot.judge_gid if root else os.getgid()
        job_dir.mkdir(mode=0o750)
        os.chown(job_dir, os.getuid(), group)
        scratch = job_dir / "scratch"
        scratch.mkdir(mode=0o700)
        if root:
            os.chown(scratch, slot.judge_uid, slot.judge_gid)
        if candidate.files is None and candidate.workspace is None:
            raise SnapshotError("no candidate given")
        target = job_dir / "candidate"
        if candidate.workspace is not None:
            files = _copy_workspace_bounded(candidate.workspace, target, group)
        else:
            inline = {k: v.encode() for k, v in (candidate.files or {}).items()}
            _write_tree(target, inline, group)
            files = list(inline)
        _write_file(job_dir / "task.py", task_source.encode(), group)
        has_kernels = any(_is_kernel_source(p) for p in files)
        if has_kernels or "model_new.py" not in files:
            return str(target)
        return str(target / "model_new.py")

    def _record(self, run: JudgeRun) -> None:
        outcome = "error" if run.result is None else f"reward{run.result.reward}"
        self.metrics.inc(
            "judge_runs_total", "judge processes run, by stage and outcome", stage=run.stage, outcome=outcome
        )
        self.metrics.observe(
            "judge_run_seconds", "wall time of judge runs, queueing included", run.wall_s, stage=run.stage
        )
        self.metrics.observe(
            "judge_queue_wait_seconds", "time judge runs waited for a judge slot", run.queue_wait_s
        )
        if run.result is not None and run.result.device == "cuda" and run.result.lock_wait_s is not None:
            self.metrics.observe(
                "gpu_lock_wait_seconds", "time judge runs waited for the GPU lock", run.result.lock_wait_s
            )
        if run.result is not None and run.result.build_cached is not None:
            name = "build_cache_hits_total" if run.result.build_cached else "build_cache_misses_total"
            self.metrics.inc(name, "judge builds served from (or missing) the build cache")


def _trace_run(current: Span, run: JudgeRun) -> None:
    """The run's outcome on its span, and the judge's phases (its `seconds`) as child spans laid end to
    end from when the judge process started (after the queue wait)."""
    current.set_attribute("cuda_agent.queue_wait_s", run.queue_wait_s)
    current.set_attribute("cuda_agent.lock_wait_s", run.lock_wait_s)
    if run.exit_code is not None:
        current.set_attribute("cuda_agent.exit_code", run.exit_code)
    result = run.result
    if result is None:
        current.set_attribute("cuda_agent.error", run.error or "no result")
        return
    current.set_attribute("cuda_agent.reward", result.reward)
    # The real judge's per-step breakdown (steps_s: references, worker_start, trials...) as attributes.
    steps = (result.model_extra or {}).get("steps_s")
    if isinstance(steps, dict):
        for name, seconds in list(steps.items())[:_MAX_STEP_ATTRIBUTES]:
            if isinstance(seconds, int | float):
                current.set_attribute(f"cuda_agent.steps_s.{name}", float(seconds))
    start_ns = time.time_ns() - int(max(0.0, run.wall_s - run.queue_wait_s) * 1e9)
    outcome: dict[str, dict[str, object]] = {
        "build": {"compiled": result.compiled, "build_cached": result.build_cached},
        "verify": {"correct": result.correct},
        "profile": {
            "speedup_vs_eager": result.speedup.get("eager"),
            "speedup_vs_compile": result.speedup.get("compile"),
        },
    }
    ran = {Stage.BUILD: True, Stage.VERIFY: result.compiled, Stage.PROFILE: result.correct}
    for phase in (Stage.BUILD, Stage.VERIFY, Stage.PROFILE):
        seconds = result.seconds.get(phase)
        if seconds is None or not ran[phase]:
            continue
        end_ns = start_ns + int(seconds * 1e9)
        past_span(phase, start_ns, end_ns, **outcome[phase])
        start_ns = end_ns


def verdict(stage: JudgeStage, code: int | None, stdout: bytes, stderr: bytes) -> JudgeRun:
    """The judge process's exit code and output, read as the judge contract says."""
    err_tail = stderr.decode("utf-8", "replace")[-_STDERR_TAIL:].strip()
    if code == 0:
        try:
            result = JudgeResult.model_validate(json.loads(stdout))
        except (ValueError, ValidationError) as exc:
            error = f"judge printed no valid result JSON: {str(exc)[:300]}"
            return JudgeRun(stage=stage, error=error, exit_code=code, text=f"{stage}: {error}\n{err_tail}")
        return JudgeRun(stage=stage, result=result, exit_code=code, text=summarize(stage, result))
    what = "judge rejected the task or arguments" if code == 2 else f"judge failed with exit code {code}"
    error = f"{what}: {err_tail.splitlines()[-1] if err_tail else '(no message)'}"
    return JudgeRun(stage=stage, error=error, exit_code=code, text=f"{stage}: {error}\n{err_tail}".strip())


def _read_file(path: Path, limit: int = _STDOUT_LIMIT) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


async def _read_bounded(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Everything until EOF, keeping at most `limit` bytes (the rest is read and dropped)."""
    data = bytearray()
    while chunk := await stream.read(1 << 16):
        data += chunk[: max(0, limit - len(data))]
    return bytes(data)


class SnapshotError(Exception):
    pass


# The judge has no build-only or verify-only mode yet: the early stages run its shortest profile (3 trials)
# and skip torch.compile, so they cost little beyond the build; their reward is not shown to the agent.
QUICK_PROFILE = {"profile_trials": 3, "compile_mode": "none"}


def stage_options(stage: JudgeStage, options: JudgeOptions) -> JudgeOptions:
    """The judge options of one stage: compile = 1 verify trial + quick profile; verify = quick profile."""
    values: dict[str, object] = options.model_dump(exclude_none=True)
    if stage == "compile":
        values.update(trials=1, **QUICK_PROFILE)
    elif stage == "verify":
        values.update(QUICK_PROFILE)
    return JudgeOptions.model_validate(values)


def _is_kernel_source(rel: str) -> bool:
    """The agent's own sources under kernels/ (the frozen binding files do not make a layout)."""
    name = os.path.basename(rel)
    return (
        rel.startswith("kernels/")
        and name not in FROZEN_FILES
        and name.endswith((".cu", ".cpp", ".cc", ".cuh", ".h", ".hpp"))
    )


def _copy_workspace_bounded(workspace: Path, target: Path, group: int) -> list[str]:
    try:
        return _copy_workspace(workspace, target, group)
    except RecursionError:  # os.fwalk recurses once per directory level
        raise SnapshotError("workspace nested too deeply to judge; remove the deep directories") from None
    except OSError as exc:  # the workspace itself is not a directory (or not one reachable without links)
        raise SnapshotError(f"the workspace cannot be read: {exc.strerror or exc}") from None


def _copy_workspace(workspace: Path, target: Path, group: int) -> list[str]:
    """Copy a workspace's regular files, opened without following symlinks, file by file (the server never
    holds the workspace in memory) and hole by hole: a sparse file takes no more room in the snapshot than
    in the workspace. One byte cap counts each file at the larger of its length and its allocated blocks,
    so neither a sparse nor a dense file can make a snapshot larger than the cap. Returns the paths."""
    copied: list[str] = []
    total = 0
    top = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    _make_dir(target, group)
    try:
        for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            for name in filenames:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
                except OSError:
                    continue  # symlinks, vanished files
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    total += max(st.st_size, st.st_blocks * 512)
                    if total > MAX_SNAPSHOT_BYTES or len(copied) >= MAX_SNAPSHOT_FILES:
                        raise SnapshotError(
                            f"workspace too large to judge (over {MAX_SNAPSHOT_BYTES >> 20} MiB or "
                            f"{MAX_SNAPSHOT_FILES} files); remove build outputs"
                        )
                    rel = os.path.normpath(os.path.join(dirpath, name))
                    _make_parents(target, rel, group)
                    _copy_sparse(fd, target / rel, st.st_size, group)
                    copied.append(rel)
                finally:
                    os.close(fd)
    finally:
        os.close(top)
    return copied


_COPY_CHUNK = 1 << 20


def _copy_sparse(src: int, dest: Path, size: int, group: int) -> None:
    """The first `size` bytes of `src` (its length when it was counted: a file still growing is cut
    there), copying only its data segments (SEEK_DATA / SEEK_HOLE) and leaving holes as holes."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    try:
        os.fchown(out, os.getuid(), group)
        offset = 0
        while offset < size:
            try:
                start = os.lseek(src, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole is left
                break
            end = min(size, os.lseek(src, start, os.SEEK_HOLE))
            while start < end:
                chunk = os.pread(src, min(_COPY_CHUNK, end - start), start)
                if not chunk:
                    break
                os.pwrite(out, chunk, start)
                start += len(chunk)
            offset = max(end, offset + 1) if start >= end else size
        os.ftruncate(out, size)
    finally:
        os.close(out)


def _make_dir(path: Path, group: int) -> None:
    path.mkdir(mode=0o750)
    os.chown(path, os.getuid(), group)


def _make_parents(target: Path, rel: str, group: int) -> None:
    for parent in reversed([p for p in Path(rel).parents if str(p) != "."]):
        if not (target / parent).exists():
            _make_dir(target / parent, group)


def _write_tree(target: Path, files: dict[str, bytes], group: int) -> None:
    _make_dir(target, group)
    for rel, data in files.items():
        norm = os.path.normpath(rel)
        if norm.startswith(("..", "/")) or "\x00" in norm:
            raise SnapshotError(f"candidate file path {rel!r} leaves the candidate directory")
        try:
            _make_parents(target, norm, group)
            _write_file(target / norm, data, group)
        except OSError as exc:  # "a" and "a/b" (the API refuses it too), or a repeated path
            raise SnapshotError(f"candidate file {rel!r} cannot be written: {exc.strerror or exc}") from None


def _write_file(path: Path, data: bytes, group: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "wb") as f:
        os.fchown(f.fileno(), os.getuid(), group)
        f.write(data)


def summarize(stage: JudgeStage, r: JudgeResult) -> str:
    """What `compile`, `verify` and `profile` print for the agent."""
    yes = {True: "yes", False: "no"}
    lines = [f"== {stage} ==", f"compiled: {yes[r.compiled]}"]
    if stage != "compile":
        lines.append(f"correct: {yes[r.correct]}")
    if r.error:
        lines.append(f"error: {r.error}")
    if r.violations:
        lines.append("violations:")
        lines += [f"  - {v}" for v in r.violations]
    if stage == "profile":
        t, s = r.timings_ms, r.speedup
        lines.append(
            "time (ms): candidate {} | eager {} | torch.compile {}".format(
                *(_ms(t.get(k)) for k in ("candidate", "eager", "compile"))
            )
        )
        lines.append(f"speedup: vs eager {_x(s.get('eager'))} | vs torch.compile {_x(s.get('compile'))}")
        lines.append(f"reward: {r.reward}")
    if r.build_log and (stage == "compile" or not r.compiled):
        tail = r.build_log.strip().splitlines()[-60:]
        lines.append("build log (last lines):")
        lines += tail
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}x"
