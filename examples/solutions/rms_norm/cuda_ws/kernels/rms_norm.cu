// RMS norm over the last dimension, one 256-thread block per row. Rows of up to 8192 floats (divisible
// by 4) are held in registers as float4s, so each element is read once and written once; eager needs
// separate kernels for x*x, the mean, rsqrt, and two multiplies. Other shapes use a two-pass kernel.
// No torch headers: this file compiles in about a second.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ float block_allreduce_sum(float v) {
    __shared__ float partial[kThreads / 32];
    v = warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < kThreads / 32 ? partial[lane] : 0.0f;
    return warp_sum(v);
}

template <int kVecPerThread>
__global__ void __launch_bounds__(kThreads)
rms_norm_registers_kernel(const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ out,
                          int cols, float eps) {
    const float4* row = reinterpret_cast<const float4*>(x + static_cast<int64_t>(blockIdx.x) * cols);
    float4* dst = reinterpret_cast<float4*>(out + static_cast<int64_t>(blockIdx.x) * cols);
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    const int vecs = cols / 4;
    float4 v[kVecPerThread];
    float squares = 0.0f;
#pragma unroll
    for (int j = 0; j < kVecPerThread; ++j) {
        const int i = threadIdx.x + j * kThreads;
        v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < vecs) v[j] = row[i];
        squares += (v[j].x * v[j].x + v[j].y * v[j].y) + (v[j].z * v[j].z + v[j].w * v[j].w);
    }
    const float inv_rms = 1.0f / sqrtf(block_allreduce_sum(squares) / static_cast<float>(cols) + eps);
#pragma unroll
    for (int j = 0; j < kVecPerThread; ++j) {
        const int i = threadIdx.x + j * kThreads;
        if (i < vecs) {
            const float4 w = w4[i];
            dst[i] = make_float4(v[j].x * inv_rms * w.x, v[j].y * inv_rms * w.y, v[j].z * inv_rms * w.z,
                                 v[j].w * inv_rms * w.w);
        }
    }
}

__global__ void __launch_bounds__(kThreads)
rms_norm_generic_kernel(const float* __restrict__ x, const float* __restrict__ weight, float* __restrict__ out,
                        int64_t cols, float eps) {
    const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
    float* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
    float squares = 0.0f;
    for (int64_t i = threadIdx.x; i < cols; i += kThreads) squares += row[i] * row[i];
    const float inv_rms = 1.0f / sqrtf(block_allreduce_sum(squares) / static_cast<float>(cols) + eps);
    for (int64_t i = threadIdx.x; i < cols; i += kThreads) dst[i] = row[i] * inv_rms * weight[i];
}

}  // namespace

extern "C" cudaError_t rms_norm_launch(const float* x, const float* weight, float* out, int64_t rows, int64_t cols,
                                       float eps, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    const uintptr_t addresses =
        reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(weight) | reinterpret_cast<uintptr_t>(out);
    const unsigned grid = static_cast<unsigned>(rows);
    const int vec_per_thread = static_cast<int>((cols / 4 + kThreads - 1) / kThreads);
    if (cols % 4 == 0 && (addresses & 15) == 0 && cols <= 8 * 4 * kThreads) {
        const int c = static_cast<int>(cols);
        if (vec_per_thread <= 1) {
            rms_norm_registers_kernel<1><<<grid, kThreads, 0, stream>>>(x, weight, out, c, eps);
        } else if (vec_per_thread <= 2) {
            rms_norm_registers_kernel<2><<<grid, kThreads, 0, stream>>>(x, weight, out, c, eps);
        } else if (vec_per_thread <= 4) {
            rms_norm_registers_kernel<4><<<grid, kThreads, 0, stream>>>(x, weight, out, c, eps);
        } else {
            rms_norm_registers_kernel<8><<<grid, kThreads, 0, stream>>>(x, weight, out, c, eps);
        }
    } else {
        rms_norm_generic_kernel<<<grid, kThreads, 0, stream>>>(x, weight, out, cols, eps);
    }
    return cudaGetLastError();
}
