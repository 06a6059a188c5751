"""CUDA solution: relu(a * b) + c fused into one memory-bound pass with 16-byte (float4) loads and stores.

Eager runs three kernels and moves 8 tensors' worth of bytes; this kernel reads three and writes one.
The raw kernel takes pointers and the caller's stream; the C++ wrapper owns all torch types.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

__device__ __forceinline__ float relu_mul_add_one(float a, float b, float c) {
    const float p = a * b;
    return (p > 0.0f ? p : 0.0f) + c;
}

__global__ void relu_mul_add_vec4(const float4* __restrict__ a, const float4* __restrict__ b,
                                  const float4* __restrict__ c, float4* __restrict__ out, int64_t n4) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
        const float4 va = a[i], vb = b[i], vc = c[i];
        float4 r;
        r.x = relu_mul_add_one(va.x, vb.x, vc.x);
        r.y = relu_mul_add_one(va.y, vb.y, vc.y);
        r.z = relu_mul_add_one(va.z, vb.z, vc.z);
        r.w = relu_mul_add_one(va.w, vb.w, vc.w);
        out[i] = r;
    }
}

__global__ void relu_mul_add_scalar(const float* __restrict__ a, const float* __restrict__ b,
                                    const float* __restrict__ c, float* __restrict__ out, int64_t begin, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = relu_mul_add_one(a[i], b[i], c[i]);
    }
}

static int grid_for(int64_t work, int threads) {
    const int64_t blocks = (work + threads - 1) / threads;
    return static_cast<int>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

cudaError_t relu_mul_add_launch(const float* a, const float* b, const float* c, float* out, int64_t n,
                                cudaStream_t stream) {
    const int threads = 256;
    const bool aligned = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                           reinterpret_cast<uintptr_t>(c) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
    int64_t done = 0;
    if (aligned && n >= 4) {
        const int64_t n4 = n / 4;
        relu_mul_add_vec4<<<grid_for(n4, threads), threads, 0, stream>>>(
            reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b),
            reinterpret_cast<const float4*>(c), reinterpret_cast<float4*>(out), n4);
        done = n4 * 4;
    }
    if (done < n) {
        relu_mul_add_scalar<<<grid_for(n - done, threads), threads, 0, stream>>>(a, b, c, out, done, n);
    }
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t relu_mul_add_launch(const float* a, const float* b, const float* c, float* out, int64_t n,
                                cudaStream_t stream);

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, ": expected float32");
    TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
}

torch::Tensor relu_mul_add(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    check_input(a, "a");
    check_input(b, "b");
    check_input(c, "c");
    TORCH_CHECK(a.sizes() == b.sizes() && a.sizes() == c.sizes(), "a, b and c must have one shape");
    const c10::cuda::CUDAGuard guard(a.device());
    auto out = torch::empty_like(a);
    const cudaError_t err = relu_mul_add_launch(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(),
                                                out.data_ptr<float>(), a.numel(),
                                                at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "relu_mul_add launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_relu_mul_add_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["relu_mul_add"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return _ext.relu_mul_add(a, b, c)
