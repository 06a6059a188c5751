// y = relu(a * x) + y, elementwise: an axpby with a rectified product, in one pass over the three inputs.
#include <cstdint>

extern "C" void axpby_relu(const float* a, const float* x, const float* y, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float p = a[i] * x[i];
    out[i] = (p > 0.0f ? p : 0.0f) + y[i];
  }
}
