"""CUDA solution: exact-erf GELU(x) * sigmoid(y) in one float4-vectorised pass (eager: three kernels).

Uses the accurate erff/expf (not the fast-math intrinsics) so the fp32 error stays at eager's level.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

__device__ __forceinline__ float gelu_sigmoid_one(float x, float y) {
    const float gelu = 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
    return gelu / (1.0f + expf(-y));
}

__global__ void gelu_sigmoid_vec4(const float4* __restrict__ x, const float4* __restrict__ y,
                                  float4* __restrict__ out, int64_t n4) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 vx = x[i], vy = y[i];
        float4 r;
        r.x = gelu_sigmoid_one(vx.x, vy.x);
        r.y = gelu_sigmoid_one(vx.y, vy.y);
        r.z = gelu_sigmoid_one(vx.z, vy.z);
        r.w = gelu_sigmoid_one(vx.w, vy.w);
        out[i] = r;
    }
}

__global__ void gelu_sigmoid_scalar(const float* __restrict__ x, const float* __restrict__ y,
                                    float* __restrict__ out, int64_t begin, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = gelu_sigmoid_one(x[i], y[i]);
    }
}

static int grid_for(int64_t work, int threads) {
    const int64_t blocks = (work + threads - 1) / threads;
    return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

cudaError_t gelu_sigmoid_launch(const float* x, const float* y, float* out, int64_t n, cudaStream_t stream) {
    const int threads = 256;
    const bool aligned =
        ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
    int64_t done = 0;
    if (aligned && n >= 4) {
        const int64_t n4 = n / 4;
        gelu_sigmoid_vec4<<<grid_for(n4, threads), threads, 0, stream>>>(
            reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(y), reinterpret_cast<float4*>(out), n4);
        done = n4 * 4;
    }
    if (done < n) {
        gelu_sigmoid_scalar<<<grid_for(n - done, threads), threads, 0, stream>>>(x, y, out, done, n);
    }
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t gelu_sigmoid_launch(const float* x, const float* y, float* out, int64_t n, cudaStream_t stream);

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, ": expected float32");
    TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
}

torch::Tensor gelu_sigmoid(torch::Tensor x, torch::Tensor y) {
    check_input(x, "x");
    check_input(y, "y");
    TORCH_CHECK(x.sizes() == y.sizes(), "x and y must have one shape");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    const cudaError_t err = gelu_sigmoid_launch(x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(),
                                                x.numel(), at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "gelu_sigmoid launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_gelu_sigmoid_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["gelu_sigmoid"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return _ext.gelu_sigmoid(x, y)
