"""`cuda-agent eval`: judge existing solutions, or run a policy through the agent loop, over a task set.

    cuda-agent eval --solutions examples/solutions --tasks examples/tasks --out eval-out [--device cuda]
    cuda-agent eval --policy replay:replies.json --tokenizer DIR --tasks s3://bench/kernelbench/ --out ...
    cuda-agent eval --run run.yaml --policy hf:DIR --tasks ...   # a TrainingRun's evaluation episodes

Exit 0 when the run completed and at least one row has a verdict (whatever the rewards); 1 with one line
on stderr when no row could be judged (every row a task error, no result or no candidate: a run that
judged nothing is never a success); 2 with one line on stderr for bad arguments or inputs (the message
names the flag or file). Every path argument is made absolute here, before anything runs: the judges run
with --out as their working directory. docs/eval.md describes the layouts, metrics and outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from cuda_agent.api.judge import COMPILE_MODES, DEVICES, PRECISIONS

if TYPE_CHECKING:
    from cuda_agent.api.episode import EpisodeSettings
    from cuda_agent.eval.models import EvalReport


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"cuda-agent eval: {message}", file=sys.stderr)
        raise SystemExit(2)


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _words(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="cuda-agent eval", description="Evaluate solutions or a policy on a KernelBench-format task set."
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--solutions", type=Path, help="directory of existing solutions (no policy)")
    source.add_argument(
        "--policy", help="policy backend: replay:FILE, hf:DIR, openai:URL, openai-text:URL, openai-chat:URL"
    )
    p.add_argument(
        "--tasks", required=True, help="task directory (levels as folders, or flat) or s3:// prefix"
    )
    p.add_argument(
        "--out", type=Path, default=Path("eval-out"), help="results, report and plots (default eval-out)"
    )
    p.add_argument(
        "--run",
        type=Path,
        help="a TrainingRun file (with its SandboxPool): evaluate with the run's episode settings, its "
        "maxTurnsEval, context, tools, the pool's device and spec.reward's precision, tolerances and margin",
    )
    p.add_argument("--device", choices=DEVICES, default=None, help="default cpu (with --run: the pool's)")
    p.add_argument("--jobs", type=int, default=2, help="evaluations in flight (default 2)")
    p.add_argument("--sandbox", dest="sandbox_url", help="sandbox server URL (default: local judges; "
                   "for --policy a local server is started)")  # fmt: skip
    p.add_argument("--level", type=_words, default=[], help="only these levels (comma-separated)")
    p.add_argument("--only", type=_words, default=[], help="only these task names (comma-separated)")
    p.add_argument("--trials", type=int, default=None, help="judge verify trials")
    p.add_argument("--profile-trials", type=int, default=None, help="judge timed trials")
    p.add_argument("--precision", choices=PRECISIONS, default=None, help="default strict-fp32")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="default")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per evaluation (judge --timeout)")
    p.add_argument(
        "--fast-p", type=_floats, default=[0.0, 0.5, 0.8, 1.0, 1.5, 2.0], help="p values of fast_p"
    )
    p.add_argument(
        "--margin", type=float, default=None, help="'faster' means speedup > 1 + margin (default 0.05)"
    )
    p.add_argument(
        "--suspicious", type=float, default=10.0, help="list correct speedups above this for review"
    )
    p.add_argument(
        "--compare-allclose",
        action="store_true",
        help="also run refused candidates through a plain allclose harness (UNCONFINED)",
    )
    p.add_argument("--gpus", type=int, default=None, help="GPUs the evaluations shared (per-GPU-hour figure)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report (report.json's content) on stdout instead of the table; messages go to stderr",
    )
    policy = p.add_argument_group("policy options")
    policy.add_argument("--tokenizer", type=Path, help="tokenizer + chat template directory of the policy")
    policy.add_argument("--gguf-file", help="GGUF file name inside the model / tokenizer directory")
    policy.add_argument("--model", help="model name an OpenAI-compatible server expects")
    policy.add_argument(
        "--max-turns", type=int, default=None, help="agent turns per episode (default 200, the paper's eval)"
    )
    policy.add_argument("--max-tokens", type=int, default=4096, help="tokens per generation")
    policy.add_argument("--temperature", type=float, default=0.0)
    policy.add_argument("--policy-device", default="cpu", help="where an hf: model runs (cpu, cuda)")
    return p


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path.expanduser()))


def _absolute_policy(spec: str) -> str:
    """replay:FILE and hf:DIR name local paths (hf: a local directory when one exists, else a hub id)."""
    kind, sep, target = spec.partition(":")
    if not sep or not target:
        return spec
    local = Path(target).expanduser()
    if kind == "replay" or (kind == "hf" and local.exists()):
        return f"{kind}:{_absolute(local)}"
    return spec


def absolute_paths(args: argparse.Namespace) -> None:
    """Every path argument as an absolute path, resolved against the caller's working directory once:
    below here the judges and sandbox servers run in other directories (--out, a session workspace)."""
    for name in ("solutions", "out", "run", "tokenizer"):
        value = getattr(args, name)
        if value is not None:
            setattr(args, name, _absolute(value))
    if "://" not in args.tasks:
        args.tasks = str(_absolute(Path(args.tasks)))
    if args.policy is not None:
        args.policy = _absolute_policy(args.policy)


def nothing_judged(report: EvalReport, out_dir: Path) -> str | None:
    """The one-line reason when no row of the run has a verdict, else None."""
    if report.overall.judged > 0:
        return None
    reason = f"no row could be judged (0 of {report.overall.candidates} rows have a verdict)"
    if report.task_errors:
        return f"{reason}; first task error: {report.task_errors[0].splitlines()[0][:300]}"
    return f"{reason}; the reasons are in {out_dir / 'report.md'}"


def run_episode(path: Path) -> EpisodeSettings:
    """The evaluation settings of the TrainingRun in a run file, on its SandboxPool as a server on this
    machine serves it (the pool must be in the file: it decides the device)."""
    from cuda_agent.api.episode import episode_settings, on_this_machine
    from cuda_agent.trainer.demonstrations import run_documents

    run, pool = run_documents(path)
    if pool is None:
        raise ValueError(f"the file defines no SandboxPool named {run.spec.sandbox_pool_ref.name}")
    return episode_settings(run.spec, on_this_machine(pool.spec))


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    absolute_paths(args)
    from cuda_agent.eval.models import EvalConfig, JudgeSettings
    from cuda_agent.eval.report import level_table

    try:
        episode = run_episode(args.run) if args.run else None
    except (OSError, ValueError) as exc:
        print(f"cuda-agent eval: --run {args.run}: {exc}", file=sys.stderr)
        return 2
    if episode is not None:
        given = [f for f in ("device", "precision", "margin", "max_turns") if getattr(args, f) is not None]
        if given:
            flags = ", ".join("--" + f.replace("_", "-") for f in given)
            print(f"cuda-agent eval: {flags}: the run file (--run) decides these", file=sys.stderr)
            return 2
    # The run's judge options (spec.reward) as they are, else the flags; trials, timeouts and the
    # compile mode are the evaluation's own either way.
    reward: dict[str, Any] = (
        episode.judge.model_dump(exclude_none=True)
        if episode is not None
        else {
            "precision": args.precision or "strict-fp32",
            "margin": 0.05 if args.margin is None else args.margin,
        }
    )
    try:
        cfg = EvalConfig(
            tasks=args.tasks,
            out_dir=args.out,
            solutions=args.solutions,
            policy=args.policy,
            device=episode.device if episode is not None else (args.device or "cpu"),
            jobs=args.jobs,
            sandbox_url=args.sandbox_url,
            judge=JudgeSettings(
                trials=args.trials,
                profile_trials=args.profile_trials,
                compile_mode=args.compile_mode,
                timeout_s=args.timeout,
                **reward,
            ),
            episode=episode,
            levels=args.level,
            only=args.only,
            fast_p=args.fast_p,
            suspicious_speedup=args.suspicious,
            compare_allclose=args.compare_allclose,
            gpus=args.gpus,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "arguments"
        print(f"cuda-agent eval: invalid {field}: {first['msg']}", file=sys.stderr)
        return 2
    options: dict[str, Any] = {
        "spec": {"tokenizer": args.tokenizer, "gguf_file": args.gguf_file, "model": args.model},
        "max_turns": args.max_turns or 200,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "policy_device": args.policy_device,
    }
    from cuda_agent.eval import runner

    try:
        if cfg.policy is not None:  # a bad spec fails here, before any sandbox server is started
            from cuda_agent.eval.policy import PolicySpec

            _ = PolicySpec.parse(cfg.policy, **options["spec"]).tokenizer_dir
        report = runner.run(cfg, progress=not args.no_progress, policy_options=options)
    except (FileNotFoundError, ValueError) as exc:
        print(f"cuda-agent eval: {exc}", file=sys.stderr)
        return 2
    # With --json stdout is the report alone (for jq and scripts); the human lines go to stderr.
    human = sys.stderr if args.json else sys.stdout
    print(f"report: {cfg.out_dir / 'report.md'} (json, levels.png, speedups.png beside it)", file=human)
    if report.refused_allclose_accepts:
        print(
            f"refused by our judge, accepted by allclose: {len(report.refused_allclose_accepts)}", file=human
        )
        for flagged in report.refused_allclose_accepts:
            print(f"  {flagged.key}: {flagged.reason}", file=human)
    if report.suspicious:
        keys = ", ".join(f.key for f in report.suspicious)
        print(f"suspicious speedups (> {report.suspicious_speedup:g}x): {keys}", file=human)
    print(report.model_dump_json(indent=2) if args.json else level_table(report))
    reason = nothing_judged(report, cfg.out_dir)
    if reason is not None:
        print(f"cuda-agent eval: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
