#!/usr/bin/env python3
"""Digest of tests/gpu/judge_gpu.py's reports: one block per candidate with its reward, speedups,
violations and error, the library-work notes, and (with CUDA_AGENT_JUDGE_DEBUG=1) the kernels and streams
the first trial launched. Standard library only (runs on the GPU machine after judge_gpu.py).

    python3 tests/gpu/judge_report_digest.py $OUT/judge_gpu
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def digest(path: Path) -> str:
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return f"== {path.stem}: unreadable ({exc})"
    speed = report.get("speedup") or {}
    lines = [
        f"== {path.stem}: reward {report.get('reward')} correct {report.get('correct')} "
        f"speedup eager {speed.get('eager')} compile {speed.get('compile')} "
        f"timings {report.get('timings_ms')} build {report.get('seconds', {}).get('build')}"
    ]
    lines += [f"   violation: {v[:300]}" for v in report.get("violations") or []]
    if report.get("error"):
        lines.append(f"   error: {str(report['error'])[:600]}")
    for note in report.get("notes") or []:
        if note.startswith("library work"):
            lines.append(f"   {note}")
        elif note.startswith("debug: trial 1 observations"):
            observed = json.loads(note.split("observations ", 1)[1]) if note.endswith("}") else {}
            lines.append(f"   current stream {observed.get('current_stream')}")
            for k in observed.get("kernels") or []:
                lines.append(f"   kernel stream {k['stream']} {k['origin']} {k['ns']} ns: {k['name'][:160]}")
    if not report.get("compiled") and report.get("build_log"):
        lines.append("   build log: " + str(report["build_log"])[:1500])
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else Path("judge_gpu_out/judge_gpu")
    for path in sorted(directory.glob("*.json")):
        if path.name != "summary.json":
            print(digest(path))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
