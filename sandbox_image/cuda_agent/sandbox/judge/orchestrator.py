"""The orchestrator: one judge run as a flat list of steps, ending in one result (trusted; never imports
candidate code).

hash judge files -> non-dumpable -> secret seed -> task -> private sealed copy -> static screen ->
worker started (boots while the candidate builds) -> build (collect process + trusted compile) ->
device lock -> references (its own, per trial, plus float64, kept on the device) -> worker: trusted
torch.compile baseline, candidate import, verify trials (fresh seeds at trial time, both orders,
poisoned memory, refilled buffers), profile (interleaved, device time) -> compare against its own
references -> milestone reward. Everything that runs device work holds the device lock.
Everything in the result comes from this process or from authenticated channel frames.
"""

from __future__ import annotations

import contextlib
import cProfile
import hashlib
import io
import json
import os
import pstats
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from cuda_agent.api.judge import JudgeVerdict, milestone_reward
from cuda_agent.api.judge_files import hash_judge_files
from cuda_agent.sandbox import gpu_lock
from cuda_agent.sandbox.judge import (
    build,
    compare,
    confinement,
    cuda_driver,
    inline,
    plausibility,
    policy,
    protocol,
    screen,
    tensors,
)
from cuda_agent.sandbox.judge import task as task_lib
from cuda_agent.sandbox.judge.config import JudgeConfig
from cuda_agent.sandbox.judge.errors import RunStopped, TaskFailure, UsageError
from cuda_agent.sandbox.judge.references import References, TrialReference, baseline_seeds, compute_references
from cuda_agent.sandbox.judge.worker_session import WorkerSession

JUDGE_DIR = Path(__file__).resolve().parent


def read_master_seed(seed_file: Path | None) -> bytes:
    """Fresh 32 random bytes (never time or pid). --seed-file reproduces a run: read if it exists, else
    the fresh seed is written there (mode 0600)."""
    if seed_file is None:
        return secrets.token_bytes(32)
    if seed_file.exists():
        try:
            return bytes.fromhex(seed_file.read_text().strip())
        except (OSError, ValueError) as exc:
            raise UsageError(f"--seed-file {seed_file}: not a hex seed ({exc})") from None
    seed = secrets.token_bytes(32)
    fd = os.open(seed_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(seed.hex() + "\n")
    return seed


class Orchestrator:
    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg
        self.result = JudgeVerdict(precision=cfg.precision, device=cfg.device, trials=cfg.trials)
        self.start = time.monotonic()
        self.deadline = self.start + cfg.timeouts.total
        self.cache = build.BuildCache(cfg.cache_dir)
        self.global_kernels: list[str] = []
        self.custom_ops: set[str] = set()
        self.output_digests: dict[str, int] = {}
        self.spares: dict[str, WorkerSession] = {}
        self.max_output_bytes = 1 << 20
        self.limits: plausibility.DeviceLimits | None = None
        # Phase events for the person at the terminal (cli.py): made here from this process's own
        # progress, never from anything the worker says.
        self.progress: Callable[[dict[str, Any]], None] | None = None
        self.task_source = ""  # the task file's text, read by load_task

    def emit(self, phase: str, done: int | None = None, total: int | None = None) -> None:
        if self.progress is not None:
            with contextlib.suppress(Exception):
                elapsed = round(time.monotonic() - self.start, 2)
                self.progress({"phase": phase, "done": done, "total": total, "elapsed_s": elapsed})

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Add this block's wall time to `steps_s[name]` (the per-step breakdown in the result)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.add_step(name, time.monotonic() - start)

    def add_step(self, name: str, seconds: float) -> None:
        steps = self.result.steps_s
        steps[name] = round(steps.get(name, 0.0) + seconds, 4)

    # Each step below is called once, in order, from `execute`.
    def load_task(self) -> Any:
        try:
            source = self.cfg.task.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read TASK {self.cfg.task}: {exc.strerror}") from None
        try:
            with contextlib.redirect_stdout(sys.stderr):
                task = task_lib.load_task(source, str(self.cfg.task))
        except task_lib.TaskError as exc:
            raise TaskFailure(str(exc)) from None
        self.task_source = source
        return task

    def screen(self, workspace: confinement.Workspace) -> list[str]:
        """Static screen, then the pre-build checks (screen.precheck_candidate): a candidate that cannot
        work is refused before any compiler runs. The candidate's copies of the frozen files are
        replaced by the judge's own (at the workspace root, where the CUDA Agent release has them), and
        the release's harness in utils/ is removed (build.remove_release_harness)."""
        root = workspace.candidate
        if not (root / "model_new.py").is_file():
            raise UsageError(f"CANDIDATE {self.cfg.candidate}: no model_new.py")
        self.result.notes += build.remove_frozen_copies(root)
        self.result.notes += build.remove_release_harness(root)
        found = screen.screen_tree(root)
        if not found:
            pre = screen.precheck_candidate(root, policy.static_compute_ops(self.cfg.ops))
            found += pre.violations
            if pre.errors and not found:
                self.result.error = "; ".join(pre.errors)
            elif pre.errors:
                self.result.notes += pre.errors
        build.install_frozen_files(root)
        return found

    def build_candidate(
        self, workspace: confinement.Workspace, toolchain: build.Toolchain
    ) -> tuple[list[build.BuiltExtension], list[build.BuiltExtension]]:
        """(workspace extensions, load_inline artifacts); records compiled/log/violations in the result."""
        self.emit("build")
        phase_start = time.monotonic()
        deadline = min(phase_start + self.cfg.timeouts.build, self.deadline)
        workspace_exts: list[build.BuiltExtension] = []
        inline_exts: list[build.BuiltExtension] = []
        logs: list[str] = []
        cached = True
        try:
            py_text = "".join(p.read_text(errors="replace") for p in workspace.candidate.rglob("*.py"))
            uses_inline = "load_inline" in py_text or "cpp_extension" in py_text
            sources = build.workspace_sources(workspace.candidate)
            if sources["binding"] or ((sources["cuda"] or sources["plain"]) and not uses_inline):
                outcome = build.build_workspace(workspace.candidate, toolchain, self.cache, deadline)
                logs.append(outcome.log)
                cached = cached and outcome.cached
                if not outcome.ok:
                    self.result.error = outcome.error
                    self.result.build_log = "".join(logs) or None
                    raise RunStopped()
                workspace_exts = outcome.extensions
                self.result.layout = "workspace"
            if uses_inline:
                specs, note = self.collect(workspace, deadline)
                if note:
                    logs.append(note)
                outcome = build.build_specs(
                    specs, workspace.candidate.resolve(), toolchain, self.cache, deadline
                )
                logs.append(outcome.log)
                cached = cached and outcome.cached
                self.result.violations += outcome.violations
                if outcome.violations:
                    raise RunStopped()
                if not outcome.ok:
                    self.result.error = outcome.error
                    self.result.build_log = "".join(logs)[: build.BUILD_LOG_LIMIT + 200] or None
                    raise RunStopped()
                inline_exts = outcome.extensions
                self.result.layout = self.result.layout or "inline"
        except build.BuildTimeout:
            self.result.error = f"timeout after {deadline - phase_start:.0f} s in build"
            raise RunStopped() from None
        finally:
            self.result.seconds.build = time.monotonic() - phase_start
            self.add_step("build", self.result.seconds.build)
            self.result.build_lock_wait_s = self.cache.lock_wait_s
        self.result.build_log = "".join(logs)[: build.BUILD_LOG_LIMIT + 200] or None
        self.result.build_cached = cached
        self.result.compiled = True
        return workspace_exts, inline_exts

    def collect(self, workspace: confinement.Workspace, deadline: float) -> tuple[list[dict[str, Any]], str]:
        """Run the candidate's import once with a recording load_inline (a separate, confined process)."""
        session = self.spares.pop("collect")
        try:
            session.start(workspace, self._worker_config("collect", workspace))
            session.enter("build", deadline - time.monotonic(), deadline)
            started, _ = session.receive("started", self.result)
            self.result.isolation.update({f"build_{k}": v for k, v in started["isolation"].items()})
            collected, _ = session.receive("collected", self.result)
        finally:
            session.close()
        note = ""
        if collected.get("import_error"):
            note = f"note: while collecting extension sources, {collected['import_error']}\n"
        try:
            specs = [_validated_spec(spec) for spec in collected.get("specs") or []]
        except (ValueError, inline.ExtensionError) as exc:
            self.result.error = f"build failed: {exc}"
            raise RunStopped() from None
        return specs, note

    def _worker_config(
        self, mode: protocol.WorkerMode, workspace: confinement.Workspace
    ) -> protocol.WorkerConfig:
        # The shared torch.compile cache: written only by judge workers before any candidate code runs.
        baseline_cache = self.cache.root / "baseline"
        baseline_cache.mkdir(mode=self.cache.dir_mode & 0o777, parents=True, exist_ok=True)
        return {
            "type": "config",
            "mode": mode,
            "device": self.cfg.device,
            "precision": self.cfg.precision,
            "compile_mode": self.cfg.compile_mode,
            "debug": bool(os.environ.get("CUDA_AGENT_JUDGE_DEBUG")),
            "baseline_cache": str(baseline_cache) if mode == "judge" else None,
            "home": str(workspace.home),
            "candidate_dir": str(workspace.candidate),
            "task_source": self.task_source,
            "task_path": str(self.cfg.task),
        }

    def _load_message(
        self, workspace_exts: list[build.BuiltExtension], inline_exts: list[build.BuiltExtension]
    ) -> protocol.LoadCommand:
        return {
            "type": "load",
            "workspace_extensions": [
                {"name": e.name, "path": e.path, "sha256": e.sha256} for e in workspace_exts
            ],
            "inline_artifacts": {e.digest: {"path": e.path, "sha256": e.sha256} for e in inline_exts},
        }

    def judge_outputs(
        self, report: protocol.CallReport, blobs: list[bytearray], refs: list[torch.Tensor], label: str
    ) -> tuple[list[torch.Tensor] | None, str | None]:
        """Decode and compare one call's outputs; violations go to the result, a wrong value is returned."""
        self.result.violations += report.get("violations", [])
        if report.get("violations") or "outputs" not in report:
            return None, None
        metas = report["outputs"]
        shared = "shared" in report
        if len(metas) != len(refs) or (not shared and len(metas) != len(blobs)):
            self.result.violations.append(f"output-structure: {len(metas)} outputs, expected {len(refs)}")
            return None, None
        try:
            outputs = self.received_outputs(report, metas, blobs, refs)
        except (ValueError, TypeError, AttributeError, KeyError, cuda_driver.DriverError) as exc:
            self.result.violations.append(f"output-forged: undecodable output ({exc})")
            return None, None
        verdict = compare.check_outputs(outputs, refs, self.cfg.tolerances, flags=self.result.task_flags)
        self.result.violations += verdict.violations
        return outputs, (f"wrong result: {label}: {verdict.wrong}" if verdict.wrong else None)

    def received_outputs(
        self, report: protocol.CallReport, metas: list[Any], blobs: list[bytearray], refs: list[torch.Tensor]
    ) -> list[torch.Tensor]:
        """One call's outputs in this process's memory, on the references' devices: copied out of the
        worker's exported device memory (CUDA IPC), or decoded from the frame's blobs."""
        if "shared" not in report:
            self.result.output_transfer = "channel"  # recorded if any call fell back
            if self.cfg.device == "cuda" and report.get("ipc_error"):
                note = f"outputs came through the channel: CUDA IPC failed ({report['ipc_error']})"
                if note not in self.result.notes:
                    self.result.notes.append(note)
            return [tensors.from_bytes(m, b).to(r.device) for m, b, r in zip(metas, blobs, refs, strict=True)]
        if self.cfg.device != "cuda" or not refs:
            raise ValueError("device-memory outputs on a run without CUDA outputs")
        outputs = cuda_driver.import_outputs(report["shared"], metas, refs[0].device, self.max_output_bytes)
        self.result.output_transfer = self.result.output_transfer or "cuda-ipc"
        return [t.to(r.device) for t, r in zip(outputs, refs, strict=True)]

    def verify(self, session: WorkerSession, refs: References) -> bool:
        cfg = self.cfg
        phase_start = time.monotonic()
        session.enter("verify", cfg.timeouts.verify, self.deadline)
        try:
            with self.step("worker_start"):
                started, _ = session.receive("started", self.result)
            self.result.isolation.update(started["isolation"])
            with self.step("candidate_import"):
                imported, _ = session.receive("imported", self.result)
            self.add_worker_steps(imported)
            self.result.notes += [str(n)[:8000] for n in imported.get("notes", [])]
            self.result.violations += imported["violations"]
            self.custom_ops = set(imported.get("custom_ops", []))
            if self.result.violations:
                return False
            with self.step("models"):
                session.send({"type": "models", "weight_seed": refs.weight_seed})
                ready, _ = session.receive("ready", self.result)
            self.result.violations += ready["violations"]
            if self.result.violations:
                return False
            for done, trial in enumerate(refs.trials):
                self.emit("verify", done, len(refs.trials))
                with self.step("trials.worker"):
                    session.send(trial.message(refs.structure, refs.meta, refs.mutates_inputs))
                    report, blobs = session.receive("trial_result", self.result)
                self.add_worker_steps(report)
                with self.step("trials.compare"):
                    if not self.check_trial(trial, report, blobs):
                        return False
            self.emit("verify", len(refs.trials), len(refs.trials))
            return True
        finally:
            self.result.seconds.verify = time.monotonic() - phase_start

    def add_worker_steps(
        self, report: protocol.Imported | protocol.TrialResult | protocol.ProfileResult
    ) -> None:
        """The worker's own breakdown (diagnostic only: it comes from the process running candidate code)."""
        steps = report.get("steps")
        if isinstance(steps, dict):
            for name, seconds in steps.items():
                if isinstance(name, str) and isinstance(seconds, (int, float)):
                    self.add_step(f"worker.{name[:40]}", float(seconds))

    def check_trial(
        self, trial: TrialReference, report: protocol.TrialResult, blobs: list[bytearray]
    ) -> bool:
        cfg = self.cfg
        label = f"trial {trial.index} ({trial.order})"
        if report.get("input_digest") != trial.input_digest:
            # The worker could not regenerate the inputs (task depends on environment or global state).
            self.result.error = f"task inputs are not reproducible in the worker (trial {trial.index})"
            return False
        first, second = report["first"], report.get("second") or {}
        self.result.violations += report.get("tamper", [])
        self.result.violations += policy.call_violations(
            first,
            device=cfg.device,
            policy=cfg.ops,
            custom_ops=self.custom_ops,
            global_kernels=self.global_kernels,
        )
        for note in policy.library_notes(first, cfg.ops, self.global_kernels):
            if note not in self.result.notes:
                self.result.notes.append(note)
        if first.get("profiler_error"):
            self.result.notes.append(f"profiler unavailable in verify: {first['profiler_error']}")
        if os.environ.get("CUDA_AGENT_JUDGE_DEBUG") and trial.index == 1:
            observed = {
                k: first.get(k) for k in ("ops", "profiler_ops", "ext_calls", "kernels", "current_stream")
            }
            self.result.notes.append("debug: trial 1 observations " + json.dumps(observed)[:6000])
        # Blobs of the first call come first, unless its outputs were exported instead (CUDA IPC).
        n = 0 if "shared" in first else len(trial.outputs)
        outputs, wrong = self.judge_outputs(first, blobs[:n], trial.outputs, label)
        if outputs is not None and wrong is None:
            digest = task_lib.values_digest(outputs)
            earlier = self.output_digests.get(digest)
            if earlier is not None:
                self.result.violations.append(
                    f"caching: trial {trial.index} returned trial {earlier}'s outputs"
                )
            self.output_digests[digest] = trial.index
            if cfg.precision == "strict-fp32" and trial.outputs64 is not None:
                for i, (out, r32, r64) in enumerate(
                    zip(outputs, trial.outputs, trial.outputs64, strict=True)
                ):
                    problem = compare.precision_violation(out, r32, r64, cfg.tolerances, i)
                    if problem:
                        self.result.violations.append(problem)
        if outputs is not None and wrong is None and second:
            refill, refill_wrong = self.judge_outputs(
                second, blobs[n:], trial.refill_outputs, f"{label[:-1]}, inputs refilled in place)"
            )
            if refill is not None and refill_wrong is not None:
                same = all(tensors.bitwise_equal(a, b) for a, b in zip(refill, outputs, strict=True))
                if same:
                    self.result.violations.append(
                        f"caching: trial {trial.index}: outputs not recomputed after the inputs were "
                        "refilled in place"
                    )
                else:
                    wrong = refill_wrong
        if wrong:
            self.result.error = self.result.error or wrong
            return False
        return not self.result.violations

    def profile(self, session: WorkerSession, refs: References) -> None:
        cfg = self.cfg
        settings = cfg.profile
        phase_start = time.monotonic()
        self.emit("profile", 0, settings.trials)
        session.on_progress = lambda done: self.emit(
            "profile", min(max(done, 0), settings.trials), settings.trials
        )
        session.enter("profile", cfg.timeouts.profile, self.deadline)
        session.send(
            {
                "type": "profile",
                "warmup_seed": refs.timed.warmup_seed,
                "loops": refs.timed.loops,
                "order_seed": refs.timed.warmup_seed & 0xFFFFFFFF,
                "structure": refs.structure,
                "meta": refs.meta,
                "settings": settings.model_dump(),
                "task_mutates_inputs": refs.mutates_inputs,
            }
        )
        try:
            report, blobs = session.receive("profile_result", self.result)
            self.emit("profile", settings.trials, settings.trials)
        finally:
            self.result.seconds.profile = time.monotonic() - phase_start
        self.add_worker_steps(report)
        self.result.violations += report.get("tamper", [])
        self.result.notes += report.get("notes", [])
        with self.step("profile.compare"):
            self.check_timed_outputs(report, blobs, refs)
        if self.result.violations:
            self.result.correct = False
            return
        self.record_timings(report, settings, refs.bounds)

    def check_timed_outputs(
        self, report: protocol.ProfileResult, blobs: list[bytearray], refs: References
    ) -> None:
        """Every checked timed call must have come back, each equal to the reference for its own values
        (and, under strict-fp32, as accurate as eager fp32): else `timed-wrong-result`."""
        res = self.result
        res.violations += [str(v)[:2000] for v in report.get("violations") or []]
        if report.get("violations"):
            return
        subs = report.get("timed")
        expected = set(refs.timed.calls)
        keys = [(s.get("loop"), s.get("index")) for s in subs] if isinstance(subs, list) else []
        if not isinstance(subs, list) or sorted(map(str, keys)) != sorted(map(str, expected)):
            res.violations.append("output-forged: the checked timed calls' outputs did not all come back")
            return
        offset, wrong = 0, []
        for sub in subs:
            call = refs.timed.calls[(sub["loop"], sub["index"])]
            label = f"{call.loop} loop, timed call {call.index}"
            metas = sub.get("outputs")
            shared = "shared" in sub
            n = 0 if shared else len(call.outputs)
            if not isinstance(metas, list) or len(metas) != len(call.outputs):
                res.violations.append(f"output-structure: {label}: outputs do not match the reference")
                return
            try:
                outputs = self.received_outputs(sub, metas, blobs[offset : offset + n], call.outputs)
            except (ValueError, TypeError, AttributeError, KeyError, cuda_driver.DriverError) as exc:
                res.violations.append(f"output-forged: undecodable output ({exc})")
                return
            offset += n
            verdict = compare.check_outputs(outputs, call.outputs, self.cfg.tolerances, flags=res.task_flags)
            problem = "; ".join([*verdict.violations, *([verdict.wrong] if verdict.wrong else [])])
            if problem:
                wrong.append(f"{label}: {problem}")
                continue
            if self.cfg.precision == "strict-fp32" and call.outputs64 is not None:
                for i, (out, r32, r64) in enumerate(zip(outputs, call.outputs, call.outputs64, strict=True)):
                    found = compare.precision_violation(out, r32, r64, self.cfg.tolerances, i)
                    if found:
                        res.violations.append(f"{found} ({label})")
        if wrong:
            res.violations.append(
                f"timed-wrong-result: {len(wrong)} of {len(subs)} checked timed calls wrong "
                f"(fresh values each trial); first: {wrong[0]}"[:2000]
            )

    def record_timings(
        self, report: protocol.ProfileResult, settings: Any, bounds: plausibility.TaskBounds
    ) -> None:
        res = self.result
        res.timing_method = report["method"]
        res.profile_trials = self.cfg.profile.trials
        device, latency = report["device"], report["latency"]
        for name in ("candidate", "eager", "compile"):
            if name in device:
                setattr(res.timings_ms, name, device[name]["median"])
                setattr(res.cv, name, device[name]["cv"])
            if name in latency:
                setattr(res.latency_ms, name, latency[name]["median"])
        if report.get("compile_seconds") is not None:
            res.notes.append(f"torch.compile warm-up took {report['compile_seconds']:.1f} s")
        violations, notes = policy.timing_violations(report, settings)
        res.violations += violations
        res.notes += notes
        cand = res.timings_ms.candidate
        if cand is None or cand <= 0:
            res.violations.append("no-custom-kernel: the timed candidate calls did no measurable device work")
            return
        if res.timings_ms.eager:
            res.speedup.eager = res.timings_ms.eager / cand
        if res.timings_ms.compile:
            res.speedup.compile = res.timings_ms.compile / cand
        if self.limits is not None:
            outcome = plausibility.judge_speed(bounds, self.limits, res.timings_ms.model_dump(), self.cfg)
            res.roofline = outcome.roofline
            res.notes += outcome.notes
            res.violations += outcome.violations

    def execute(self) -> JudgeVerdict:
        if self.cfg.device == "cuda" and torch.cuda._is_in_bad_fork():
            raise RuntimeError("this judge was forked from a process that used CUDA: it cannot use CUDA")
        # Forked first: no worker ever has the master seed, a key or a CUDA context in its memory.
        self.spares = {"judge": WorkerSession(), "collect": WorkerSession()}
        try:
            if self.cfg.device == "cuda":
                if not torch.cuda.is_available():
                    raise UsageError("--device cuda but no CUDA device is available")
                # The driver's set-up (~0.3 s) runs while the task loads and the candidate is screened
                # and built, off the path to the references. No kernel runs here.
                threading.Thread(target=_create_cuda_context, name="judge-cuda-context", daemon=True).start()
            return self.judge_with_workers()
        finally:
            for spare in self.spares.values():
                spare.close()

    def judge_with_workers(self) -> JudgeVerdict:
        res = self.result
        judge_hashes = hash_judge_files(JUDGE_DIR)
        res.isolation["judge_dumpable"] = confinement.make_non_dumpable()
        master = read_master_seed(self.cfg.seed_file)
        res.seed_id = hashlib.sha256(master).hexdigest()[:12]
        with self.step("task"):
            task = self.load_task()
        if not self.cfg.candidate.exists():
            raise UsageError(f"CANDIDATE {self.cfg.candidate} does not exist")
        try:
            workspace = confinement.make_workspace(self.cfg.candidate)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read CANDIDATE {self.cfg.candidate}: {exc}") from None
        try:
            # The screen runs first: a candidate it rejects earns -1 in about a second, without
            # reference forwards or a worker it would never get.
            self.emit("screen")
            with self.step("screen"):
                res.violations += self.screen(workspace)
                confinement.seal(workspace.candidate)
            if not res.violations and res.error is None:
                self.judge_candidate(task, master, workspace)
        except RunStopped:
            pass
        finally:
            if os.environ.get("CUDA_AGENT_JUDGE_KEEP"):
                res.notes.append(f"work directory kept (CUDA_AGENT_JUDGE_KEEP): {workspace.root}")
            else:
                workspace.cleanup()
        res.seconds.verify += res.steps_s.get("references", 0.0)
        if hash_judge_files(JUDGE_DIR) != judge_hashes:
            res.violations.append("judge-tampered: the judge's files changed during the run")
        res.violations = list(dict.fromkeys(res.violations))
        res.reward = milestone_reward(
            compiled=res.compiled,
            correct=res.correct and res.error is None,
            violations=res.violations,
            speedup_eager=res.speedup.eager,
            speedup_compile=res.speedup.compile,
            margin=self.cfg.margin,
        )
        return res

    def judge_candidate(self, task: Any, master: bytes, workspace: confinement.Workspace) -> None:
        toolchain = build.detect_toolchain(self.cfg.device)
        if self.cfg.device == "cpu":
            # References and comparisons share the host's cores with the worker and other judges; with
            # several OpenMP threads each op waits for descheduled ones (16 ms per isfinite over 262k
            # elements seen on a loaded 2-core host, 0.2 ms alone). Workers are already forked.
            torch.set_num_threads(1)
        # The worker boots (python, torch, CUDA context, Landlock; no candidate code, no kernels) while
        # the candidate builds on the CPU; it waits for "load", which is sent under the device lock.
        session = self.spares.pop("judge")
        try:
            session.start(workspace, self._worker_config("judge", workspace))
            workspace_exts, inline_exts = self.build_candidate(workspace, toolchain)
            self.global_kernels = sorted({k for e in workspace_exts + inline_exts for k in e.kernels})
            # Everything that runs device work happens under the lock: the references, the trusted
            # compile of the baseline, the candidate's import (which may launch kernels), verify, profile.
            with self.device_lock("verify"):
                # The worker compiles the baseline (trusted, no candidate code yet) while the references
                # are computed here; its benchmarks wait for "load", sent only after them (worker.gated).
                with self.step("device_limits"):
                    self.limits = self.device_limits()
                session.send(baseline_seeds(master))
                refs = self.references(task, master)
                # No frame from the worker legitimately carries a blob larger than the largest output.
                largest = max((t.nbytes for t in refs.trials[0].outputs), default=0)
                self.max_output_bytes = session.endpoint.max_blob_bytes = max(largest, 1 << 20)
                session.send(self._load_message(workspace_exts, inline_exts))
                if not self.verify(session, refs):
                    return
                self.result.correct = True
                self.profile(session, refs)
                if self.result.error is None:
                    with self.step("finish"):
                        session.send({"type": "finish"})
                        bye, _ = session.receive("bye", self.result)
                    self.result.violations += bye.get("tamper", [])
        finally:
            session.close()

    def device_limits(self) -> plausibility.DeviceLimits | None:
        """This device's bandwidth and peak FLOP/s, measured once per device and driver and cached in the
        judge's cache (trusted phase: no candidate code exists in any process yet, device lock held)."""
        try:
            return plausibility.device_limits(self.cache.root / "device-limits", self.cfg.device)
        except (OSError, RuntimeError, ValueError) as exc:
            self.result.notes.append(f"device limits unavailable, no plausibility bound: {exc}")
            return None

    def references(self, task: Any, master: bytes) -> References:
        try:
            with contextlib.redirect_stdout(sys.stderr), self.step("references"):
                refs = compute_references(task, master, self.cfg)
        except task_lib.TaskError as exc:
            raise TaskFailure(str(exc)) from None
        self.result.task_flags = refs.flags
        return refs

    @contextlib.contextmanager
    def device_lock(self, phase: str) -> Iterator[None]:
        """Hold this device's FIFO lock (docs/judge.md, "Device lock") so no other judge's verify or
        profile runs on it meanwhile; the wait counts against the total deadline only and is reported
        as `lock_wait_s`. Callers end their worker before leaving the block."""
        device = f"cuda:{torch.cuda.current_device()}" if self.cfg.device == "cuda" else "cpu"
        lock = gpu_lock.device_lock(device, self.cache.root / "locks")
        start = time.monotonic()
        try:
            hold = lock.acquire(timeout_s=max(0.0, self.deadline - start))
        except TimeoutError:
            self.result.lock_wait_s = time.monotonic() - start
            self.result.error = (
                f"timeout after {self.result.lock_wait_s:.0f} s waiting for the device lock "
                f"({gpu_lock.host_device(device)}) in {phase}"
            )
            raise RunStopped() from None
        self.result.lock_wait_s = hold.wait_s
        with hold:
            yield


def _create_cuda_context() -> None:
    # Device 0: torch's default, which the judge never changes (a slot sees its GPU as device 0). Any
    # failure shows again, with its reason, at this process's first CUDA call through torch.
    with contextlib.suppress(cuda_driver.DriverError):
        cuda_driver.create_primary_context(0)


def _validated_spec(spec: Any) -> dict[str, Any]:
    """Collected specs crossed a process that ran candidate code: check their shape, re-derive the digest."""
    if not isinstance(spec, dict) or not isinstance(spec.get("units"), list):
        raise ValueError("malformed extension spec")
    inline.check_name(spec.get("name"))
    for key in ("extra_cflags", "extra_cuda_cflags", "extra_ldflags", "include_dirs"):
        if not isinstance(spec.get(key), list) or not all(isinstance(v, str) for v in spec[key]):
            raise ValueError(f"extension spec field {key} is not a list of strings")
    for unit in spec["units"]:
        if not (
            isinstance(unit, dict)
            and unit.get("lang") in ("cxx", "cuda")
            and isinstance(unit.get("code"), str)
            and isinstance(unit.get("file"), str)
        ):
            raise ValueError("malformed translation unit in extension spec")
    spec["with_cuda"] = bool(spec.get("with_cuda"))
    spec["digest"] = inline.spec_digest(spec)
    return spec


def judge(cfg: JudgeConfig, progress: Callable[[dict[str, Any]], None] | None = None) -> JudgeVerdict:
    """Judge one candidate; raises UsageError / TaskFailure for problems that are not the candidate's.
    `progress` receives phase events ({"phase", "done", "total", "elapsed_s"}) as the run goes.
    With CUDA_AGENT_JUDGE_DEBUG set, where this process spent the run is appended to the notes."""
    run = Orchestrator(cfg)
    run.progress = progress
    if not os.environ.get("CUDA_AGENT_JUDGE_DEBUG"):
        return run.execute()
    profiler = cProfile.Profile()
    result = profiler.runcall(run.execute)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
    result.notes.append("debug: orchestrator profile\n" + text.getvalue()[-8000:])
    return result
