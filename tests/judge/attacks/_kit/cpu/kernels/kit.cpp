// Attack kit, CPU: small honest kernels in plain C++ that the attack candidates combine with one cheat
// each, so that the judge's other checks pass and only the check under test can stop the candidate.
// Every runtime attack shares this exact file, so the judge builds it once and serves the rest from its
// content-addressed cache.
#include <cmath>
#include <cstdint>
#include <cstring>

extern "C" {

void kit_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float p = a[i] * b[i];
        out[i] = (p > 0.0f ? p : 0.0f) + c[i];
    }
}

void kit_mul(const float* a, const float* b, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

void kit_add(const float* a, const float* b, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void kit_relu(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void kit_sigmoid(const float* x, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(x[i]))));
}

void kit_fill(float* out, int64_t n, float value) {
    for (int64_t i = 0; i < n; ++i) out[i] = value;
}

// out[m, n] = x[m, k] . w[n, k]^T + b[n], optionally followed by ReLU; fp32 math with double accumulation.
void kit_linear(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                int apply_relu) {
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            double acc = b[j];
            for (int64_t t = 0; t < k; ++t) acc += static_cast<double>(x[i * k + t]) * w[j * k + t];
            const float v = static_cast<float>(acc);
            out[i * n + j] = apply_relu && v < 0.0f ? 0.0f : v;
        }
    }
}

// y[m, n] = relu(y[m, n] + b[n]) in place: the epilogue after a GEMM done elsewhere.
void kit_bias_relu_inplace(float* y, const float* b, int64_t m, int64_t n) {
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            const float v = y[i * n + j] + b[j];
            y[i * n + j] = v > 0.0f ? v : 0.0f;
        }
    }
}

// Round-to-nearest-even to bfloat16 and back: 8 significant bits instead of fp32's 24.
static float to_bf16_and_back(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits += 0x7FFFu + ((bits >> 16) & 1u);
    bits &= 0xFFFF0000u;
    float r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}

// Round-to-nearest-even to TF32 and back: 11 significant bits instead of fp32's 24 (what a TF32 tensor
// core sees of each operand).
static float to_tf32_and_back(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bits += 0xFFFu + ((bits >> 13) & 1u);
    bits &= 0xFFFFE000u;
    float r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}

// The same layer with both operands rounded first (products summed in fp32, as tensor cores do).
// bf16 (mode 1): close to a 1e-2 tolerance and sometimes over it. TF32 (mode 2): well inside it, yet
// hundreds of times less accurate than the fp32 eager baseline: only a precision audit can tell.
void kit_linear_rounded(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                        int mode) {
    float (*rounder)(float) = mode == 1 ? to_bf16_and_back : to_tf32_and_back;
    for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
            float acc = b[j];
            for (int64_t t = 0; t < k; ++t) acc += rounder(x[i * k + t]) * rounder(w[j * k + t]);
            out[i * n + j] = acc > 0.0f ? acc : 0.0f;
        }
    }
}

}  // extern "C"
