"""Before / after of the data pipeline's device calibration (docs/data.md, issue 16): the same seeded
candidates through `cuda_agent.data.cli synth` without and with `--calibrate`, on one device, and a table
of accepted / rejected per filter and the eager-time distribution the runtime filter measured.

    python bench/data_calibration.py --device cuda --candidates 40 [--skip-before] [--out DIR]

Logs and each run's summary.json / dataset.jsonl / rejected.jsonl go under --out (default $OUT or /tmp).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FILTERS = "composed,decontamination,no_stochastic_ops,runs_eager,deterministic,nontrivial_output,runtime"


def synth(
    device: str, candidates: int, calibrate: bool, work: Path, extra: list[str]
) -> tuple[dict[str, Any], float]:
    out = work / ("after" if calibrate else "before")
    command = [
        sys.executable, "-m", "cuda_agent.data.cli", "synth", "--device", device,
        "--n", str(candidates), "--max-candidates", str(candidates), "--batch-size", "8",
        "--benchmark", "examples/tasks", "--filters", FILTERS, "--seed", "0",
        "--calibrate" if calibrate else "--no-calibrate", "--out", str(out), *extra,
    ]  # fmt: skip
    print("$", " ".join(command), flush=True)
    started = time.monotonic()
    subprocess.run(command, check=False)  # exits 1 when fewer than N were accepted: expected here
    return json.loads((out / "summary.json").read_text()), time.monotonic() - started


def eager_times(run: Path) -> list[float]:
    times = []
    for name in ("dataset.jsonl", "rejected.jsonl"):
        for line in (run / name).read_text().splitlines():
            sample = json.loads(line)
            times += [v["value"] for v in sample["verdicts"] if v["filter"] == "runtime" and v["value"]]
    return sorted(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--candidates", type=int, default=40)
    parser.add_argument("--skip-before", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    args, extra = parser.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="data-calibration-"))
    results = {}
    for calibrate in [True] if args.skip_before else [True, False]:  # after first: it is the point
        summary, seconds = synth(args.device, args.candidates, calibrate, work, extra)
        label = "after" if calibrate else "before"
        results[label] = (summary, seconds, eager_times(work / label))
        for name in ("summary.json", "dataset.jsonl", "rejected.jsonl"):
            shutil.copy(work / label / name, Path(args.out) / f"{label}_{name}")
    print("\nrun     cand  acc  rejected per filter" + " " * 23 + "eager ms p10/p50/p90   calibration   s")
    for label, (summary, seconds, times) in results.items():
        rejected = {k: v for k, v in summary["rejections"].items() if v}
        p = summary["runtime_ms"]
        spread = "/".join(f"{p.get(k, float('nan')):.2f}" for k in ("p10", "p50", "p90"))
        print(
            f"{label:<7} {summary['candidates']:>4} {summary['accepted']:>4}  {json.dumps(rejected):<42}"
            f"{spread:<22} {json.dumps(summary.get('calibration', {}))} {seconds:.0f}"
        )
        print(f"        eager ms of timed candidates: {[round(t, 2) for t in times]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
