#!/usr/bin/env python3
"""One-shot H200 run of `cuda-agent eval` over the example CUDA solutions, at full task scale.

Run from the repository root on the GPU machine (torch, ninja, nvcc; pydantic carried as wheels):

    OUT=/some/dir python3 tests/gpu/eval_gpu.py [--jobs 12] [--deadline 200] [--deps /tmp/site]

It runs `python -m cuda_agent.cli eval --solutions examples/solutions --tasks examples/tasks --device cuda
--out $OUT/eval` (local judge processes, --jobs in flight: builds overlap while the judges' device lock
serialises their timing) with PYTHONPATH = platform, trainer, sandbox_image (+ --deps), and
CUDA_AGENT_TASK_SCALE=full. The eval's own files (results.jsonl, report.json/.md, levels.png,
speedups.png) land in $OUT/eval and its output in $OUT/eval_gpu.log. A short table is printed last,
from results.jsonl, so a run stopped at the deadline still shows what finished.

Exit status: 0 when every solution was judged correct, 1 otherwise, 2 when the eval cannot start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _env(deps: Path | None, scale: str) -> dict[str, str]:
    paths = [str(REPO / "platform"), str(REPO / "trainer"), str(REPO / "sandbox_image")]
    if deps is not None:
        paths.insert(0, str(deps.resolve()))
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "CUDA_AGENT_TASK_SCALE": scale,
        "PYTHONUNBUFFERED": "1",
    }


def _table(results: Path) -> str:
    rows: dict[str, dict[str, object]] = {}
    if results.exists():
        for line in results.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["key"]] = row

    def x(value: object) -> str:
        return "-" if value is None else f"{float(str(value)):.2f}x"

    lines = [
        f"{'candidate':<28} {'reward':>6} {'correct':>7} {'vs eager':>9} {'vs compile':>10} {'s':>6}  reason"
    ]
    for key, row in sorted(rows.items()):
        reason = (
            "" if int(str(row["reward"])) > 0 else str((row.get("violations") or [row.get("error")])[0])[:60]
        )
        lines.append(
            f"{key:<28} {row['reward']!s:>6} {row['correct']!s:>7} {x(row.get('speedup_eager')):>9} "
            f"{x(row.get('speedup_compile')):>10} {float(str(row.get('seconds') or 0)):>6.1f}  {reason}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "eval_gpu_out")))
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--deadline", type=float, default=200.0, help="seconds for the eval run")
    parser.add_argument("--deps", type=Path, default=None, help="extra PYTHONPATH directory (pydantic)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--only", default=None, help="comma-separated task names")
    parser.add_argument("--scale", default="full", help="CUDA_AGENT_TASK_SCALE (small for a CPU smoke run)")
    args = parser.parse_args(argv)
    env = _env(args.deps, args.scale)
    out = args.out / "eval"
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, pydantic, cuda_agent.eval.cli; print(torch.__version__, "
         "torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    print(probe.stdout.strip() or probe.stderr.strip()[-2000:], flush=True)
    if probe.returncode != 0:
        print("eval_gpu: cannot start (see above)", flush=True)
        return 2
    command = [
        sys.executable,
        "-m",
        "cuda_agent.cli",
        "eval",
        "--solutions",
        str(REPO / "examples" / "solutions"),
    ]
    command += ["--tasks", str(REPO / "examples" / "tasks"), "--device", args.device, "--out", str(out)]
    command += ["--jobs", str(args.jobs), "--no-progress"]
    if args.only:
        command += ["--only", args.only]
    start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "eval_gpu.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            code = proc.wait(timeout=args.deadline)
        except subprocess.TimeoutExpired:
            proc.terminate()
            code = proc.wait()
            print(f"eval_gpu: deadline {args.deadline:.0f} s reached; partial results below", flush=True)
    wall = time.monotonic() - start
    print((args.out / "eval_gpu.log").read_text()[-4000:])
    print(_table(out / "results.jsonl"))
    report = out / "report.json"
    if report.exists():
        data = json.loads(report.read_text())
        o = data["overall"]
        print(
            f"eval_gpu: exit {code}, wall {wall:.0f} s, {data['evaluations']} evaluations, "
            f"{data['evaluations_per_gpu_hour']} per GPU-hour; pass {o['pass_rate']:.0%}, > eager "
            f"{o['faster_than_eager']:.0%}, > compile {o['faster_than_compile'] or 0:.0%}, geomean "
            f"{o['geomean_speedup_eager']} (eager) {o['geomean_speedup_compile']} (compile)"
        )
        return 0 if o["correct"] == o["candidates"] else 1
    print(f"eval_gpu: exit {code}, wall {wall:.0f} s, no report (stopped before the end)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
