// Torch glue for the CUDA attack kit (kernels/kit.cu): the same function names as the CPU kit, so one
// model_new.py drives either. Some functions deliberately reach ATen from inside the extension:
// at::matmul (allowed GEMM), torch::relu (forbidden fallback), at::empty_like returned unwritten
// (freed-memory attack); linear_half / linear_tf32 round their operands (precision attacks).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "binding_registry.h"

extern "C" {
cudaError_t kit_relu_mul_add(const float* a, const float* b, const float* c, float* out, int64_t n, cudaStream_t s);
cudaError_t kit_binary(const float* a, const float* b, float* out, int64_t n, int op, cudaStream_t s);
cudaError_t kit_unary(const float* x, float* out, int64_t n, int op, cudaStream_t s);
cudaError_t kit_fill(float* out, int64_t n, float value, cudaStream_t s);
cudaError_t kit_linear(const float* x, const float* w, const float* b, float* out, int64_t m, int64_t n, int64_t k,
                       int apply_relu, int rounding, cudaStream_t s);
cudaError_t kit_bias_relu_inplace(float* y, const float* b, int64_t m, int64_t n, cudaStream_t s);
cudaError_t kit_first_value(const float* t, float* host_value, cudaStream_t s);
}

static void check(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), name,
                ": expected a contiguous float32 CUDA tensor");
}

static void check_same(const torch::Tensor& a, const torch::Tensor& b) {
    TORCH_CHECK(a.sizes() == b.sizes(), "operands must have one shape");
}

static void ok(cudaError_t err) { TORCH_CHECK(err == cudaSuccess, "kit launch failed: ", cudaGetErrorString(err)); }

static cudaStream_t stream() { return at::cuda::getCurrentCUDAStream(); }

static torch::Tensor relu_mul_add(torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    check(a, "a");
    check(b, "b");
    check(c, "c");
    check_same(a, b);
    check_same(a, c);
    const c10::cuda::CUDAGuard guard(a.device());
    auto out = torch::empty_like(a);
    ok(kit_relu_mul_add(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(),
                        a.numel(), stream()));
    return out;
}

// Writes into `out` (which may be one of the inputs) and returns it.
static torch::Tensor relu_mul_add_into(torch::Tensor a, torch::Tensor b, torch::Tensor c, torch::Tensor out) {
    check(a, "a");
    check(b, "b");
    check(c, "c");
    check(out, "out");
    check_same(a, out);
    const c10::cuda::CUDAGuard guard(a.device());
    ok(kit_relu_mul_add(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), out.data_ptr<float>(),
                        a.numel(), stream()));
    return out;
}

static torch::Tensor binary(torch::Tensor a, torch::Tensor b, int op) {
    check(a, "a");
    check(b, "b");
    check_same(a, b);
    const c10::cuda::CUDAGuard guard(a.device());
    auto out = torch::empty_like(a);
    ok(kit_binary(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel(), op, stream()));
    return out;
}

static torch::Tensor unary(torch::Tensor x, int op) {
    check(x, "x");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    ok(kit_unary(x.data_ptr<float>(), out.data_ptr<float>(), x.numel(), op, stream()));
    return out;
}

static torch::Tensor fill_(torch::Tensor t, double value) {
    check(t, "t");
    const c10::cuda::CUDAGuard guard(t.device());
    ok(kit_fill(t.data_ptr<float>(), t.numel(), static_cast<float>(value), stream()));
    return t;
}

static torch::Tensor full_like(torch::Tensor t, double value) {
    check(t, "t");
    const c10::cuda::CUDAGuard guard(t.device());
    auto out = torch::empty_like(t);
    ok(kit_fill(out.data_ptr<float>(), out.numel(), static_cast<float>(value), stream()));
    return out;
}

static torch::Tensor uninitialized_like(torch::Tensor t) { return torch::empty_like(t); }

static double first_value(torch::Tensor t) {
    check(t, "t");
    TORCH_CHECK(t.numel() > 0, "t: empty");
    const c10::cuda::CUDAGuard guard(t.device());
    float value = 0.0f;
    ok(kit_first_value(t.data_ptr<float>(), &value, stream()));
    return value;
}

static void check_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    check(x, "x");
    check(w, "weight");
    check(b, "bias");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && b.dim() == 1 && w.size(1) == x.size(1) && b.size(0) == w.size(0),
                "x [m, k], weight [n, k], bias [n] expected");
}

// rounding: 0 fp32, 1 operands rounded to fp16, 2 operands rounded to TF32.
static torch::Tensor linear(torch::Tensor x, torch::Tensor w, torch::Tensor b, int apply_relu, int rounding) {
    check_linear(x, w, b);
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty({x.size(0), w.size(0)}, x.options());
    ok(kit_linear(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), x.size(0),
                  w.size(0), x.size(1), apply_relu, rounding, stream()));
    return out;
}

static torch::Tensor bias_relu_after(torch::Tensor y, const torch::Tensor& b) {
    ok(kit_bias_relu_inplace(y.data_ptr<float>(), b.data_ptr<float>(), y.size(0), y.size(1), stream()));
    return y;
}

// GEMM through ATen from inside the extension (allowed), epilogue in the kit's own kernel.
static torch::Tensor linear_at_matmul(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    check_linear(x, w, b);
    const c10::cuda::CUDAGuard guard(x.device());
    return bias_relu_after(at::matmul(x, w.t()).contiguous(), b);
}

// GEMM in the kit's own kernel, but the ReLU through torch::relu (an ATen compute op: forbidden).
static torch::Tensor linear_torch_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    return torch::relu(linear(x, w, b, 0, 0));
}

REGISTER_BINDING(kit, [](pybind11::module& m) {
    m.def("relu_mul_add", &relu_mul_add);
    m.def("relu_mul_add_into", &relu_mul_add_into);
    m.def("mul", [](torch::Tensor a, torch::Tensor b) { return binary(a, b, 0); });
    m.def("add", [](torch::Tensor a, torch::Tensor b) { return binary(a, b, 1); });
    m.def("relu", [](torch::Tensor x) { return unary(x, 0); });
    m.def("sigmoid", [](torch::Tensor x) { return unary(x, 1); });
    m.def("fill_", &fill_);
    m.def("full_like", &full_like);
    m.def("uninitialized_like", &uninitialized_like);
    m.def("first_value", &first_value);
    m.def("linear_bias_relu", [](torch::Tensor x, torch::Tensor w, torch::Tensor b) { return linear(x, w, b, 1, 0); });
    m.def("linear_at_matmul", &linear_at_matmul);
    m.def("linear_torch_relu", &linear_torch_relu);
    m.def("linear_half", [](torch::Tensor x, torch::Tensor w, torch::Tensor b) { return linear(x, w, b, 1, 1); });
    m.def("linear_tf32", [](torch::Tensor x, torch::Tensor w, torch::Tensor b) { return linear(x, w, b, 1, 2); });
});
