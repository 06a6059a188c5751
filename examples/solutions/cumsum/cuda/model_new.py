"""CUDA solution: inclusive scan along the last dimension, one 512-thread block per row.

The row is processed in chunks of 8192: a coalesced load into (bank-conflict padded) shared memory,
16 consecutive elements per thread scanned serially, a warp-shuffle scan of the per-thread totals, and
a coalesced store. Sums are carried in double so long rows do not drift (eager's CPU scan is double too).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kThreads = 512, kItems = 16, kChunk = kThreads * kItems, kWarps = kThreads / 32;

// One padding slot per 32 floats: thread t's 16 consecutive elements then land in 16 distinct banks
// across the warp, instead of all lanes hitting the same two banks.
__device__ __forceinline__ int padded(int i) { return i + (i >> 5); }

__device__ __forceinline__ double warp_inclusive_scan(double v) {
    const int lane = threadIdx.x & 31;
    for (int offset = 1; offset < 32; offset <<= 1) {
        const double up = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v += up;
    }
    return v;
}

__global__ void __launch_bounds__(kThreads)
cumsum_rows_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols) {
    __shared__ float tile[kChunk + kChunk / 32];
    __shared__ double warp_totals[kWarps];
    __shared__ double chunk_total;
    const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
    float* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double carry = 0.0;

    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
        const int64_t len = cols - c0 < kChunk ? cols - c0 : kChunk;
        for (int i = threadIdx.x; i < kChunk; i += kThreads) tile[padded(i)] = i < len ? row[c0 + i] : 0.0f;
        __syncthreads();

        double local[kItems];
        double running = 0.0;
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            running += static_cast<double>(tile[padded(threadIdx.x * kItems + j)]);
            local[j] = running;
        }
        const double inclusive = warp_inclusive_scan(running);
        if (lane == 31) warp_totals[warp] = inclusive;
        __syncthreads();
        if (warp == 0) {
            const double total = lane < kWarps ? warp_totals[lane] : 0.0;
            const double scanned = warp_inclusive_scan(total);
            if (lane < kWarps) warp_totals[lane] = scanned - total;  // exclusive prefix of each warp
            if (lane == 31) chunk_total = scanned;
        }
        __syncthreads();
        const double prefix = carry + warp_totals[warp] + (inclusive - running);
#pragma unroll
        for (int j = 0; j < kItems; ++j) tile[padded(threadIdx.x * kItems + j)] = static_cast<float>(prefix + local[j]);
        __syncthreads();
        for (int i = threadIdx.x; i < len; i += kThreads) dst[c0 + i] = tile[padded(i)];
        carry += chunk_total;
        __syncthreads();  // the next chunk overwrites tile and chunk_total
    }
}

cudaError_t cumsum_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    cumsum_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t cumsum_launch(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream);

torch::Tensor cumsum_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "x: expected at least one dimension");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const cudaError_t err = cumsum_launch(x.data_ptr<float>(), out.data_ptr<float>(), rows, cols,
                                          at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "cumsum launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_cumsum_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["cumsum_rows"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.cumsum_rows(x)
