#!/usr/bin/env python3
"""Which modules may a judge zygote import before forking, so that its grandchildren (zygote -> judge ->
worker) can still use CUDA, reproduce seeded CUDA inputs and torch.compile? One fresh parent process per
stage imports the stage's modules (no CUDA call), forks a judge-like child that forks a worker-like
grandchild, and the grandchild reports. Run on the GPU machine:

    python3 tests/gpu/fork_cuda_check.py
"""

from __future__ import annotations

import json
import subprocess
import sys

STAGES = {
    "torch": ["torch"],
    "dynamo": ["torch", "torch._dynamo"],
    "compile_fx": ["torch", "torch._dynamo", "torch._inductor.compile_fx"],
    "codecache": ["torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codecache"],
    "triton_heuristics": [
        "torch",
        "torch._dynamo",
        "torch._inductor.compile_fx",
        "torch._inductor.codecache",
        "torch._inductor.runtime.triton_heuristics",
    ],
}

PROBE = r"""
import importlib, json, os, sys
for name in sys.argv[1].split(","):
    importlib.import_module(name)
if sys.argv[2] == "isa":
    from torch._inductor import cpu_vec_isa
    cpu_vec_isa.valid_vec_isa_list()
import torch
r, w = os.pipe()
if os.fork() == 0:  # the judge
    if os.fork() == 0:  # the worker
        report = {}
        try:
            report["bad_fork"] = bool(torch.cuda._is_in_bad_fork())
            torch.empty(1, device="cuda")
            report["device_count"] = torch.cuda.device_count()
            draws = []
            for _ in range(2):
                torch.manual_seed(1234)
                with torch.device("cuda"):
                    draws.append(torch.randn(1000).sum().item())
            report["seeded_equal"] = draws[0] == draws[1]
            try:
                f = torch.compile(lambda x: torch.relu(x) * 2 + 1)
                x = torch.randn(4096, device="cuda")
                report["compile_ok"] = bool(torch.allclose(f(x), torch.relu(x) * 2 + 1))
            except Exception as exc:
                report["compile_ok"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    os.wait()
    os._exit(0)
os.close(w)
os.wait()
print(os.read(r, 1 << 16).decode())
"""


def main() -> int:
    rows = []
    for label, modules in STAGES.items():
        for isa in ("no", "isa"):
            proc = subprocess.run(
                [sys.executable, "-c", PROBE, ",".join(modules), isa],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            try:
                report = json.loads(proc.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                report = {"error": proc.stderr.strip()[-300:]}
            rows.append((f"{label}+{isa}", report))
            print(f"{label:<18} isa={isa:<3} {json.dumps(report)}", flush=True)
    return 0 if all(r.get("compile_ok") is True and r.get("seeded_equal") for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
