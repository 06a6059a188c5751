"""Smoke test of the judge engine on a real GPU (run on the lent H200; not collected by pytest).

Builds and judges a few CUDA candidates through the real CLI (`cuda-agent judge`, one process per run):
legitimate workspace and load_inline kernels must pass; a side stream, a PyTorch fallback, an
uninitialised output and a TF32 cuBLAS GEMM under strict-fp32 must get -1 with the right code. Then it
re-judges one candidate several times to see how well the speedups repeat. Writes every JSON result and
a summary under $OUT; prints a short table last.

  PYTHONPATH=sandbox_image:platform python3 tests/gpu/judge_engine_smoke.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS: dict[str, dict] = {}
OUT = Path(os.environ.get("OUT", "/tmp/judge-engine-smoke"))
BUDGET_S = float(os.environ.get("SMOKE_BUDGET_S", "540"))

RELU_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def get_inputs():
    return [torch.randn(4096, 4096)]


def get_init_inputs():
    return []
"""

MATMUL_TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(512, 256), torch.randn(256, 512)]


def get_init_inputs():
    return []
"""

RELU_CU = r"""
#include <cuda_runtime.h>
#include <cstdint>

__global__ void relu2_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) {
    float v = in[i];
    out[i] = v > 0.f ? 2.f * v : 0.f;
  }
}

void relu2_launch(const float* in, float* out, int64_t n, cudaStream_t stream) {
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 132 * 32) blocks = 132 * 32;
  STREAM_SETUP
  relu2_kernel<<<(int)blocks, threads, 0, LAUNCH_STREAM>>>(in, out, n);
}
"""

RELU_BINDING = r"""
#include "binding_registry.h"
#include <ATen/cuda/CUDAContext.h>

void relu2_launch(const float* in, float* out, int64_t n, cudaStream_t stream);

static torch::Tensor relu2_forward(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32,
              "x: contiguous cuda float32");
  auto out = torch::empty_like(x);
  auto target = RETURN_EMPTY ? torch::empty_like(x) : out;
  relu2_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), at::cuda::getCurrentCUDAStream());
  return target;
}

REGISTER_BINDING(relu2, [](pybind11::module& m) { m.def("relu2", &relu2_forward); });
"""

WS_MODEL_NEW = """
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, x):
        out = cuda_extension.relu2(x)
        FALLBACK
        return out
"""

INLINE_MODEL_NEW = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = """
#include <ATen/cuda/CUDAContext.h>

__global__ void relu2_inline_kernel(const float* __restrict__ in, float* __restrict__ out, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) {
    float v = in[i];
    out[i] = v > 0.f ? 2.f * v : 0.f;
  }
}

torch::Tensor relu2(torch::Tensor x) {
  auto out = torch::empty_like(x);
  int64_t n = x.numel();
  int64_t blocks = (n + 255) / 256;
  if (blocks > 132 * 32) blocks = 132 * 32;
  relu2_inline_kernel<<<(int)blocks, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}
"""

ext = load_inline(
    name="relu2_inline_ext",
    cpp_sources="torch::Tensor relu2(torch::Tensor x);",
    cuda_sources=cuda_source,
    functions=["relu2"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu2(x.contiguous())
'''

TF32_CU = r"""
#include <cuda_runtime.h>
__global__ void scale_by_one_kernel(float* p, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = p[i] * 1.0f;
}
void scale_by_one(float* p, int n, cudaStream_t s) {
  scale_by_one_kernel<<<(n + 255) / 256, 256, 0, s>>>(p, n);
}
"""

TF32_BINDING = r"""
#include "binding_registry.h"
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>

void scale_by_one(float* p, int n, cudaStream_t s);

static torch::Tensor mm_forward(torch::Tensor a, torch::Tensor b) {
  const int m = a.size(0), k = a.size(1), n = b.size(1);
  auto c = torch::empty({m, n}, a.options());
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH);
  const float alpha = 1.f, beta = 0.f;
  // row-major C = A B is column-major C^T = B^T A^T
  cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b.data_ptr<float>(), n,
              a.data_ptr<float>(), k, &beta, c.data_ptr<float>(), n);
  cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH);
  scale_by_one(c.data_ptr<float>(), m * n, at::cuda::getCurrentCUDAStream());
  return c;
}

REGISTER_BINDING(mm, [](pybind11::module& m) { m.def("mm", &mm_forward); });
"""

TF32_MODEL_NEW = """
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def forward(self, a, b):
        return cuda_extension.mm(a.contiguous(), b.contiguous())
"""


def relu_ws(root: Path, *, side_stream: bool = False, fallback: bool = False, empty: bool = False) -> Path:
    (root / "kernels").mkdir(parents=True)
    cu = RELU_CU.replace("LAUNCH_STREAM", "side" if side_stream else "stream")
    setup = (
        "static cudaStream_t side = nullptr;\n"
        "  if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);"
    )
    (root / "kernels" / "relu.cu").write_text(cu.replace("STREAM_SETUP", setup if side_stream else ""))
    binding = RELU_BINDING.replace("RETURN_EMPTY", "true" if empty else "false")
    (root / "kernels" / "relu_binding.cpp").write_text(binding)
    model_new = WS_MODEL_NEW.replace("FALLBACK", "out = torch.relu(x) * 2.0" if fallback else "")
    (root / "model_new.py").write_text(model_new)
    return root


def tf32_workspace(root: Path) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "scale.cu").write_text(TF32_CU)
    (root / "kernels" / "mm_binding.cpp").write_text(TF32_BINDING)
    (root / "model_new.py").write_text(TF32_MODEL_NEW)
    return root


def judge(name: str, task: Path, candidate: Path, *extra: str, timeout: float = 480) -> dict:
    env = {**os.environ, "CUDA_AGENT_JUDGE_DEBUG": "1"}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "sandbox_image"), str(REPO / "platform"), env.get("PYTHONPATH", "")]
    )
    boot = "import sys; from cuda_agent.sandbox.judge.cli import main; sys.exit(main(sys.argv[1:]))"
    cmd = [sys.executable, "-c", boot, str(task), str(candidate), "--device", "cuda", "--json", *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    seconds = time.monotonic() - start
    with open(OUT / "stderr_tails.txt", "a") as log:
        log.write(f"===== {name} (exit {proc.returncode})\n{proc.stderr[-20_000:]}\n")
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = {"reward": None, "error": f"exit {proc.returncode}; stdout {proc.stdout[:300]!r}"}
    report["wall_s"] = seconds
    RESULTS[name] = report
    (OUT / "results.json").write_text(json.dumps(RESULTS, indent=1))
    return report


def kineto_probe() -> list[str]:
    """Raw profiler events of one aten op and one runtime call: how kineto links device work to launches."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(1 << 20, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with record_function("probe.range"):
            x.mul_(2.0)
        torch.cuda.synchronize()
    lines = []
    for e in prof.profiler.kineto_results.events():
        lines.append(
            f"{e.device_type()!s:<16} corr={e.correlation_id():<6} linked={e.linked_correlation_id():<6} "
            f"res={e.device_resource_id():<8} ann={int(e.is_user_annotation())} {e.name()[:70]}"
        )
    return lines


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    probe = kineto_probe()
    (OUT / "kineto_probe.txt").write_text("\n".join(probe) + "\n")
    work = Path(tempfile.mkdtemp(prefix="judge-smoke-"))
    os.environ.setdefault("CUDA_AGENT_JUDGE_CACHE", str(work / "cache"))
    relu_task = work / "relu_task.py"
    relu_task.write_text(RELU_TASK)
    mm_task = work / "mm_task.py"
    mm_task.write_text(MATMUL_TASK)
    inline = work / "inline_relu.py"
    inline.write_text(INLINE_MODEL_NEW)
    no_compile = ("--compile-mode", "none")
    cases = [
        ("ws_relu", relu_task, relu_ws(work / "ws_relu"), "pass", ("--compile-mode", "default")),
        ("inline_relu", relu_task, inline, "pass", no_compile),
        (
            "side_stream",
            relu_task,
            relu_ws(work / "side", side_stream=True),
            "side-stream",
            no_compile,
        ),
        (
            "fallback",
            relu_task,
            relu_ws(work / "fallback", fallback=True),
            "torch-compute",
            no_compile,
        ),
        ("empty_out", relu_task, relu_ws(work / "empty", empty=True), "nonfinite|wrong", no_compile),
        ("tf32_cublas", mm_task, tf32_workspace(work / "tf32"), "precision|wrong", no_compile),
    ]
    rows = []
    for name, task, candidate, expect, extra in cases:
        if time.monotonic() - start > BUDGET_S:
            rows.append((name, expect, "skipped (budget)", "", "", ""))
            continue
        r = judge(name, task, candidate, *extra)
        codes = sorted({v.split(":")[0] for v in r.get("violations") or []})
        what = ",".join(codes) or (r.get("error") or "")[:60]
        t = r.get("timings_ms") or {}
        times = f"{t.get('candidate')}/{t.get('eager')}/{t.get('compile')}"
        rows.append((name, expect, str(r.get("reward")), what, times, f"{r.get('wall_s', 0):.0f}s"))
    speedups = []
    for i in range(3):
        if time.monotonic() - start > BUDGET_S:
            break
        r = judge(f"repeat_{i}", relu_task, work / "ws_relu", "--compile-mode", "default")
        speedups.append(((r.get("speedup") or {}).get("eager"), (r.get("speedup") or {}).get("compile")))
    summary = {"rows": rows, "repeat_speedups": speedups}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    header = ("case", "expect", "reward", "violations/error", "cand/eager/compile ms", "wall")
    print(f"\n{header[0]:<13} {header[1]:<17} {header[2]:<7} {header[3]:<36} {header[4]:<22} {header[5]}")
    for row in rows:
        print(f"{row[0]:<13} {row[1]:<17} {row[2]:<7} {row[3][:36]:<36} {row[4][:22]:<22} {row[5]}")
    eager = [s[0] for s in speedups if s[0]]
    comp = [s[1] for s in speedups if s[1]]
    for label, values in (("eager", eager), ("compile", comp)):
        if len(values) > 1:
            cv = statistics.pstdev(values) / statistics.fmean(values)
            print(f"repeat speedup vs {label}: {[f'{v:.3f}' for v in values]} CV {cv * 100:.2f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
