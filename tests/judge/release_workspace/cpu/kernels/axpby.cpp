// out = alpha * a + b, elementwise; plain C++ (the CPU counterpart of the release's kernels/axpby.cu).
#include <cstdint>

extern "C" void axpby_launcher(float* out, const float* a, const float* b, float alpha, int size, int config) {
  (void)config;  // the release's launch-configuration switch; one loop on the CPU
  for (int i = 0; i < size; ++i) out[i] = alpha * a[i] + b[i];
}
