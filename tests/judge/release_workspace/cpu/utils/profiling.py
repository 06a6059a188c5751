#!/usr/bin/env python3
"""The workspace's timing harness: Model, torch.compile(Model) and ModelNew, median of repeated calls."""

import statistics
import sys
import time

import torch

sys.path.insert(0, ".")


def median_ms(fn, inputs, repeats: int = 50) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*inputs)
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> int:
    import model
    import model_new

    init = model.get_init_inputs()
    reference = model.Model(*init)
    candidate = model_new.ModelNew(*init)
    inputs = model.get_inputs()
    with torch.no_grad():
        eager = median_ms(reference, inputs)
        try:
            compiled = median_ms(torch.compile(reference), inputs)
        except Exception as exc:
            print(f"[WARN] torch.compile unavailable: {exc}")
            compiled = float("nan")
        new = median_ms(candidate, inputs)
    print(f"Torch Baseline: {eager:.3f}ms, Torch Compile: {compiled:.3f}ms, CUDA Extension: {new:.3f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
