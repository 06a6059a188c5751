#!/usr/bin/env python3
"""Cross-check the judge's torch.compile baseline outside the judge: eager vs torch.compile of a task's
Model in a fresh process with a private inductor cache, timed by summing profiled kernel time (the
judge's method) and by CUDA events per call (KernelBench's), 100 calls after an L2 flush each.

    python bench/compile_baseline_check.py examples/tasks/mean_dim1.py [--scale full] [--calls 100]

A judge result whose `speedup.compile` is far from `speedup.eager` (a candidate "beating" compile by 2x
while it beats eager by 1.3x) should be reproduced here before it is believed. Prints one table.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="+", type=Path)
    parser.add_argument("--scale", default="full")
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args(argv)
    os.environ["CUDA_AGENT_TASK_SCALE"] = args.scale
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-check-")
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def kernel_ms(fn: Any, inputs: list[Any]) -> float:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.calls):
                flush.zero_()
                fn(*inputs)
            torch.cuda.synchronize()
        # Self device time counts each kernel once; the flush is a fill kernel.
        events = prof.key_averages()
        total_us = sum(e.self_device_time_total for e in events if "fill" not in e.key.lower())
        return total_us / 1000 / args.calls

    def event_ms(fn: Any, inputs: list[Any]) -> float:
        times = []
        for _ in range(args.calls):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)

    rows = [
        (
            "task",
            "eager kernel ms",
            "compile kernel ms",
            "compile/eager",
            "eager event ms",
            "compile event ms",
        )
    ]
    for path in args.tasks:
        spec = importlib.util.spec_from_file_location(f"task_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        task = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = task
        spec.loader.exec_module(task)
        torch.manual_seed(0)
        model = task.Model(*task.get_init_inputs()).cuda().eval()
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
        compiled = torch.compile(model)
        with torch.no_grad():
            for _ in range(3):
                model(*inputs)
                compiled(*inputs)
            eager_k, compile_k = kernel_ms(model, inputs), kernel_ms(compiled, inputs)
            eager_e, compile_e = event_ms(model, inputs), event_ms(compiled, inputs)
        rows.append(
            (
                path.stem,
                f"{eager_k:.4f}",
                f"{compile_k:.4f}",
                f"{compile_k / eager_k:.2f}",
                f"{eager_e:.4f}",
                f"{compile_e:.4f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
