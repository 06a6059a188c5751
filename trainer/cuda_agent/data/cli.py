"""`cuda-agent data`: synthesize an Ops-6K-style dataset, show the operator catalogue, re-filter a
published set.

    cuda-agent data synth --n 100 --out s3://datasets/ops --device cuda --benchmark /data/KernelBench
    cuda-agent data catalogue --out catalogue.json
    cuda-agent data filter --input ops6k.parquet --out DIR --benchmark examples/tasks
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal, TextIO

from pydantic import ValidationError

from cuda_agent.api.judge import DEVICES
from cuda_agent.data.records import FILTER_ORDER, CalibrationConfig, ComposerConfig, FilterConfig
from cuda_agent.storage import StorageError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cuda-agent data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    synth = commands.add_parser("synth", help="compose and filter N accepted samples")
    synth.add_argument("--n", type=int, required=True, help="accepted samples wanted")
    synth.add_argument("--out", required=True, help="directory or s3:// prefix (resumes what is there)")
    synth.add_argument("--composer", choices=("programmatic", "llm"), default="programmatic")
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--scale", choices=("small", "full"), help="shape scale (default: full on cuda)")
    synth.add_argument("--max-candidates", type=int, help="stop after this many candidates (default 20*N)")
    synth.add_argument("--batch-size", type=int, default=16)
    synth.add_argument("--endpoint", help="OpenAI-compatible base URL (composer llm)")
    synth.add_argument("--model", help="model name at the endpoint (composer llm)")
    synth.add_argument("--no-transformers", action="store_true", help="compose torch operators only")
    synth.add_argument(
        "--calibrate",
        action=argparse.BooleanOptionalAction,
        help="size each programmatic task on the target device until its eager time is in the runtime "
        "window (default: on for cuda, off for cpu)",
    )
    synth.add_argument(
        "--target-ms", type=float, help="calibration aim (default: the window's geometric middle)"
    )
    synth.add_argument(
        "--memory-fraction",
        type=float,
        default=0.1,
        help="calibrated task's peak memory cap, share of the device",
    )
    _filter_arguments(synth)

    catalogue = commands.add_parser("catalogue", help="crawl and probe operators; print coverage")
    catalogue.add_argument("--out", help="write the catalogue as JSON here (path or s3://)")
    catalogue.add_argument("--no-transformers", action="store_true")

    refilter = commands.add_parser("filter", help="run the filters over an Ops-6K-layout parquet file")
    refilter.add_argument("--input", required=True, help="parquet file (path or s3://)")
    refilter.add_argument("--out", required=True, help="directory or s3:// prefix")
    refilter.add_argument("--limit", type=int, help="only the first N rows")
    _filter_arguments(refilter)
    return parser


def _filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    parser.add_argument("--workers", type=int, default=1, help="filter processes (1: in this process)")
    parser.add_argument("--ray", action="store_true", help="fan the filters out as Ray tasks")
    parser.add_argument("--sandbox", help="sandbox server URL: run the execution filters in its sessions")
    parser.add_argument(
        "--benchmark", help="KernelBench-layout folder or s3:// prefix to decontaminate against"
    )
    parser.add_argument("--filters", help=f"comma-separated subset of {','.join(FILTER_ORDER)}")
    parser.add_argument("--min-ms", type=float, help="runtime filter lower bound (default 1 on cuda)")
    parser.add_argument("--max-ms", type=float, help="runtime filter upper bound (default 100 on cuda)")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--similarity", type=float, default=0.9, help="decontamination threshold")
    parser.add_argument(
        "--progress-every",
        type=int,
        help="off a terminal, a progress line per this many samples (default: a twentieth of the total)",
    )


def _check_device(args: argparse.Namespace) -> None:
    """Filters run here (no --ray, no --sandbox): a missing GPU would reject every candidate one by one."""
    if args.device == "cuda" and not args.ray and not args.sandbox:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda, but torch sees no CUDA device here (use --ray or --sandbox)")


def _filter_config(args: argparse.Namespace) -> FilterConfig:
    overrides: dict[str, Any] = {
        "compile_backend": args.compile_backend,
        "similarity_threshold": args.similarity,
    }
    if args.filters:
        overrides["enabled"] = tuple(name.strip() for name in args.filters.split(",") if name.strip())
    if args.min_ms is not None:
        overrides["min_runtime_ms"] = args.min_ms
    if args.max_ms is not None:
        overrides["max_runtime_ms"] = args.max_ms
    return FilterConfig.for_device(args.device, **overrides)


class LineProgress:
    """Progress for a log, not a terminal: one line each time the count passes a multiple of `every`, and a
    last line at the end (tqdm's bar is redrawn with carriage returns, which a log or `kubectl logs` shows
    as one growing line, so tqdm is used only on a terminal)."""

    def __init__(self, total: int, description: str, every: int, stream: TextIO) -> None:
        self.total, self.description, self.every, self.stream = total, description, max(1, every), stream
        self.count = 0
        self._started = time.monotonic()
        self._printed = -1

    def update(self, k: int) -> None:
        before, self.count = self.count, self.count + k
        if self.count // self.every > before // self.every:
            self._line()

    def _line(self) -> None:
        if self.count == self._printed:
            return
        self._printed = self.count
        elapsed = time.monotonic() - self._started
        print(f"{self.description} {self.count}/{self.total} ({elapsed:.0f} s)", file=self.stream, flush=True)

    def __enter__(self) -> LineProgress:
        self._line()  # a log shows the work has started, long before the first `every` samples
        return self

    def __exit__(self, *exc: object) -> None:
        self._line()


def _progress_bar(total: int, description: str, every: int | None = None) -> Any:
    """tqdm's bar on a terminal; elsewhere a line per `every` samples (default: a twentieth of the total)."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=description, unit="sample", file=sys.stderr)
    return LineProgress(total, description, every or max(1, -(-total // 20)), sys.stderr)


def _synth(args: argparse.Namespace) -> int:
    from cuda_agent.data import synth
    from cuda_agent.data.calibrate import Window, target_ms
    from cuda_agent.data.catalogue import build_catalogue
    from cuda_agent.data.compose import (
        Composer,
        EndpointConfig,
        LLMComposer,
        ProgrammaticComposer,
        openai_chat,
    )

    scale: Literal["small", "full"] = args.scale or ("full" if args.device == "cuda" else "small")
    endpoint = None
    if args.composer == "llm":
        endpoint = EndpointConfig.model_validate(
            {
                "base_url": args.endpoint or "",
                "model": args.model or "",
                "api_key": os.environ.get("OPENAI_API_KEY"),
            }
        )
    filters = _filter_config(args)
    calibration = CalibrationConfig(
        enabled=args.device == "cuda" if args.calibrate is None else args.calibrate,
        target_ms=args.target_ms,
        memory_fraction=args.memory_fraction,
    )
    aim = target_ms(Window(filters.min_runtime_ms, filters.max_runtime_ms), calibration)
    config = synth.SynthConfig(
        n=args.n,
        out=args.out,
        composer=args.composer,
        seed=args.seed,
        device=args.device,
        workers=args.workers,
        use_ray=args.ray,
        sandbox_url=args.sandbox,
        benchmark=args.benchmark,
        max_candidates=args.max_candidates,
        batch_size=args.batch_size,
        filters=filters,
        composing=ComposerConfig(
            scale=scale,
            include_transformers=not args.no_transformers,
            target_ms=aim if args.device == "cuda" else None,
        ),
        calibration=calibration,
        endpoint=endpoint,
    )
    catalogue = build_catalogue(config.composing.include_transformers)
    composer: Composer
    if endpoint is not None:
        composer = LLMComposer(catalogue, openai_chat(endpoint), config.composing, config.seed)
    else:
        composer = ProgrammaticComposer(catalogue, config.composing, config.seed)
    benchmark = synth.benchmark_index(config.benchmark)
    with _progress_bar(config.n, "accepted", args.progress_every) as bar:
        summary = synth.run(config, composer, benchmark, progress=bar.update)
    print(summary.model_dump_json(indent=2))
    return 0 if summary.accepted >= config.n else 1


def _catalogue(args: argparse.Namespace) -> int:
    from cuda_agent.data.catalogue import build_catalogue
    from cuda_agent.data.synth import write_catalogue

    catalogue = build_catalogue(not args.no_transformers)
    for status, count in sorted(catalogue.coverage().items()):
        print(f"{status:<12} {count}")
    if args.out:
        write_catalogue(args.out, list(catalogue.entries))
    return 0


def _refilter(args: argparse.Namespace) -> int:
    from cuda_agent.data import synth
    from cuda_agent.data.published import read_ops6k

    samples = read_ops6k(args.input)[: args.limit]
    config = synth.SynthConfig(
        n=max(1, len(samples)),
        out=args.out,
        device=args.device,
        workers=args.workers,
        use_ray=args.ray,
        sandbox_url=args.sandbox,
        benchmark=args.benchmark,
        filters=_filter_config(args),
    )
    fresh = [s.model_copy(update={"verdicts": [], "accepted": False, "rejected_by": None}) for s in samples]
    done = synth.load_existing(config.out)
    pending = [s for s in fresh if s.id not in done]
    benchmark = synth.benchmark_index(config.benchmark)
    from cuda_agent.data.pipeline import filter_samples
    from cuda_agent.data.published import jsonl, write_bytes

    with _progress_bar(len(samples), "filtered", args.progress_every) as bar:
        bar.update(len(samples) - len(pending))
        for start in range(0, len(pending), config.batch_size):
            batch = pending[start : start + config.batch_size]
            results = list(
                filter_samples(batch, config.filters, benchmark, workers=args.workers, use_ray=args.ray)
            )
            write_bytes(synth.shard_uri(config.out, batch[0].id), jsonl(results))
            done.update((s.id, s) for s in results)
            bar.update(len(batch))
    print(synth.finalize(config, done).model_dump_json(indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command != "catalogue":
            _check_device(args)
        if args.command == "synth":
            return _synth(args)
        if args.command == "catalogue":
            return _catalogue(args)
        return _refilter(args)
    except (ValidationError, ValueError, StorageError) as exc:
        print(f"cuda-agent data {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
