// Torch glue for kernels/layernorm.cpp: validates tensors, allocates the output, registers `layernorm`.
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" void layernorm_rows(const float* x, const float* weight, const float* bias, float* out, int64_t rows,
                               int64_t cols, double eps);

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu(), name, ": expected a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, ": expected float32");
    TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
}

static torch::Tensor layernorm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    check_input(x, "x");
    check_input(weight, "weight");
    check_input(bias, "bias");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected a non-empty last dimension");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.numel() == cols && bias.numel() == cols, "weight/bias: expected ", cols, " elements");
    auto out = torch::empty_like(x);
    layernorm_rows(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(),
                   x.numel() / cols, cols, eps);
    return out;
}

REGISTER_BINDING(layernorm, [](pybind11::module& m) { m.def("layernorm", &layernorm_forward); });
