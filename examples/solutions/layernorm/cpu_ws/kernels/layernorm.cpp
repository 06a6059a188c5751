// LayerNorm over the last dimension, plain C++ (no torch headers, so it compiles in well under a second).
// Two passes per row with double accumulators: the task's inputs have a large mean, which would make a
// one-pass E[x^2] - E[x]^2 variance lose most of its precision.
#include <cmath>
#include <cstdint>

extern "C" void layernorm_rows(const float* x, const float* weight, const float* bias, float* out, int64_t rows,
                               int64_t cols, double eps) {
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = x + r * cols;
        float* dst = out + r * cols;
        double sum = 0.0;
        for (int64_t c = 0; c < cols; ++c) sum += row[c];
        const double mean = sum / static_cast<double>(cols);
        double squares = 0.0;
        for (int64_t c = 0; c < cols; ++c) {
            const double d = row[c] - mean;
            squares += d * d;
        }
        const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
        for (int64_t c = 0; c < cols; ++c) {
            dst[c] = static_cast<float>((row[c] - mean) * rstd * weight[c] + bias[c]);
        }
    }
}
