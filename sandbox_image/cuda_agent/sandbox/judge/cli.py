"""`cuda-agent judge TASK CANDIDATE [...]`: judge one candidate and print the verdict.

Also runs as `python -m cuda_agent.sandbox.judge.cli TASK CANDIDATE [...]` (how the session server starts it).

Exit 0 whenever judging completed (reward -1 included); exit 2 with one line on stderr for usage errors,
unreadable files, or a TASK that itself fails to run. With --json stdout carries exactly one JSON
object; candidate output never reaches stdout (the worker writes it to a private log).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from cuda_agent.api.judge import COMPILE_MODES, DEVICES, OPTIONS_JSON_FLAG, PRECISIONS, Device, JudgeOptions
from cuda_agent.sandbox.judge.config import JudgeConfig, judge_config


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"cuda-agent judge: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="cuda-agent judge", description="Judge a candidate kernel against a KernelBench task.")
    p.add_argument(
        "task", type=Path, metavar="TASK", help="KernelBench-format task .py (Model, get_inputs, ...)"
    )
    p.add_argument("candidate", type=Path, metavar="CANDIDATE", help="model_new.py, or a workspace directory")
    p.add_argument("--device", choices=DEVICES, default=None, help="default: cuda when available")
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    # The judge options (cuda_agent.api.judge.JudgeOptions), one flag each for people; unset keeps the
    # judge's default. A program passes them all at once as the model's JSON (--options-json).
    p.add_argument(
        "--trials", type=int, default=None, help="verify trials, fresh secret inputs each (default 5)"
    )
    p.add_argument("--precision", choices=PRECISIONS, default=None, help="default strict-fp32")
    p.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default=None,
        help="torch.compile mode of the baseline (default: default); none skips it (reward then at most 2)",
    )
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        type=float,
        default=None,
        help="total seconds (default 1800; phases also have own limits)",
    )
    p.add_argument("--atol", type=float, default=None, help="default 0.01")
    p.add_argument("--rtol", type=float, default=None, help="default 0.01")
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help="reward tiers: 'faster' means speedup > 1 + margin (default 0.05)",
    )
    p.add_argument("--profile-trials", type=int, default=None, help="interleaved timed trials (default 100)")
    p.add_argument(
        OPTIONS_JSON_FLAG,
        dest="options_json",
        metavar="JSON",
        default=None,
        help="all judge options as one JudgeOptions JSON object (how the session server passes them); "
        "not combined with the option flags above",
    )
    p.add_argument(
        "--seed-file",
        type=Path,
        default=None,
        help="reproduce a run: read the hex seed from PATH, or write a fresh one there",
    )
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="build cache (default $CUDA_AGENT_JUDGE_CACHE)"
    )
    p.add_argument(
        "--cache-max-mb",
        type=float,
        default=_env_float("CUDA_AGENT_JUDGE_CACHE_MAX_MB"),
        help="after judging, shrink the build cache to this size, least recently used entries first "
        "(default $CUDA_AGENT_JUDGE_CACHE_MAX_MB; unset: unbounded)",
    )
    p.add_argument("--no-progress", action="store_true", help="no phase lines on stderr (human output only)")
    p.add_argument(
        "--no-service",
        action="store_true",
        help="judge in this process even when CUDA_AGENT_JUDGE_SERVICE names a warm judge service",
    )
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line; a usage error prints one line and exits 2."""
    return _parser().parse_args(list(argv))


def judge_options(args: argparse.Namespace) -> JudgeOptions:
    """The judge options of this command line: the --options-json model (validated by JudgeOptions, the
    bounds any caller of the API gets), or the option flags a person gave. Those are bounded by JudgeConfig
    alone, as they always were (a test asks for --margin 1000), hence model_construct."""
    given = {
        name: getattr(args, name) for name in JudgeOptions.model_fields if getattr(args, name) is not None
    }
    if args.options_json is None:
        return JudgeOptions.model_construct(**given)
    if given:
        flags = ", ".join("--" + ("timeout" if n == "timeout_s" else n.replace("_", "-")) for n in given)
        raise _OptionsError(f"{OPTIONS_JSON_FLAG} cannot be combined with {flags}")
    try:
        return JudgeOptions.model_validate_json(args.options_json)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(the object)"
        raise _OptionsError(f"invalid {OPTIONS_JSON_FLAG} {field}: {first['msg']}") from None


def build_config(args: argparse.Namespace, device: Device) -> JudgeConfig:
    """The run's JudgeConfig from the command line (raises _OptionsError or pydantic's ValidationError)."""
    extra = {"cache_dir": args.cache_dir} if args.cache_dir else {}
    return judge_config(
        args.task.resolve(),
        args.candidate.resolve(),
        device,
        judge_options(args),
        seed_file=args.seed_file,
        **extra,
    )


class _OptionsError(ValueError):
    """The judge options of the command line are unusable (one line for stderr)."""


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    try:
        return float(value) if value else None
    except ValueError:
        return None


# What each refusal means, in one line for the person at the terminal (codes: docs/judge.md).
REFUSALS = {
    "torch-compute": "PyTorch computes part of the result: only the candidate's own kernels (and cuBLAS / "
    "cuDNN called from its extension) may compute; outputs are not scored",
    "no-custom-kernel": "the forward ran none of the candidate's kernels",
    "side-stream": "work ran outside the current stream or thread, where the timer cannot see it",
    "caching": "outputs were reused instead of recomputed for new inputs",
    "precision": "the result is less accurate than fp32 allows (TF32/FP16 math under strict-fp32)",
    "timed-wrong-result": "outputs were wrong during the timed calls",
    "implausible-speed": "the measured time is faster than the device's bandwidth or FLOP/s allow",
    "timing-mismatch": "host time and device time disagree: work hidden from the device timer",
}


class Progress:
    """Phase lines on stderr as the orchestrator reports them: one line per phase on a pipe, a bar
    redrawn in place on a terminal."""

    BAR = 24

    def __init__(self, stream: object) -> None:
        self.stream = stream
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.phase: str | None = None
        self.printed: tuple[str, object] | None = None
        self.open_line = False

    def __call__(self, event: dict[str, object]) -> None:
        phase, done, total = str(event.get("phase")), event.get("done"), event.get("total")
        elapsed = float(str(event.get("elapsed_s") or 0.0))
        text = f"[{elapsed:6.1f} s] {phase:<8}"
        if isinstance(done, int) and isinstance(total, int) and total > 0:
            filled = self.BAR * done // total
            unit = "timed trials" if phase == "profile" else "trials"
            text += f" [{'#' * filled}{'.' * (self.BAR - filled)}] {done}/{total} {unit}"
        if self.tty:
            end = "\n" if phase != self.phase and self.open_line else ""
            self._write(end + "\r" + text + "\x1b[K")
            self.open_line = True
        elif phase != self.phase or (done == total and (phase, done) != self.printed):
            self._write(text + "\n")
            self.printed = (phase, done)
        self.phase = phase

    def close(self) -> None:
        if self.tty and self.open_line:
            self._write("\n")

    def _write(self, text: str) -> None:
        write = getattr(self.stream, "write", None)
        if write is not None:
            write(text)
            getattr(self.stream, "flush", lambda: None)()


def _summary(result: object) -> str:
    from cuda_agent.api.judge import JudgeVerdict

    assert isinstance(result, JudgeVerdict)
    t, s = result.timings_ms, result.speedup

    def fmt(value: float | None, digits: int = 4) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [_verdict(result)]
    correct = "not scored (refused)" if result.violations else str(result.correct)
    lines.append(
        f"compiled {result.compiled}   correct {correct}   device {result.device}   "
        f"precision {result.precision}"
    )
    if result.timing_method or t.candidate is not None:
        lines += [
            f"timings ms ({result.timing_method or 'not profiled'}): candidate {fmt(t.candidate)}"
            f"  eager {fmt(t.eager)}"
            f"  compile {fmt(t.compile)}",
            f"speedup: vs eager {fmt(s.eager, 3)}  vs compile {fmt(s.compile, 3)}",
        ]
    if result.error:
        lines.append(f"error: {result.error}")
    lines += [f"violation: {v}" for v in result.violations]
    if result.task_flags:
        lines.append(f"task flags: {', '.join(result.task_flags)}")
    if result.build_log and not result.compiled:
        lines.append("build log:\n" + result.build_log)
    return "\n".join(lines)


def _verdict(result: object) -> str:
    """The first line: the reward and, for -1, the reason in plain words (a refusal is not a wrong
    answer: outputs that happened to match do not make it correct)."""
    from cuda_agent.api.judge import JudgeVerdict

    assert isinstance(result, JudgeVerdict)
    if result.reward > 0:
        tiers = {3: "faster than eager and torch.compile", 2: "faster than eager", 1: "correct, not faster"}
        return f"reward {result.reward}: {tiers[result.reward]}"
    if result.violations:
        code = result.violations[0].split(":", 1)[0]
        why = REFUSALS.get(
            code,
            "the judge's rules forbid what it did"
            if not code.startswith("static.")
            else "the static screen refused the sources; nothing was built or run",
        )
        return f"reward -1: refused ({code}): {why}"
    if not result.compiled:
        return f"reward -1: not built: {(result.error or 'build failed').splitlines()[0][:200]}"
    return f"reward -1: {(result.error or 'incorrect').splitlines()[0][:200]}"


def _bound_cache(cache_dir: Path, max_mb: float, notes: list[str]) -> None:
    """Shrink the build cache to `max_mb` after the verdict (entries used in the last hour stay)."""
    from cuda_agent.sandbox.judge import build

    removed, left = build.BuildCache(cache_dir).evict(int(max_mb * (1 << 20)))
    notes.append(
        f"build cache {cache_dir}: {left / (1 << 20):.0f} MB after removing {removed / (1 << 20):.0f} MB "
        f"(cap {max_mb:.0f} MB)"
    )


def main(argv: Sequence[str]) -> int:
    entered = time.monotonic()
    args = parse_args(argv)
    if not args.no_service:
        # A warm service skips this process's torch/inductor imports and worker start-up (opt-in).
        from cuda_agent.sandbox.judge import local_service

        code = local_service.judge_via_service([*argv, local_service.NO_SERVICE_FLAG])
        if code is not None:
            return code
    # Heavy imports (torch) only after the arguments are known to be valid. Any CUDA availability check
    # during them asks NVML, not the driver: a driver query makes torch refuse CUDA in every process
    # forked afterwards, and the orchestrator forks its workers.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    from cuda_agent.sandbox.judge import confinement, errors, orchestrator

    # No CUDA call here: the orchestrator checks availability after forking its workers.
    device: Device = args.device or ("cuda" if confinement.cuda_host() else "cpu")
    for label, path in (("TASK", args.task), ("CANDIDATE", args.candidate)):
        if not path.exists():
            print(f"cuda-agent judge: {label} {path} does not exist", file=sys.stderr)
            return 2
    try:
        config = build_config(args, device)
    except _OptionsError as exc:
        print(f"cuda-agent judge: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        print(f"cuda-agent judge: invalid {field}: {first['msg']}", file=sys.stderr)
        return 2
    progress = None if args.json or args.no_progress else Progress(sys.stderr)
    try:
        result = orchestrator.judge(config, progress=progress)
    except errors.UsageError as exc:
        print(f"cuda-agent judge: {exc}", file=sys.stderr)
        return 2
    except errors.TaskFailure as exc:
        print(f"cuda-agent judge: task error: {exc}", file=sys.stderr)
        return 2
    finally:
        if progress is not None:
            progress.close()
    if args.cache_max_mb is not None:
        _bound_cache(config.cache_dir, args.cache_max_mb, result.notes)
    if os.environ.get("CUDA_AGENT_JUDGE_DEBUG"):
        # CLOCK_MONOTONIC is one clock for every process on the host: a caller that noted when it started
        # this judge, and when it saw it exit, learns the start-up and exit costs around these two.
        result.notes.append(
            f"debug: monotonic clock at entry {entered:.4f}, at verdict {time.monotonic():.4f}"
        )
    if args.json:
        sys.stdout.write(result.model_dump_json() + "\n")
    else:
        print(_summary(result))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
