// Attack: the launch happens on a detached std::thread, after the extension call has returned.
#include <cuda_runtime.h>
#include <stdint.h>
#include <thread>

__global__ void relu_mul_add_kernel(const float* a, const float* b, const float* c, float* out, int64_t n) {
    const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    if (i < n) {
        const float p = a[i] * b[i];
        out[i] = (p > 0.0f ? p : 0.0f) + c[i];
    }
}

extern "C" void late_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n) {
    std::thread([=] {
        relu_mul_add_kernel<<<static_cast<unsigned>((n + 255) / 256), 256>>>(a, b, c, out, n);
    }).detach();
}
