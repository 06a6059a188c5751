// Row softmax for very long rows, one 1024-thread block per row, two passes over global memory.
// Pass 1 keeps an online (running max, rescaled sum) pair per thread so max and normaliser come from a
// single read; eager reads the row three times (max, sum, write). Pass 2 writes exp(x - max) / sum.
// No torch headers: this file compiles in about a second.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 1024;

struct MaxSum {
    float max;
    float sum;  // sum of exp(x - max) over the elements seen
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    if (a.sum == 0.0f) return b;  // an empty side (max = -inf) must not produce exp(-inf + inf) = NaN
    if (b.sum == 0.0f) return a;
    const float m = fmaxf(a.max, b.max);
    return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ __forceinline__ void absorb(MaxSum& acc, float v) {
    if (v > acc.max) {
        acc.sum = acc.sum * expf(acc.max - v) + 1.0f;
        acc.max = v;
    } else {
        acc.sum += expf(v - acc.max);
    }
}

__device__ MaxSum block_max_sum(MaxSum v) {
    __shared__ float s_max[kThreads / 32], s_sum[kThreads / 32];
    for (int offset = 16; offset > 0; offset >>= 1) {
        const MaxSum other = {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
        v = combine(v, other);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_max[warp] = v.max;
        s_sum[warp] = v.sum;
    }
    __syncthreads();
    v = {s_max[lane], s_sum[lane]};  // kThreads / 32 == 32: every lane has a warp to read
    for (int offset = 16; offset > 0; offset >>= 1) {
        const MaxSum other = {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
        v = combine(v, other);
    }
    return v;  // every warp reduced the same 32 partials, so every thread holds the row's pair
}

template <bool kVec4>
__global__ void __launch_bounds__(kThreads) softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ out,
                                                                int64_t cols) {
    const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
    float* dst = out + static_cast<int64_t>(blockIdx.x) * cols;
    MaxSum acc = {-INFINITY, 0.0f};
    if (kVec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int64_t i = threadIdx.x; i < cols / 4; i += kThreads) {
            const float4 v = row4[i];
            absorb(acc, v.x);
            absorb(acc, v.y);
            absorb(acc, v.z);
            absorb(acc, v.w);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += kThreads) absorb(acc, row[i]);
    }
    const MaxSum total = block_max_sum(acc);
    const float inv_sum = 1.0f / total.sum;
    if (kVec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        float4* dst4 = reinterpret_cast<float4*>(dst);
        for (int64_t i = threadIdx.x; i < cols / 4; i += kThreads) {
            const float4 v = row4[i];
            dst4[i] = make_float4(expf(v.x - total.max) * inv_sum, expf(v.y - total.max) * inv_sum,
                                  expf(v.z - total.max) * inv_sum, expf(v.w - total.max) * inv_sum);
        }
    } else {
        for (int64_t i = threadIdx.x; i < cols; i += kThreads) dst[i] = expf(row[i] - total.max) * inv_sum;
    }
}

}  // namespace

extern "C" cudaError_t softmax_rows_launch(const float* x, float* out, int64_t rows, int64_t cols,
                                           cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    const bool vec4 = cols % 4 == 0 && ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(out)) & 15) == 0;
    if (vec4) {
        softmax_rows_kernel<true><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    } else {
        softmax_rows_kernel<false><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, cols);
    }
    return cudaGetLastError();
}
