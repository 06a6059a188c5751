// Inclusive scan along the last dimension, plain C++. The running sum is kept in double: eager's CPU
// cumsum accumulates in double too, and a float running sum drifts by ~sqrt(n) ulps over long rows.
#include <cstdint>

extern "C" void cumsum_rows(const float* x, float* out, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * cols;
        float* dst = out + r * cols;
        double running = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
            running += row[c];
            dst[c] = static_cast<float>(running);
        }
    }
}
