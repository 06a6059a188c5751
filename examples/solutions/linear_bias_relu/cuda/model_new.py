"""CUDA solution: relu(x @ W^T + b) as one tiled SGEMM (128x128 tiles, 8x8 per thread, double-buffered
shared memory) with the bias and ReLU applied in the epilogue, so the product never round-trips through
memory. Strict fp32 throughout (no TF32), like the baseline under the strict-fp32 policy.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

// C[M, N] = epilogue(A[M, K] . B[N, K]^T): A holds activations, B an nn.Linear weight; both are K-contiguous.
// 128x128 block tile, 8-deep K slices double-buffered through shared memory (one barrier per slice), each of
// the 256 threads accumulating an 8x8 register tile. Shared rows are padded by 4 floats so the transposed
// tile stores do not collide on banks while float4 reads stay aligned.
constexpr int kBM = 128, kBN = 128, kBK = 8, kThreads = 256, kPad = 4;

enum Epilogue : int { kBiasRelu = 0, kBiasResidual = 1 };

template <bool kVec>
__device__ __forceinline__ void load_slice(const float* __restrict__ src, int64_t rows, int64_t K, int64_t row0,
                                           int64_t k0, float (&reg)[4]) {
    const int64_t row = row0 + (threadIdx.x >> 1);
    const int64_t k = k0 + (threadIdx.x & 1) * 4;
    if constexpr (kVec) {
        if (row < rows && k < K) {
            const float4 v = *reinterpret_cast<const float4*>(src + row * K + k);
            reg[0] = v.x; reg[1] = v.y; reg[2] = v.z; reg[3] = v.w;
        } else {
            reg[0] = reg[1] = reg[2] = reg[3] = 0.0f;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) reg[i] = (row < rows && k + i < K) ? src[row * K + k + i] : 0.0f;
    }
}

__device__ __forceinline__ void store_slice(float (*tile)[kBM + kPad], const float (&reg)[4]) {
    const int r = threadIdx.x >> 1;
    const int kk = (threadIdx.x & 1) * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) tile[kk + i][r] = reg[i];
}

template <int kEpilogue, bool kVec>
__global__ void __launch_bounds__(kThreads, 2)
gemm_nt_kernel(const float* __restrict__ A, const float* __restrict__ B, const float* __restrict__ bias,
               const float* __restrict__ residual, float* __restrict__ C, int64_t M, int64_t N, int64_t K) {
    __shared__ __align__(16) float As[2][kBK][kBM + kPad];
    __shared__ __align__(16) float Bs[2][kBK][kBN + kPad];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;

    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    float ra[4], rb[4];
    load_slice<kVec>(A, M, K, m0, 0, ra);
    load_slice<kVec>(B, N, K, n0, 0, rb);
    store_slice(As[0], ra);
    store_slice(Bs[0], rb);
    __syncthreads();

    const int64_t slices = (K + kBK - 1) / kBK;
    for (int64_t s = 0; s < slices; ++s) {
        const int cur = static_cast<int>(s & 1);
        if (s + 1 < slices) {  // prefetch the next slice into registers while this one is multiplied
            load_slice<kVec>(A, M, K, m0, (s + 1) * kBK, ra);
            load_slice<kVec>(B, N, K, n0, (s + 1) * kBK, rb);
        }
#pragma unroll
        for (int k = 0; k < kBK; ++k) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][k][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][k][64 + ty * 4]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][k][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][k][64 + tx * 4]);
            const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (s + 1 < slices) {
            store_slice(As[cur ^ 1], ra);
            store_slice(Bs[cur ^ 1], rb);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int64_t m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + (i - 4));
        if (m >= M) continue;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int64_t n = n0 + half * 64 + tx * 4;
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int64_t col = n + j;
                float x = acc[i][half * 4 + j];
                if (col < N) {
                    x += bias[col];
                    if constexpr (kEpilogue == kBiasRelu) x = x > 0.0f ? x : 0.0f;
                    if constexpr (kEpilogue == kBiasResidual) x += residual[m * N + col];
                }
                v[j] = x;
            }
            if (kVec && n + 3 < N) {
                *reinterpret_cast<float4*>(C + m * N + n) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (n + j < N) C[m * N + n + j] = v[j];
            }
        }
    }
}

template <int kEpilogue>
static cudaError_t gemm_nt_launch(const float* A, const float* B, const float* bias, const float* residual, float* C,
                                  int64_t M, int64_t N, int64_t K, cudaStream_t stream) {
    if (M == 0 || N == 0) return cudaSuccess;
    const uintptr_t addresses = reinterpret_cast<uintptr_t>(A) | reinterpret_cast<uintptr_t>(B) |
                                reinterpret_cast<uintptr_t>(bias) | reinterpret_cast<uintptr_t>(residual) |
                                reinterpret_cast<uintptr_t>(C);
    const bool vec = K % 4 == 0 && N % 4 == 0 && (addresses & 15) == 0;
    const dim3 grid(static_cast<unsigned>((N + kBN - 1) / kBN), static_cast<unsigned>((M + kBM - 1) / kBM));
    if (vec) {
        gemm_nt_kernel<kEpilogue, true><<<grid, kThreads, 0, stream>>>(A, B, bias, residual, C, M, N, K);
    } else {
        gemm_nt_kernel<kEpilogue, false><<<grid, kThreads, 0, stream>>>(A, B, bias, residual, C, M, N, K);
    }
    return cudaGetLastError();
}

cudaError_t linear_bias_relu_launch(const float* x, const float* weight, const float* bias, float* out, int64_t m,
                                    int64_t n, int64_t k, cudaStream_t stream) {
    return gemm_nt_launch<kBiasRelu>(x, weight, bias, nullptr, out, m, n, k, stream);
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t linear_bias_relu_launch(const float* x, const float* weight, const float* bias, float* out, int64_t m,
                                    int64_t n, int64_t k, cudaStream_t stream);

static void check_input(const torch::Tensor& t, const char* name, int64_t dims) {
    TORCH_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, ": expected float32");
    TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
    TORCH_CHECK(t.dim() == dims, name, ": expected ", dims, " dimensions");
}

torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    check_input(x, "x", 2);
    check_input(weight, "weight", 2);
    check_input(bias, "bias", 1);
    const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
    TORCH_CHECK(weight.size(1) == k && bias.size(0) == n, "x, weight and bias shapes do not match");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty({m, n}, x.options());
    const cudaError_t err = linear_bias_relu_launch(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                                    out.data_ptr<float>(), m, n, k, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "linear_bias_relu launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_linear_bias_relu_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["linear_bias_relu"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        # Same module as the task's Model so seeded init / state dict line up; only its tensors are used.
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.linear_bias_relu(x, self.linear.weight, self.linear.bias)
