// Bias + ReLU over a row-major [m, n] product, in place: one thread per element, float4 along rows.
#include <cuda_runtime.h>
#include <cstdint>

__global__ void bias_relu_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t m, int64_t n) {
  const int64_t total = m * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = y[i] + bias[i % n];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}

extern "C" cudaError_t bias_relu(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream) {
  const int64_t total = m * n;
  if (total == 0) return cudaSuccess;
  const int threads = 256;
  const int64_t wanted = (total + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 132 * 32 ? wanted : 132 * 32);
  bias_relu_kernel<<<blocks, threads, 0, stream>>>(y, bias, m, n);
  return cudaGetLastError();
}
