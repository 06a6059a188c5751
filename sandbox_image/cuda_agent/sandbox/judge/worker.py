"""The worker: an isolated process that imports and runs the candidate (forked by the orchestrator).

The orchestrator forks each worker before it holds any secret or CUDA context (docs/judge.md, "Process
model"): the child drops every inherited file descriptor but its two channel pipes, starts its own
session and dies with its parent. Before any candidate code runs it reads the channel key and its
config (scrubbed environment, log file, paths), confines itself (Landlock, no core dumps), binds the
judge functions it uses and fingerprints everything a candidate could patch. It receives each trial's
seed only when the trial starts, regenerates the inputs, runs the candidate under the recorders and
sends raw outputs and observations back; it never sees a reference output and never decides the reward.
Modes: "collect" (build phase: record load_inline sources) and "judge" (verify + profile). A judge
worker is configured while the candidate builds; it boots (CUDA context, Landlock, inductor imports)
and waits for "load". Then, still before any candidate code exists in the process, it compiles the
torch.compile baseline against the judge's shared inductor cache, seals that cache with a second
Landlock layer, and only then loads the candidate's extensions and imports model_new.py.
"""

from __future__ import annotations

import contextlib
import cProfile
import importlib
import importlib.util
import io
import os
import pstats
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, cast

import torch
import torch._dynamo

from cuda_agent.sandbox.judge import (
    backend_state,
    channel,
    confinement,
    cuda_driver,
    inline,
    protocol,
    recorder,
    tamper,
    tensors,
    timing,
)
from cuda_agent.sandbox.judge import task as task_lib

# Bound before candidate code exists in this process: the judge keeps using these even if patched.
_clone = torch.Tensor.clone
_copy = torch.Tensor.copy_
_no_grad = torch.no_grad
_bitwise_equal = tensors.bitwise_equal
_monotonic = time.monotonic
_is_grad_enabled = torch.is_grad_enabled
_set_grad_enabled = torch._C._set_grad_enabled

PR_SET_PDEATHSIG = 1


class CandidateFailure(Exception):
    """Candidate code raised (or asked to exit); the message is reported, the worker stops."""

    def __init__(self, message: str, *, early_exit: bool = False) -> None:
        super().__init__(message)
        self.early_exit = early_exit


def guarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """Call candidate code; anything it raises, SystemExit included, becomes a CandidateFailure."""
    try:
        return fn(*args)
    except SystemExit as exc:
        raise CandidateFailure(
            f"early-exit: candidate called exit({exc.code}) in {what}", early_exit=True
        ) from None
    except BaseException as exc:
        text = f"{type(exc).__name__}: {exc}".strip()
        raise CandidateFailure(f"{what} raised {text[:2000]}") from None


class Worker:
    def __init__(self, endpoint: channel.Endpoint, config: protocol.WorkerConfig) -> None:
        self.ep = endpoint
        self.config = config
        self.device: str = config["device"]
        self.home = Path(config["home"])
        self.candidate_dir = Path(config["candidate_dir"])
        self.registry: recorder.ExtensionRegistry | None = None
        self.task: types.ModuleType | None = None
        self.fingerprints: tamper.Fingerprints | None = None
        self.model: torch.nn.Module | None = None
        self.model_new: torch.nn.Module | None = None
        self.model_new_cls: type | None = None
        self.compiled: Callable[..., Any] | None = None
        self.baseline_notes: list[str] = []
        # Only a judge worker compiles the baseline; a collect worker runs candidate code from the start.
        self.shared_cache = bool(config.get("baseline_cache")) and config["mode"] == "judge"
        self.steps: dict[str, float] = {}
        # Output copies exported to the orchestrator (CUDA IPC): alive until its next command arrives,
        # by which time it has copied them into its own memory and unmapped them.
        self.exported: list[torch.Tensor] = []
        # The orchestrator's command that arrived while the baseline compile waited for it (`gated`).
        self.pending: dict[str, Any] | None = None
        self.gate_error: BaseException | None = None

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time a block for the orchestrator's per-step breakdown (sent, then reset, with each result)."""
        start = _monotonic()
        try:
            yield
        finally:
            self.steps[name] = self.steps.get(name, 0.0) + _monotonic() - start

    def take_steps(self) -> dict[str, float]:
        steps, self.steps = self.steps, {}
        return steps

    # -- start-up -------------------------------------------------------------------------------------------
    def isolate(self) -> dict[str, str]:
        confinement.no_core_dumps()
        report = {"worker_dumpable": confinement.make_non_dumpable()}
        if self.device == "cuda":
            torch.empty(1, device="cuda")  # open the device nodes before the filesystem is confined
        writable = [self.home]
        shared = self.config["baseline_cache"]
        if self.shared_cache and shared is not None:
            writable.append(Path(shared))
        report["landlock"] = confinement.confine_writes(writable, [Path("/dev")])
        # The shared cache is used only where a second Landlock layer can seal it before candidate code.
        self.shared_cache = self.shared_cache and report["landlock"].startswith("on")
        os.chdir(self.candidate_dir)
        return report

    def preload(self) -> None:
        """Import what the trusted compile needs while the candidate is still building (host work only)."""
        if self.config.get("compile_mode", "none") == "none":
            return
        with self.step("preload"):
            try:
                importlib.import_module("torch._inductor.compile_fx")
                importlib.import_module("torch._inductor.codecache")
                # Compile in this process: its environment said so when the worker was exec'd, but a
                # forked worker may inherit inductor's config from a parent that imported it earlier.
                setattr(importlib.import_module("torch._inductor.config"), "compile_threads", 1)  # noqa: B010
                if self.device == "cuda":
                    importlib.import_module("torch._inductor.runtime.triton_heuristics")
            except Exception as exc:  # the compile step reports inductor problems itself
                self.baseline_notes.append(f"inductor preload failed: {type(exc).__name__}: {exc}")

    def compile_baseline(self, weight_seed: int, warmup_seed: int) -> None:
        """torch.compile the task's Model before any candidate code runs (trusted phase), on warm-up
        inputs of the profile's shapes from a non-secret seed. With Landlock, inductor and triton use the
        judge's shared cache, writable only now: a warm cache makes this ~1 s instead of seconds."""
        assert self.task is not None
        mode = self.config.get("compile_mode", "none")
        if mode == "none":
            return
        shared = self.config["baseline_cache"]
        cache = Path(shared) if self.shared_cache and shared is not None else self.home
        private = {
            "TORCHINDUCTOR_CACHE_DIR": self.home / "inductor",
            "TRITON_CACHE_DIR": self.home / "triton",
        }
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
        os.environ["TRITON_CACHE_DIR"] = str(cache / "triton")
        _point_header_cache(cache / "inductor")
        start = _monotonic()
        profiler = cProfile.Profile() if self.config.get("debug") else None
        modules_before = set(sys.modules)
        try:
            model = task_lib.build_model(self.task, self.task.Model, weight_seed, self.device)
            inputs = task_lib.make_inputs(self.task, warmup_seed, "task", self.device)
            compiled = torch.compile(model, mode=mode)
            if profiler is not None:
                profiler.enable()
            with _no_grad():
                compiled(*inputs)
            if profiler is not None:
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
                self.baseline_notes.append("debug: compile profile\n" + text.getvalue()[-6000:])
                # What the judge zygote could preload (judge_zygote.PRELOAD_COMPILE).
                imported = sorted(set(sys.modules) - modules_before)
                self.baseline_notes.append(f"debug: modules the compile imported: {' '.join(imported)}")
            if self.device == "cuda":
                torch.cuda.synchronize()
            self.compiled = compiled
            where = "shared judge cache" if self.shared_cache else "private cache"
            self.baseline_notes.append(
                f"torch.compile baseline ({mode}) compiled before candidate code in "
                f"{_monotonic() - start:.1f} s ({where})"
            )
        except Exception as exc:  # inductor unusable here: no compile timing, never a crash
            # Trusted phase (no candidate code yet): where inductor failed is worth an operator's look.
            where = "".join(traceback.format_tb(_innermost(exc).__traceback__)[-3:])
            self.baseline_notes.append(
                f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:300]}\n{where[-1500:]}"
            )
        finally:
            self.steps["compile_baseline"] = _monotonic() - start
            # Any later (re)compile writes to the private cache; the shared one is sealed below.
            for key, value in private.items():
                os.environ[key] = str(value)
            _point_header_cache(private["TORCHINDUCTOR_CACHE_DIR"])
        if self.shared_cache:
            sealed = confinement.confine_writes([self.home], [Path("/dev")])
            if not sealed.startswith("on"):
                raise RuntimeError(f"could not seal the shared baseline cache: {sealed}")

    def import_candidate(self) -> types.ModuleType:
        path = self.candidate_dir / "model_new.py"
        spec = importlib.util.spec_from_file_location("model_new", path)
        if spec is None or spec.loader is None:
            raise CandidateFailure(f"cannot load {path.name}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["model_new"] = module
        guarded("import of model_new.py", spec.loader.exec_module, module)
        return module

    def collect(self) -> None:
        self.hide_processes()
        records: list[dict[str, Any]] = []
        inline.install_collector(records)
        # `import cuda_extension` must not stop the import before later load_inline calls.
        sys.modules.setdefault("cuda_extension", inline.placeholder_module("cuda_extension"))
        error = None
        try:
            module = self.import_candidate()
            # Some candidates call load_inline in ModelNew.__init__: construct one to collect those too.
            cls = getattr(module, "ModelNew", None)
            if isinstance(cls, type):
                task = task_lib.load_task(self.config["task_source"], self.config["task_path"])
                guarded("ModelNew construction", task_lib.build_model, task, cls, 0, self.device)
        except CandidateFailure as exc:
            error = str(exc)
        self.ep.send({"type": "collected", "specs": records, "import_error": error})

    def baseline(self, msg: protocol.BaselineCommand) -> None:
        """Trusted preparation: task, precision and the torch.compile baseline. The orchestrator computes
        its references meanwhile; anything in the compile that benchmarks waits for them (`gated`)."""
        cfg = self.config
        self.task = task_lib.load_task(cfg["task_source"], cfg["task_path"])
        task_lib.apply_precision(cfg["precision"])
        if self.device == "cpu":
            torch.set_num_threads(1)
        with self.gated():
            self.compile_baseline(int(msg["weight_seed"]), int(msg["warmup_seed"]))
        self.hide_processes()

    def hide_processes(self) -> None:
        """Before any candidate code: no other process's /proc/<pid> (their command lines), which a judge
        without a PID namespace of its own (a restricted pod without user namespaces) would show it."""
        hidden = confinement.hide_processes()
        if not hidden.startswith("on"):
            self.baseline_notes.append(f"other processes stay visible: {hidden}")

    @contextlib.contextmanager
    def gated(self) -> Iterator[None]:
        """Hold back every inductor benchmark (autotuning, pad_mm, max-autotune's choices) until the
        orchestrator's next command arrives, which it sends only after its reference forwards: a
        benchmark never shares the device with them, so the baseline's kernel choices are undisturbed.
        Modes other than "default", or an inductor whose benchmarker cannot be wrapped, wait before the
        compile instead. The wrappers are gone before candidate code runs."""
        wrapped = _wrap_benchmarks(self.await_command) if self.config.get("compile_mode") == "default" else []
        if not wrapped:
            self.await_command()
        try:
            yield
        finally:
            for cls, name, original in wrapped:
                setattr(cls, name, original)
        if self.gate_error is not None:  # the channel failed while inductor held the call: report it now
            raise self.gate_error

    def await_command(self) -> None:
        if self.pending is None and self.gate_error is None:
            try:
                self.pending = self.ep.receive()[0]
            except BaseException as exc:
                self.gate_error = exc
                raise

    def next_command(self) -> protocol.Command:
        if self.pending is not None:
            msg, self.pending = self.pending, None
        else:
            msg = self.ep.receive()[0]
        # An authenticated frame from the orchestrator (trusted): its shape is the protocol's.
        return cast(protocol.Command, msg)

    def load(self, msg: protocol.LoadCommand) -> None:
        """The candidate's code: its extensions, then model_new.py (after the trusted `baseline`)."""
        assert self.task is not None
        # Before the extensions load: their module initialisers (REGISTER_BINDING) are candidate code.
        backend = backend_state.Snapshot()
        sys.path.append(str(self.candidate_dir))
        self.registry = recorder.ExtensionRegistry()
        ext_dir = self.home / "ext"
        for ext in msg["workspace_extensions"]:
            guarded(
                f"loading {ext['name']}",
                inline.load_extension,
                ext["name"],
                Path(ext["path"]),
                ext["sha256"],
                ext_dir,
                self.registry.add_module,
            )
        inline.install_loader(msg["inline_artifacts"], ext_dir, self.registry.add_module)
        self.fingerprints = tamper.Fingerprints(self.task, backend)
        module = self.import_candidate()
        cls = getattr(module, "ModelNew", None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise CandidateFailure("model_new.py defines no ModelNew(nn.Module) class")
        self.model_new_cls = cls
        self.registry.refresh_custom_ops()
        violations = self.inheritance_violations(cls) + self.fingerprints.changes()
        self.ep.send(
            {
                "type": "imported",
                "violations": violations,
                "ext_functions": sorted(self.registry.functions.values()),
                "custom_ops": sorted(self.registry.custom_ops),
                "notes": self.baseline_notes,
                "steps": self.take_steps(),
            }
        )

    def inheritance_violations(self, cls: type) -> list[str]:
        assert self.task is not None
        task_model = self.task.Model
        task_code = getattr(task_model.forward, "__code__", None)
        for base in cls.__mro__[1:]:
            if base.__module__.startswith("torch") or base is object:
                continue
            forward_code = getattr(base.__dict__.get("forward"), "__code__", None)
            same_code = (
                task_code is not None
                and forward_code is not None
                and forward_code.co_code == task_code.co_code
            )
            if base is task_model or base.__name__ == "Model" or same_code:
                return [f"static.inherits-model: ModelNew derives from {base.__module__}.{base.__qualname__}"]
        return []

    def build_models(self, weight_seed: int) -> None:
        assert self.task is not None and self.model_new_cls is not None and self.fingerprints is not None
        self.model = task_lib.build_model(self.task, self.task.Model, weight_seed, self.device)
        cls = self.model_new_cls
        self.model_new = guarded(
            "ModelNew construction", task_lib.build_model, self.task, cls, weight_seed, self.device
        )
        self.ep.send({"type": "ready", "violations": self.fingerprints.changes()})

    # -- verify ---------------------------------------------------------------------------------------------
    def check_outputs(
        self,
        output: Any,
        meta: list[dict[str, Any]],
        structure: Any,
        inputs: list[Any],
        violations: list[str],
    ) -> list[torch.Tensor] | None:
        try:
            got_structure, leaves = tensors.flatten(output)
        except tensors.OutputTypeError as exc:
            violations.append(f"output-type: {exc} (must be exactly torch.Tensor)")
            return None
        if got_structure != structure:
            violations.append(f"output-structure: got {got_structure}, expected {structure}")
            return None
        input_spans = [tensors.storage_span(x) for x in inputs if type(x) is torch.Tensor]
        for i, (leaf, want) in enumerate(zip(leaves, meta, strict=True)):
            have = tensors.tensor_meta(leaf)
            for key, code in (
                ("device", "output-device"),
                ("dtype", "output-dtype"),
                ("shape", "output-shape"),
            ):
                if have[key] != want[key]:
                    violations.append(f"{code}: output[{i}] has {key} {have[key]}, expected {want[key]}")
            span = tensors.storage_span(leaf)
            if any(tensors.spans_overlap(span, s) for s in input_spans):
                violations.append(f"output-aliases-input: output[{i}] shares memory with an input")
        return leaves

    def one_call(
        self, inputs: list[Any], msg: protocol.TrialCommand, label: str, observe: bool
    ) -> tuple[protocol.CallReport, list[memoryview]]:
        """One candidate call with poisoned memory and all output/input checks; its outputs packed for the
        orchestrator (`pack_outputs`)."""
        assert self.model_new is not None and self.registry is not None
        meta, structure = msg["meta"], msg["structure"]
        tensor_inputs = [x for x in inputs if type(x) is torch.Tensor]
        with self.step("poison"):
            recorder.poison_free_memory(
                self.device, [*msg["output_bytes"], *(x.nbytes for x in tensor_inputs)]
            )
        before = [_clone(x) for x in tensor_inputs]
        violations: list[str] = []
        early: list[torch.Tensor] = []
        leaves_box: list[list[torch.Tensor] | None] = [None]

        def after(output: Any) -> None:
            leaves = self.check_outputs(output, meta, structure, inputs, violations)
            leaves_box[0] = leaves
            if leaves is not None and self.device == "cuda":
                torch.cuda.current_stream().synchronize()
                early.extend(_clone(t) for t in leaves)

        report: protocol.CallReport = {"label": label}
        with _no_grad(), self.step("observed_call" if observe else "call"):
            if observe:
                record = guarded(
                    f"ModelNew.forward ({label})",
                    recorder.observed_call,
                    self.model_new,
                    inputs,
                    self.registry,
                    self.device,
                    after,
                )
                report["ops"] = record.ops
                report["profiler_ops"] = record.profiler_ops
                report["ext_calls"] = record.ext_calls
                report["kernels"] = record.kernels
                report["current_stream"] = record.current_stream
                report["profiler_error"] = record.profiler_error
                report["balanced"] = record.balanced
            else:
                output = guarded(f"ModelNew.forward ({label})", self.model_new, *inputs)
                after(output)
                if self.device == "cuda":
                    torch.cuda.synchronize()
        leaves = leaves_box[0]
        if (
            early
            and leaves is not None
            and not all(_bitwise_equal(a, b) for a, b in zip(early, leaves, strict=True))
        ):
            violations.append(
                "side-stream: outputs changed after a full device synchronisation "
                "(work not ordered on the current stream)"
            )
        if not msg.get("task_mutates_inputs") and not all(
            _bitwise_equal(a, b) for a, b in zip(before, tensor_inputs, strict=True)
        ):
            violations.append("input-mutated: an input tensor changed during ModelNew.forward")
        report["violations"] = violations
        if leaves is None or violations:
            return report, []
        # On CUDA the copies taken right after the call (bitwise equal to the outputs, checked above) are
        # the judge's own: the candidate holds no reference to them.
        return report, self.pack_outputs(report, early or leaves)

    def pack_outputs(self, report: protocol.CallReport, outputs: list[torch.Tensor]) -> list[memoryview]:
        """Describe `outputs` in `report` and return the blobs to send: none when the device memory is
        exported (CUDA IPC, report["shared"]), else the raw bytes (CPU, or the driver refused)."""
        report["outputs"] = [tensors.tensor_meta(t) for t in outputs]
        with self.step("pack_outputs"):
            if self.device == "cuda":
                own = [
                    t if t.is_contiguous() else _clone(t, memory_format=torch.contiguous_format)
                    for t in outputs
                ]
                try:
                    report["shared"] = cuda_driver.export(own)
                    self.exported.extend(own)
                    return []
                except cuda_driver.DriverError as exc:
                    report["ipc_error"] = str(exc)[:300]
            return [tensors.to_bytes(t) for t in outputs]

    def trial(self, msg: protocol.TrialCommand) -> None:
        assert self.task is not None and self.model is not None and self.fingerprints is not None
        with self.step("inputs"):
            inputs = task_lib.make_inputs(self.task, int(msg["seed"]), msg["variant"], self.device)
            digest = task_lib.values_digest(inputs)
        if msg["order"] == "model-first":
            with _no_grad(), self.step("model_first"):
                scratch = self.model(*[_clone(x) if type(x) is torch.Tensor else x for x in inputs])
            del scratch
        first, blobs = self.one_call(inputs, msg, "fresh inputs", observe=True)
        second: protocol.CallReport = {}
        if not first["violations"] and "outputs" in first:
            # Same buffers, new values: a candidate that caches by pointer or shape returns stale outputs.
            with self.step("inputs"):
                fresh = task_lib.make_inputs(
                    self.task, int(msg["refill_seed"]), msg["refill_variant"], self.device
                )
                for x, new in zip(inputs, fresh, strict=True):
                    if type(x) is torch.Tensor:
                        _copy(x, new)
                del fresh
            second, refill_blobs = self.one_call(inputs, msg, "inputs refilled in place", observe=False)
            blobs = blobs + refill_blobs
        tampering = self.fingerprints.changes()
        self.ep.send(
            {
                "type": "trial_result",
                "index": msg["index"],
                "input_digest": digest,
                "first": first,
                "second": second,
                "tamper": tampering,
                "steps": self.take_steps(),
            },
            blobs,
        )

    # -- profile --------------------------------------------------------------------------------------------
    def progress_observer(self, after: Any, per_trial: int, trials: int) -> Any:
        """`after`, plus a "progress" frame (finished timed trials) about every 5 % of the loop, sent
        outside the timed window; the orchestrator only displays it (cli.py's progress bar)."""
        step = max(1, trials // 20)
        calls = [0]

        def observe(name: str, k: int, out: Any) -> None:
            after(name, k, out)
            calls[0] += 1
            if calls[0] % per_trial == 0:
                done = calls[0] // per_trial
                if done % step == 0 or done == trials:
                    self.ep.send({"type": "progress", "done": done})

        return observe

    def profile(self, msg: protocol.ProfileCommand) -> None:
        """The timed loops. Every trial draws fresh values into the same input buffers (timing.Feed), and
        the candidate's outputs of a secret sample of the timed calls (`loops[...]["checked"]`, chosen by
        the orchestrator, the last call of each loop among them) are copied right after the call and sent
        back for comparison with references for exactly those values: no call count, clock or input
        identity separates checked calls from timed ones, because they are the same calls."""
        assert self.task is not None and self.model is not None and self.model_new is not None
        assert self.fingerprints is not None
        settings, loops = msg["settings"], msg["loops"]
        task, device = self.task, self.device
        mutates = bool(msg.get("task_mutates_inputs"))

        def make(seed: int) -> list[Any]:
            return task_lib.make_inputs(task, seed, "task", device)

        feed = timing.Feed(make, int(msg["warmup_seed"]), mutates)
        model_new = self.model_new

        def candidate(*args: Any) -> Any:
            return guarded("ModelNew.forward (profile)", model_new, *args)

        fns: dict[str, Callable[..., Any]] = {"candidate": candidate, "eager": self.model}
        timed = TimedChecks(self, msg, feed, mutates)
        guard = BaselineGuard(self.fingerprints.backend)
        notes: list[str] = []
        compile_seconds = None
        with _no_grad():
            with self.step("warmup"):
                for k in range(settings["warmup"]):
                    feed.refill()
                    guard.before("candidate", "warm-up", k)
                    candidate(*feed.inputs)
                    feed.refill()
                    guard.before("eager", "warm-up", k)
                    self.model(*feed.inputs)
            pre_compile_tampering = self.fingerprints.changes()
            if self.compiled is not None:
                start = _monotonic()
                try:
                    for k in range(settings["warmup"]):
                        feed.refill()
                        guard.before("compile", "warm-up", k)
                        self.compiled(*feed.inputs)
                    fns["compile"] = self.compiled
                    compile_seconds = _monotonic() - start
                except Exception as exc:  # e.g. a recompile that inductor cannot do here: no compile timing
                    notes.append(f"torch.compile unavailable: {type(exc).__name__}: {str(exc)[:300]}")
                # A (re)compile may patch nn.Module itself; only candidate code runs after this point.
                self.fingerprints.rebaseline()
                self.steps["compile_warmup"] = _monotonic() - start
            if self.device == "cuda":
                torch.cuda.synchronize()
                seed = int(msg["order_seed"])
                flush = settings["l2_flush_bytes"]
                with self.step("device_times"):
                    device_times = timing.cuda_device_times(
                        fns,
                        feed,
                        loops["device"]["seeds"],
                        flush,
                        seed,
                        self.progress_observer(
                            timed.observer("device"), len(fns), len(loops["device"]["seeds"])
                        ),
                        guard.before,
                    )
                with self.step("latency"):
                    latency = timing.cuda_event_latency(
                        fns,
                        feed,
                        loops["latency"]["seeds"],
                        flush,
                        seed,
                        timed.observer("latency"),
                        guard.before,
                    )
                with self.step("host_check"):
                    host = timing.host_per_call_ms(
                        {k: fns[k] for k in ("candidate", "eager")},
                        feed,
                        loops["host"]["seeds"],
                        timed.observer("host"),
                        {int(i) for i in loops["host"]["checked"]},
                        guard.before,
                    )
                method, device_ms, latency_ms, host_ms = (
                    "cuda-profiler-device-time",
                    device_times,
                    latency,
                    host,
                )
            else:
                wall = timing.cpu_wall_times(
                    fns,
                    feed,
                    loops["wall"]["seeds"],
                    settings["cpu_thrash_bytes"],
                    int(msg["order_seed"]),
                    self.progress_observer(timed.observer("wall"), len(fns), len(loops["wall"]["seeds"])),
                    guard.before,
                )
                method, device_ms, latency_ms, host_ms = "cpu-wall-clock", wall, wall, {}
            if self.device == "cuda":
                torch.cuda.synchronize()
        blobs: list[memoryview] = []
        packed: list[protocol.TimedCallReport] = []
        if not timed.violations:
            for loop, index, leaves in timed.captured:
                sub: protocol.TimedCallReport = {"loop": loop, "index": index}
                blobs += self.pack_outputs(sub, leaves)
                packed.append(sub)
        result: protocol.ProfileResult = {
            "type": "profile_result",
            "method": method,
            "device": device_ms,
            "latency": latency_ms,
            "host": host_ms,
            "notes": notes,
            "compile_seconds": compile_seconds,
            "violations": timed.violations,
            "timed": packed,
            "tamper": guard.violations + pre_compile_tampering + self.fingerprints.changes(),
            "steps": self.take_steps(),
        }
        self.ep.send(result, blobs)

    # -- command loop ---------------------------------------------------------------------------------------
    def serve(self) -> None:
        self.preload()
        msg = self.next_command()
        if msg["type"] != "baseline":
            return
        self.baseline(msg)
        msg = self.next_command()
        if msg["type"] != "load":
            return
        self.load(msg)
        while True:
            msg = self.next_command()
            self.exported.clear()
            if msg["type"] == "models":
                self.build_models(int(msg["weight_seed"]))
            elif msg["type"] == "trial":
                self.trial(msg)
            elif msg["type"] == "profile":
                self.profile(msg)
            elif msg["type"] == "finish":
                assert self.fingerprints is not None
                self.ep.send({"type": "bye", "tamper": self.fingerprints.changes()})
                return
            else:
                return


class BaselineGuard:
    """No process-wide switch may differ while a baseline runs (issue 30). Before every eager, compile
    (and refill) call that follows candidate code, every setting of the snapshot taken before the
    candidate's import (backend_state) is read again, and autograd must be off (the judge's own no_grad,
    which candidate code could have switched back on for the baselines only); anything that moved is a
    violation, and is written back before the call, so no baseline is ever timed under a candidate's
    switch. Outside the timed window; a check is skipped only when no candidate code ran since the last
    one (nothing else in the worker changes these settings)."""

    def __init__(self, snapshot: backend_state.Snapshot) -> None:
        self.snapshot = snapshot
        self.violations: list[str] = []
        self.dirty = True  # candidate code ran (its import, at least) since the last check

    def before(self, name: str, loop: str, k: int) -> None:
        if name == "candidate":
            self.dirty = True
            return
        if not self.dirty:
            return
        self.dirty = False
        where = f" before the {name} call of trial {k} of the {loop} loop"
        moved = self.snapshot.changes()
        if moved:
            if len(self.violations) < 20:
                self.violations += tamper.backend_violations(moved, where)
            failed = self.snapshot.restore([key for key, _, _ in moved])
            if failed and len(self.violations) < 20:
                self.violations.append(f"judge-tampered: could not restore {', '.join(failed[:5])}{where}")
        if _is_grad_enabled():
            if len(self.violations) < 20:
                self.violations.append(f"judge-tampered: autograd was switched back on{where}")
            _set_grad_enabled(False)


class TimedChecks:
    """What the worker does after each timed call, outside the timed window: every candidate output must
    be exactly torch.Tensor; the outputs of the calls the orchestrator picked are checked like a verify
    call's (structure, metadata, no input aliasing, inputs unchanged) and copied for the orchestrator."""

    def __init__(
        self, worker: Worker, msg: protocol.ProfileCommand, feed: timing.Feed, mutates: bool
    ) -> None:
        self.worker = worker
        self.meta, self.structure = msg["meta"], msg["structure"]
        self.loops = msg["loops"]
        self.feed = feed
        self.mutates = mutates
        self.violations: list[str] = []
        self.captured: list[tuple[str, int, list[torch.Tensor]]] = []

    def observer(self, loop: str) -> timing.AfterCall:
        checked = {int(i) for i in self.loops[loop]["checked"]}

        def after(name: str, index: int, output: Any) -> None:
            if name == "candidate" and not self.violations:
                self.after_candidate(loop, index, output, index in checked)

        return after

    def after_candidate(self, loop: str, index: int, output: Any, checked: bool) -> None:
        where = f"timed call {index} of the {loop} loop"
        try:
            tensors.flatten(output)
        except tensors.OutputTypeError as exc:
            self.violations.append(f"output-type: {exc} (must be exactly torch.Tensor; {where})")
            return
        if not checked:
            return
        found: list[str] = []
        leaves = self.worker.check_outputs(output, self.meta, self.structure, self.feed.inputs, found)
        if not self.mutates and self.feed.current:
            buffers = [x for x in self.feed.inputs if type(x) is torch.Tensor]
            values = [x for x in self.feed.values if type(x) is torch.Tensor]
            if not all(_bitwise_equal(a, b) for a, b in zip(buffers, values, strict=True)):
                found.append("input-mutated: an input tensor changed during ModelNew.forward")
        if found or leaves is None:
            self.violations += [f"{v} ({where})" for v in found]
            return
        # The judge's own copies (the candidate holds no reference to them), ordered after the call.
        own = [_clone(t, memory_format=torch.contiguous_format) for t in leaves]
        self.captured.append((loop, index, own))


_BENCHMARK_METHODS = ("benchmark", "benchmark_gpu", "benchmark_cpu")


def _wrap_benchmarks(gate: Callable[[], None]) -> list[tuple[type, str, Any]]:
    """Make every method of inductor's benchmarker classes call `gate` first; returns what to restore
    ([] when the benchmarker is not where this torch keeps it: the caller then gates the whole compile)."""
    try:
        benchmarking = importlib.import_module("torch._inductor.runtime.benchmarking")
        classes = [c for c in type(benchmarking.benchmarker).__mro__ if c.__module__ == benchmarking.__name__]
    except (ImportError, AttributeError):
        return []
    wrapped: list[tuple[type, str, Any]] = []
    for cls in classes:
        for name in _BENCHMARK_METHODS:
            original = cls.__dict__.get(name)
            if callable(original):

                def gated(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                    gate()
                    return _original(*args, **kwargs)

                wrapped.append((cls, name, original))
                setattr(cls, name, gated)
    return wrapped


def _innermost(exc: BaseException) -> BaseException:
    """The exception at the root of a chain (dynamo wraps inductor's errors once or twice)."""
    for _ in range(8):
        cause = exc.__cause__ or exc.__context__
        if cause is None:
            break
        exc = cause
    return exc


def _point_header_cache(root: Path) -> None:
    """Inductor fixes its CPU precompiled-header directory when codecache is imported (under the
    importing process's temp dir, which a zygote-forked worker cannot write): point it at the cache in use."""
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None and hasattr(codecache, "_HEADER_DIR"):
        setattr(codecache, "_HEADER_DIR", str(root / "precompiled_headers"))  # noqa: B010
        setattr(codecache, "_HEADER_LOCK_DIR", str(root / "precompiled_headers" / "locks"))  # noqa: B010


def run_forked(read_fd: int, write_fd: int) -> NoReturn:
    """The forked child's whole life: detach from the orchestrator's state, serve, exit without running
    anything the parent registered (atexit handlers, buffered stdio of the parent's streams)."""
    code = 1
    try:
        _detach(keep=(read_fd, write_fd))
        code = main(read_fd, write_fd)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _drop_inherited_profiler() -> None:
    """A debug run profiles the orchestrator (orchestrator.judge); the fork must not carry that profiler
    into the worker, where it would also block the worker's own compile profile."""
    sys.setprofile(None)
    monitoring = getattr(sys, "monitoring", None)  # Python >= 3.12: cProfile is a monitoring tool
    if monitoring is not None and monitoring.get_tool(monitoring.PROFILER_ID) is not None:
        monitoring.set_events(monitoring.PROFILER_ID, 0)
        monitoring.free_tool_id(monitoring.PROFILER_ID)


def _detach(keep: tuple[int, ...]) -> None:
    """Own session, killed with the orchestrator, and no inherited descriptor but the channel's: the
    judge's stdout (its JSON verdict), lock files and other workers' pipes stay out of reach."""
    _drop_inherited_profiler()
    parent = os.getppid()
    os.setsid()
    confinement._libc().prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)
    if os.getppid() != parent:  # the orchestrator died before the line above
        os._exit(1)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    confinement.close_inherited_fds(keep)
    # The orchestrator's working directory (a `python -m` start puts it on sys.path) is not ours.
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != cwd]


def _adopt(config: protocol.WorkerConfig) -> None:
    """The environment and output the worker would have had as a fresh process: the scrubbed env
    (CUDA reads it at initialisation, after this) and the private log for anything candidate code prints."""
    confinement.adopt_environment(config["env"])
    log = os.open(config["log"], os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def main(read_fd: int, write_fd: int) -> int:
    # No deadline: a spare worker waits until the orchestrator configures it or ends it (it dies with it).
    key = channel.receive_key(read_fd)
    endpoint = channel.Endpoint(key, read_fd, write_fd, is_worker=True)
    try:
        header, _ = endpoint.receive(deadline=None)
        config = cast(protocol.WorkerConfig, header)  # authenticated: the orchestrator's own frame
        _adopt(config)
        worker = Worker(endpoint, config)
        endpoint.send({"type": "started", "isolation": worker.isolate()})
        if config["mode"] == "collect":
            worker.collect()
        else:
            worker.serve()
    except CandidateFailure as exc:
        endpoint.send({"type": "candidate_error", "error": str(exc), "early_exit": exc.early_exit})
    except channel.ChannelForged as exc:
        endpoint.send({"type": "forged", "error": str(exc)})
    except (channel.ChannelClosed, BrokenPipeError):
        return 0
    except task_lib.TaskError as exc:
        endpoint.send({"type": "task_error", "error": str(exc)})
    except BaseException as exc:
        endpoint.send({"type": "judge_error", "error": "".join(traceback.format_exception(exc))[-4000:]})
    return 0
