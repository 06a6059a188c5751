"""`cuda-agent judge-seed --out DIR [--device cpu|cuda] [--flags FLAGS ...]`: build the judge's seed.

A seed holds precompiled torch headers (`pch/<key>/`, keyed exactly as the judge's build looks them up) for
the flag sets a candidate uses by default, so a judge with an empty build cache (every session's first
build) skips the ~40 s header build. No candidate code is involved. The seed is trusted input compiled
into every candidate's build: build it from the image or as the server's operator, into a directory no
judge or agent can write (the server refuses one they could; docs/judge.md, "Build and cache").

Atomic and idempotent: each entry is compiled in DIR/tmp and renamed into place whole; entries already
present are kept, so re-running takes seconds. Concurrent runs on one DIR wait for each other (DIR/seed.lock).
Exit 0 when every entry is present; 2 with the reason (a compiler's output, say) on stderr otherwise.
"""

from __future__ import annotations

import argparse
import fcntl
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cuda_agent.api.judge import DEVICES

SEED_TIMEOUT_S = 1800.0  # per flag set: a cold header takes ~40 s on two cores, ~40-90 s on a busy one


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"cuda-agent judge-seed: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="cuda-agent judge-seed",
        description="Build the judge's read-only seed of precompiled torch headers (no candidate code).",
    )
    p.add_argument("--out", type=Path, required=True, help="the seed directory (created; entries added)")
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="the judge's device (default: cuda when this host has a GPU); cuda needs nvcc, not a GPU",
    )
    p.add_argument(
        "--flags",
        action="append",
        default=None,
        metavar="FLAGS",
        help="a load_inline extra_cflags set to seed, as one shell-quoted string written --flags=FLAGS "
        "(--flags= for none); repeat for more. Default: workspace bindings, load_inline without "
        "extra_cflags, and with -O3",
    )
    return p


def _prepare(out: Path) -> None:
    """The seed's directories, readable by every uid (root-mode judges run as other users), writable by
    their owner only; leftovers of an interrupted run are removed (the caller holds the lock)."""
    for directory in (out, out / "pch", out / "tmp"):
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
    for leftover in (out / "tmp").iterdir():
        shutil.rmtree(leftover, ignore_errors=True)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    flag_sets: dict[str, tuple[str, ...]]
    if args.flags is None:
        from cuda_agent.sandbox.judge.build import SEED_FLAG_SETS

        flag_sets = dict(SEED_FLAG_SETS)
    else:
        flag_sets = {f"extra_cflags={shlex.split(text)!r}": tuple(shlex.split(text)) for text in args.flags}
    import torch

    from cuda_agent.sandbox.judge import build, confinement

    device = args.device or ("cuda" if confinement.cuda_host() else "cpu")
    # No GPU where images are built: the header's key does not depend on it (build._pch_key).
    capability = (0, 0) if device == "cuda" and not torch.cuda.is_available() else None
    out: Path = args.out.absolute()
    try:
        toolchain = build.detect_toolchain(device, capability)
        if device == "cuda" and toolchain.nvcc is None:
            raise RuntimeError("--device cuda: nvcc not found (the CUDA toolkit's headers key the seed)")
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "seed.lock", "a") as lock:
            (out / "seed.lock").chmod(0o644)
            fcntl.flock(lock, fcntl.LOCK_EX)
            _prepare(out)
            for label, flags in flag_sets.items():
                start = time.monotonic()
                key, built = build.seed_pch(toolchain, out, flags, time.monotonic() + SEED_TIMEOUT_S)
                took = f"built in {time.monotonic() - start:.1f} s" if built else "present"
                print(f"{device} {label}: {out / 'pch' / key} ({took})", flush=True)
    except (OSError, RuntimeError, build.BuildTimeout) as exc:
        print(f"cuda-agent judge-seed: {out}: {str(exc).strip() or type(exc).__name__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
