// Attack: the extension returns at once and a detached std::thread fills the output later.
#include <cstdint>
#include <thread>

extern "C" void late_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n) {
    std::thread([=] {
        for (int64_t i = 0; i < n; ++i) {
            const float p = a[i] * b[i];
            out[i] = (p > 0.0f ? p : 0.0f) + c[i];
        }
    }).detach();
}
