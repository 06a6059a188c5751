// Attack: launch on a private non-blocking stream and return without synchronising, so the work is
// still running when the caller's events say forward() is done.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__global__ void relu_mul_add_kernel(const float* a, const float* b, const float* c, float* out, int64_t n) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const float p = a[i] * b[i];
        out[i] = (p > 0.0f ? p : 0.0f) + c[i];
    }
}

cudaStream_t private_stream() {
    static cudaStream_t stream = nullptr;
    if (stream == nullptr) cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    return stream;
}

}  // namespace

extern "C" cudaError_t lazy_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n) {
    const int64_t blocks = (n + 255) / 256;
    relu_mul_add_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, private_stream()>>>(
        a, b, c, out, n);
    return cudaGetLastError();
}
