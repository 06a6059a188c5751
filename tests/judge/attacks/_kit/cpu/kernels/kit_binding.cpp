// Torch glue for the CPU attack kit (kernels/kit.cpp). Each function validates its tensors and calls one
// plain-C++ kernel; three deliberately reach ATen from inside the extension (at::matmul: allowed GEMM;
// torch::relu: a forbidden fallback; at::empty_like returned unwritten: the freed-memory attack).
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" {
void kit_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n);
void kit_mul(const float* a, const float* b, float* out, int64_t n);
void kit_add(const float* a, const float* b, float* out, int64_t n);
void kit_relu(const float* x, float* out, int64_t n);
void kit_sigmoid(const float* x, float* out, int64_t n);
void kit_fill(float* out, int64_t n, float value);
void kit_linear(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                int apply_relu);
void kit_bias_relu_inplace(float* y, const float* b, int64_t m, int64_t n);
void kit_linear_rounded(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                        int mode);
}

static void check(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), name,
                ": expected a contiguous float32 CPU tensor");
}

static void check_same(const torch::Tensor& a, const torch::Tensor& b) {
    TORCH_CHECK(a.sizes() == b.sizes(), "operands must have one shape");
}

static torch::Tensor relu_mul_add(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    check(a, "a");
    check(b, "b");
    check(c, "c");
    check_same(a, b);
    check_same(a, c);
    auto out = torch::empty_like(a);
    kit_relu_mul_add(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}

// Writes into `out` (which may be one of the inputs) and returns it.
static torch::Tensor relu_mul_add_into(torch::Tensor a, torch::Tensor b, torch::Tensor c, torch::Tensor out) {
    check(a, "a");
    check(b, "b");
    check(c, "c");
    check(out, "out");
    check_same(a, out);
    kit_relu_mul_add(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}

static torch::Tensor mul(torch::Tensor a, torch::Tensor b) {
    check(a, "a");
    check(b, "b");
    check_same(a, b);
    auto out = torch::empty_like(a);
    kit_mul(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}

static torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    check(a, "a");
    check(b, "b");
    check_same(a, b);
    auto out = torch::empty_like(a);
    kit_add(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
    return out;
}

static torch::Tensor relu(torch::Tensor x) {
    check(x, "x");
    auto out = torch::empty_like(x);
    kit_relu(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}

static torch::Tensor sigmoid(torch::Tensor x) {
    check(x, "x");
    auto out = torch::empty_like(x);
    kit_sigmoid(x.data_ptr<float>(), out.data_ptr<float>(), x.numel());
    return out;
}

static torch::Tensor fill_(torch::Tensor t, double value) {
    check(t, "t");
    kit_fill(t.data_ptr<float>(), t.numel(), static_cast<float>(value));
    return t;
}

static torch::Tensor full_like(torch::Tensor t, double value) {
    check(t, "t");
    auto out = torch::empty_like(t);
    kit_fill(out.data_ptr<float>(), out.numel(), static_cast<float>(value));
    return out;
}

static torch::Tensor uninitialized_like(torch::Tensor t) { return torch::empty_like(t); }

static double first_value(torch::Tensor t) {
    check(t, "t");
    TORCH_CHECK(t.numel() > 0, "t: empty");
    return t.data_ptr<float>()[0];
}

static void check_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    check(x, "x");
    check(w, "weight");
    check(b, "bias");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && b.dim() == 1 && w.size(1) == x.size(1) && b.size(0) == w.size(0),
                "x [m, k], weight [n, k], bias [n] expected");
}

static torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    check_linear(x, w, b);
    auto out = torch::empty({x.size(0), w.size(0)}, x.options());
    kit_linear(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), x.size(0),
               w.size(0), x.size(1), 1);
    return out;
}

// GEMM through ATen from inside the extension (allowed), epilogue in the kit's own kernel.
static torch::Tensor linear_at_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    check_linear(x, w, b);
    auto y = at::matmul(x, w.t()).contiguous();
    kit_bias_relu_inplace(y.data_ptr<float>(), b.data_ptr<float>(), y.size(0), y.size(1));
    return y;
}

// GEMM in the kit's own kernel, but the ReLU through torch::relu (an ATen compute op: forbidden).
static torch::Tensor linear_torch_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    check_linear(x, w, b);
    auto y = torch::empty({x.size(0), w.size(0)}, x.options());
    kit_linear(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(), x.size(0),
               w.size(0), x.size(1), 0);
    return torch::relu(y);
}

static torch::Tensor linear_rounded(torch::Tensor x, torch::Tensor w, torch::Tensor b, int mode) {
    check_linear(x, w, b);
    auto out = torch::empty({x.size(0), w.size(0)}, x.options());
    kit_linear_rounded(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), x.size(0),
                       w.size(0), x.size(1), mode);
    return out;
}

REGISTER_BINDING(kit, [](pybind11::module& m) {
    m.def("relu_mul_add", &relu_mul_add);
    m.def("relu_mul_add_into", &relu_mul_add_into);
    m.def("mul", &mul);
    m.def("add", &add);
    m.def("relu", &relu);
    m.def("sigmoid", &sigmoid);
    m.def("fill_", &fill_);
    m.def("full_like", &full_like);
    m.def("uninitialized_like", &uninitialized_like);
    m.def("first_value", &first_value);
    m.def("linear_bias_relu", &linear_bias_relu);
    m.def("linear_at_matmul", &linear_at_matmul);
    m.def("linear_torch_relu", &linear_torch_relu);
    m.def("linear_half", [](torch::Tensor x, torch::Tensor w, torch::Tensor b) { return linear_rounded(x, w, b, 1); });
    m.def("linear_tf32", [](torch::Tensor x, torch::Tensor w, torch::Tensor b) { return linear_rounded(x, w, b, 2); });
});
