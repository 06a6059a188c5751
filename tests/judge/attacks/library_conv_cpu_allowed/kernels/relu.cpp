// ReLU in place over a contiguous buffer.
#include <cstdint>

extern "C" void relu_inplace(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}
