"""CUDA solution: one 256-thread block per row, float4 loads, warp-shuffle tree reduction.

Four independent accumulators per thread keep the loads in flight; the tree keeps the fp32 error at
the level of eager's own reduction.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ float block_sum(float v) {
    __shared__ float partial[kThreads / 32];
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    return v;
}

template <bool kVec4>
__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols) {
    const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    if (kVec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int64_t i = threadIdx.x; i < cols / 4; i += kThreads) {
            const float4 v = row4[i];
            acc0 += v.x; acc1 += v.y; acc2 += v.z; acc3 += v.w;
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += kThreads) acc0 += row[i];
    }
    const float total = block_sum((acc0 + acc1) + (acc2 + acc3));
    if (threadIdx.x == 0) out[blockIdx.x] = total;
}

cudaError_t row_sum_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const bool vec4 = cols % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
    if (vec4) {
        row_sum_kernel<true><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    } else {
        row_sum_kernel<false><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    }
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t row_sum_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

torch::Tensor row_sum(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "x: expected at least one dimension");
    const c10::cuda::CUDAGuard guard(x.device());
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    auto out_sizes = x.sizes().vec();
    out_sizes.pop_back();
    auto out = torch::empty(out_sizes, x.options());
    const cudaError_t err = row_sum_launch(x.data_ptr<float>(), out.data_ptr<float>(), rows, cols,
                                           at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "row_sum launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_row_sum_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["row_sum"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_sum(x)
