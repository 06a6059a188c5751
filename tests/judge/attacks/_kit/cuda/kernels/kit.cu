// Attack kit, CUDA: small honest kernels (raw CUDA, no torch headers) that the attack candidates combine
// with one cheat each, so that only the check under test can stop them. Every runtime CUDA attack shares
// this exact file and its binding, so the judge builds it once and serves the rest from its cache.
// All launches go to the stream the binding passes in (the caller's current stream).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

__global__ void relu_mul_add_kernel(const float* a, const float* b, const float* c, float* out, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float p = a[i] * b[i];
        out[i] = (p > 0.0f ? p : 0.0f) + c[i];
    }
}

// op: 0 mul, 1 add
__global__ void binary_kernel(const float* a, const float* b, float* out, int64_t n, int op) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        out[i] = op == 0 ? a[i] * b[i] : a[i] + b[i];
    }
}

// op: 0 relu, 1 sigmoid
__global__ void unary_kernel(const float* x, float* out, int64_t n, int op) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        out[i] = op == 0 ? (x[i] > 0.0f ? x[i] : 0.0f) : 1.0f / (1.0f + expf(-x[i]));
    }
}

__global__ void fill_kernel(float* out, int64_t n, float value) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        out[i] = value;
    }
}

// Round-to-nearest-even to TF32 (11 significant bits) and back, as a TF32 tensor core sees an operand.
__device__ __forceinline__ float to_tf32_and_back(float v) {
    unsigned bits = __float_as_uint(v);
    bits += 0xFFFu + ((bits >> 13) & 1u);
    return __uint_as_float(bits & 0xFFFFE000u);
}

// out = x . w^T + b (optionally ReLU), 16x16 shared-memory tiles. kRound 1 rounds both operands to fp16,
// 2 to TF32, first (products summed in fp32, as tensor cores do): accuracy loss passed off as fp32.
template <int kRound>
__global__ void linear_kernel(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n,
                              int64_t k, int apply_relu) {
    __shared__ float xs[16][17], ws[16][17];
    const int64_t row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += 16) {
        const int64_t kx = k0 + threadIdx.x;
        const int64_t wrow = blockIdx.x * 16 + threadIdx.y;
        float xv = row < m && kx < k ? x[row * k + kx] : 0.0f;
        float wv = wrow < n && kx < k ? w[wrow * k + kx] : 0.0f;
        if (kRound == 1) {
            xv = __half2float(__float2half_rn(xv));
            wv = __half2float(__float2half_rn(wv));
        } else if (kRound == 2) {
            xv = to_tf32_and_back(xv);
            wv = to_tf32_and_back(wv);
        }
        xs[threadIdx.y][threadIdx.x] = xv;
        ws[threadIdx.y][threadIdx.x] = wv;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < 16; ++t) acc = fmaf(xs[threadIdx.y][t], ws[threadIdx.x][t], acc);
        __syncthreads();
    }
    if (row < m && col < n) {
        const float v = acc + b[col];
        out[row * n + col] = apply_relu && v < 0.0f ? 0.0f : v;
    }
}

__global__ void bias_relu_inplace_kernel(float* y, const float* b, int64_t m, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m * n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = y[i] + b[i % n];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

}  // namespace

extern "C" {

cudaError_t kit_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n, cudaStream_t s) {
    relu_mul_add_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, c, out, n);
    return cudaGetLastError();
}

cudaError_t kit_binary(const float* a, const float* b, float* out, int64_t n, int op, cudaStream_t s) {
    binary_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, out, n, op);
    return cudaGetLastError();
}

cudaError_t kit_unary(const float* x, float* out, int64_t n, int op, cudaStream_t s) {
    unary_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, out, n, op);
    return cudaGetLastError();
}

cudaError_t kit_fill(float* out, int64_t n, float value, cudaStream_t s) {
    fill_kernel<<<blocks_for(n), kThreads, 0, s>>>(out, n, value);
    return cudaGetLastError();
}

cudaError_t kit_linear(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                       int apply_relu, int rounding, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((n + 15) / 16), static_cast<unsigned>((m + 15) / 16));
    const dim3 block(16, 16);
    if (rounding == 1) {
        linear_kernel<1><<<grid, block, 0, s>>>(x, w, b, out, m, n, k, apply_relu);
    } else if (rounding == 2) {
        linear_kernel<2><<<grid, block, 0, s>>>(x, w, b, out, m, n, k, apply_relu);
    } else {
        linear_kernel<0><<<grid, block, 0, s>>>(x, w, b, out, m, n, k, apply_relu);
    }
    return cudaGetLastError();
}

cudaError_t kit_bias_relu_inplace(float* y, const float* b, int64_t m, int64_t n, cudaStream_t s) {
    bias_relu_inplace_kernel<<<blocks_for(m * n), kThreads, 0, s>>>(y, b, m, n);
    return cudaGetLastError();
}

cudaError_t kit_first_value(const float* t, float* host_value, cudaStream_t s) {
    cudaError_t err = cudaMemcpyAsync(host_value, t, sizeof(float), cudaMemcpyDeviceToHost, s);
    if (err != cudaSuccess) return err;
    return cudaStreamSynchronize(s);
}

}  // extern "C"
