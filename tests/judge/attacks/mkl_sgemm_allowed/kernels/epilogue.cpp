// Bias + ReLU over a row-major [m, n] product, in place.
#include <cstdint>

extern "C" void bias_relu_rows(float* y, const float* bias, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = y + i * n;
    for (int64_t j = 0; j < n; ++j) {
      const float v = row[j] + bias[j];
      row[j] = v > 0.0f ? v : 0.0f;
    }
  }
}
