"""Where a load_inline candidate's cold build time goes, on the GPU machine (issue 12, item 5).

Compiles one KernelBench-style `cuda.cu` (assembled as torch 2.11's load_inline does: torch/types.h,
cuda.h, cuda_runtime.h, then the candidate's source with its own `#include <torch/extension.h>`) with
the judge's nvcc flags, under header variants, with `nvcc --time` for the per-phase split; then the same
unit four at a time, as four judges in flight would. Prints a table last; logs under $OUT.

    python3 bench/inline_build_probe.py [--out DIR]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CANDIDATE = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_mul_kernel(const float* a, const float* b, float* out, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) { float v = a[i] * b[i]; out[i] = v > 0.f ? v : 0.f; }
}

torch::Tensor relu_mul_cuda(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    relu_mul_kernel<<<blocks, threads>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

IMPLICIT = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"


def torch_includes() -> list[str]:
    import sysconfig

    from torch.utils.cpp_extension import include_paths

    return [*include_paths(device_type="cuda"), sysconfig.get_paths()["include"]]


def arch_flag() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"


def nvcc_cmd(source: Path, output: Path, extra: list[str]) -> list[str]:
    cmd = ["nvcc", "-c", str(source), "-o", str(output), "-DTORCH_EXTENSION_NAME=probe"]
    cmd += ["-DTORCH_API_INCLUDE_EXTENSION_H"]
    for inc in torch_includes():
        cmd += ["-isystem", inc]
    cmd += [
        "-D__CUDA_NO_HALF_OPERATORS__",
        "-D__CUDA_NO_HALF_CONVERSIONS__",
        "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-D__CUDA_NO_HALF2_OPERATORS__",
        "--expt-relaxed-constexpr",
        arch_flag(),
        "--compiler-options",
        "-fPIC",
        "-std=c++17",
        "-O3",
        *extra,
    ]
    return cmd


def compile_variant(name: str, code: str, extra: list[str], work: Path, log: list[str]) -> dict[str, float]:
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "cuda.cu"
    source.write_text(code)
    timing = directory / "time.csv"
    cmd = nvcc_cmd(source, directory / "cuda.o", [*extra, "--time", str(timing)])
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=directory, check=False)
    wall = time.monotonic() - start
    csv_text = timing.read_text() if timing.exists() else "(no --time file)"
    header = f"== {name} rc={proc.returncode} wall={wall:.1f}s\n{' '.join(cmd)}"
    log.append(f"{header}\n{proc.stdout}{proc.stderr}\n{csv_text}")
    phases: dict[str, float] = {"wall": wall, "rc": float(proc.returncode)}
    if timing.exists():
        with timing.open() as handle:
            for row in csv.reader(handle):
                # nvcc --time rows: source file, phase name, arch, tool, metric (ms)
                try:
                    value = float(row[-1])
                except (ValueError, IndexError):
                    continue
                phase = row[1].strip() if len(row) > 1 else "?"
                phases[phase] = phases.get(phase, 0.0) + value / 1000.0
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/probe")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="inline-probe-"))
    log: list[str] = []
    light = CANDIDATE.replace("#include <torch/extension.h>", "")
    at_names = light.replace("torch::Tensor", "at::Tensor").replace("torch::empty_like", "at::empty_like")
    variants = {
        "full (as load_inline)": (IMPLICIT + CANDIDATE, []),
        "types.h only": (IMPLICIT + light, []),
        "ATen/ATen.h": ("#include <ATen/ATen.h>\n" + at_names, []),
        "core/Tensor.h + ops": (
            "#include <ATen/core/Tensor.h>\n#include <ATen/ops/empty_like.h>\n#include <ATen/ops/empty.h>\n"
            "#include <ATen/ops/zeros.h>\n#include <c10/cuda/CUDAStream.h>\n#include <c10/cuda/CUDAGuard.h>\n"
            + at_names,
            [],
        ),
        "ATen/cuda/CUDAContext.h": (
            "#include <ATen/core/Tensor.h>\n#include <ATen/ops/empty_like.h>\n"
            "#include <ATen/cuda/CUDAContext.h>\n" + at_names,
            [],
        ),
        "full, host -O0": (IMPLICIT + CANDIDATE, ["-Xcompiler", "-O0"]),
    }
    rows: list[tuple[str, dict[str, float]]] = []
    for index, (name, (code, extra)) in enumerate(variants.items()):
        rows.append((name, compile_variant(f"v{index}", code, extra, work, log)))
    for label, code in (("full", IMPLICIT + CANDIDATE),):
        start = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            results = list(
                pool.map(
                    lambda i, c=code, n=label: compile_variant(f"par-{n}-{i}", c, [], work, log), range(4)
                )
            )
        rows.append((f"{label} x4 in flight", {"wall": time.monotonic() - start, **results[0]}))
    (args.out / "inline_build_probe.log").write_text("\n".join(log))
    phase_names = sorted({k for _, r in rows for k in r if k not in ("wall", "rc")})
    (args.out / "phases.tsv").write_text(
        "\n".join(
            "\t".join([name, f"{r['wall']:.2f}", *(f"{r.get(p, 0.0):.2f}" for p in phase_names)])
            for name, r in rows
        )
    )
    print("phases:", ", ".join(phase_names))
    print(f"{'variant':<28} {'wall s':>7} {'rc':>3}  top phases (s)")
    for name, r in rows:
        top = sorted(((v, k) for k, v in r.items() if k not in ("wall", "rc")), reverse=True)[:4]
        print(f"{name:<28} {r['wall']:>7.1f} {int(r['rc']):>3}  " + ", ".join(f"{k} {v:.1f}" for v, k in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
