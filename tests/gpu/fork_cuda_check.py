#!/usr/bin/env python3
"""Which modules may a judge zygote import before forking, so that its grandchildren can still use CUDA?

One fresh parent process per stage imports the stage's modules (and optionally runs inductor's CPU ISA
probe), with or without PYTORCH_NVML_BASED_CUDA_CHECK=1, while recording every call that reaches the
CUDA runtime from Python (torch.cuda functions that are not pure bookkeeping, torch._C._cuda_* entry
points) and whether libcuda got mapped. It then forks the way the judge does: a judge-like child forks
a worker-like grandchild first, then both use CUDA. The grandchild reports generators, RNG state, a
seeded draw and a torch.compile call; the child draws with the same seed. Both draws are compared with
the same draw in a process that preloaded nothing, which is what "task inputs are reproducible" means.
Run on the GPU machine (pydantic on PYTHONPATH for the judge stages):

    PYTHONPATH=sandbox_image:platform:/tmp/site python3 tests/gpu/fork_cuda_check.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

JUDGE = [f"cuda_agent.sandbox.judge.{name}" for name in ("cli", "orchestrator", "worker")]
STAGES = {
    "dynamo": ["torch", "torch._dynamo"],
    "compile_fx": ["torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codecache"],
    "judge": ["torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.codecache", *JUDGE],
}

PROBE = r"""
import importlib, json, os, sys, threading, traceback
import torch
seen = []
BOOKKEEPING = {"_is_compiled", "_nvml_based_avail", "is_initialized", "_is_in_bad_fork", "<module>",
               "_lazy_call", "_parse_visible_devices", "<genexpr>", "<lambda>", "_get_device_index"}
def note(name, frame):
    stack = "".join(traceback.format_stack(frame, limit=6)) if frame is not None else ""
    seen.append({"call": name, "stack": stack[-1500:]})
def profile(frame, event, arg):
    code = frame.f_code
    if event == "call" and "torch/cuda/" in code.co_filename and code.co_name not in BOOKKEEPING:
        note(f"torch.cuda.{frame.f_code.co_name}", frame.f_back)
    elif event == "c_call" and getattr(arg, "__name__", "").startswith("_cuda_"):
        note(f"torch._C.{arg.__name__}", frame)
sys.setprofile(profile)
for name in sys.argv[1].split(","):
    importlib.import_module(name)
if sys.argv[2] == "isa":
    from torch._inductor import cpu_vec_isa
    cpu_vec_isa.valid_vec_isa_list()
sys.setprofile(None)
maps = open("/proc/self/maps").read()
parent = {"calls": seen, "libcuda_mapped": "libcuda.so" in maps, "libnvml_mapped": "libnvidia-ml" in maps,
          "threads": threading.active_count(), "initialized": bool(torch.cuda.is_initialized())}

def draw():
    torch.manual_seed(1234)
    with torch.device("cuda"):
        return torch.randn(4096).sum().item()

r, w = os.pipe()
if os.fork() == 0:  # the judge
    go_r, go_w = os.pipe()
    if os.fork() == 0:  # the worker, forked before the judge touches CUDA
        report = {}
        try:
            report["bad_fork"] = bool(torch.cuda._is_in_bad_fork())
            report["worker_draw"] = draw()
            report["device_count"] = torch.cuda.device_count()
            report["generators"] = len(torch.cuda.default_generators)
            torch.cuda.get_rng_state()
            try:
                f = torch.compile(lambda x: torch.relu(x) * 2 + 1)
                x = torch.randn(4096, device="cuda")
                report["compile_ok"] = bool(torch.allclose(f(x), torch.relu(x) * 2 + 1))
            except Exception as exc:
                report["compile_ok"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        except Exception as exc:
            report["error"] = f"{type(exc).__name__}: {str(exc)[:300]} {traceback.format_exc()[-800:]}"
        os.write(w, json.dumps(report).encode())
        os._exit(0)
    judge = {}
    try:
        judge["judge_draw"] = draw()
    except Exception as exc:
        judge["judge_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    os.wait()
    os.write(w, b"\n" + json.dumps(judge).encode())
    os._exit(0)
os.close(w)
os.wait()
chunks = b""
while data := os.read(r, 1 << 16):
    chunks += data
report = {}
for line in chunks.decode().splitlines():
    report.update(json.loads(line))
report["parent"] = parent
print(json.dumps(report))
"""

REFERENCE = (
    "import torch\ntorch.manual_seed(1234)\n"
    "with torch.device('cuda'):\n    print(torch.randn(4096).sum().item())\n"
)


def main(argv: list[str]) -> int:
    """argv: optional filters, e.g. `nvml=1` or `judge+isa`; a variant runs when its name contains all."""
    out = os.environ.get("OUT", ".")
    reference = float(
        subprocess.run(
            [sys.executable, "-c", REFERENCE], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    rows, full = [], {}
    for nvml in ("0", "1"):
        for label, modules in STAGES.items():
            for isa in ("no", "isa"):
                key = f"nvml={nvml} {label}+{isa}"
                if not all(f in key for f in argv):
                    continue
                env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": nvml}
                if nvml == "0":
                    env.pop("PYTORCH_NVML_BASED_CUDA_CHECK")
                proc = subprocess.run(
                    [sys.executable, "-c", PROBE, ",".join(modules), isa],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
                try:
                    report = json.loads(proc.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    report = {"error": proc.stderr.strip()[-600:]}
                full[key] = report
                parent = report.get("parent", {})
                calls = sorted({c["call"] for c in parent.get("calls", [])})
                good = (
                    report.get("compile_ok") is True
                    and report.get("worker_draw") == reference
                    and report.get("judge_draw") == reference
                )
                rows.append(good)
                draws = [report.get(k) == reference for k in ("worker_draw", "judge_draw")]
                compiled, error = str(report.get("compile_ok"))[:80], str(report.get("error", ""))[:200]
                print(
                    f"{key:<28} ok={good!s:<5} gens={report.get('generators')} draws={draws} "
                    f"compile={compiled} err={error} libcuda={parent.get('libcuda_mapped')} calls={calls}",
                    flush=True,
                )
    with open(os.path.join(out, "fork_cuda_check.json"), "w") as fh:
        json.dump(full, fh, indent=1)
    return 0 if all(rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
