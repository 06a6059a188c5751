"""CUDA solution: row maxima, one 256-thread block per row, float4 loads, warp-shuffle max tree.

NaN propagates like torch.amax (fmaxf alone would drop it).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kThreads = 256;

__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || a > b) ? a : b;  // keeps a NaN from either side
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

__device__ float block_max(float v) {
    __shared__ float partial[kThreads / 32];
    v = warp_max(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : -INFINITY;
    if (warp == 0) v = warp_max(v);
    return v;
}

template <bool kVec4>
__global__ void row_max_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols) {
    const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
    float m0 = -INFINITY, m1 = -INFINITY, m2 = -INFINITY, m3 = -INFINITY;
    if (kVec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int64_t i = threadIdx.x; i < cols / 4; i += kThreads) {
            const float4 v = row4[i];
            m0 = nan_max(v.x, m0); m1 = nan_max(v.y, m1); m2 = nan_max(v.z, m2); m3 = nan_max(v.w, m3);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += kThreads) m0 = nan_max(row[i], m0);
    }
    const float best = block_max(nan_max(nan_max(m0, m1), nan_max(m2, m3)));
    if (threadIdx.x == 0) out[blockIdx.x] = best;
}

cudaError_t row_max_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const bool vec4 = cols % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    if (vec4) {
        row_max_kernel<true><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    } else {
        row_max_kernel<false><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    }
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t row_max_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

torch::Tensor row_max(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected a non-empty last dimension");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t cols = x.size(-1);
    auto out_sizes = x.sizes().vec();
    out_sizes.pop_back();
    auto out = torch::empty(out_sizes, x.options());
    const cudaError_t err = row_max_launch(x.data_ptr<float>(), out.data_ptr<float>(), x.numel() / cols, cols,
                                           at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "row_max launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_row_max_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["row_max"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_max(x)
