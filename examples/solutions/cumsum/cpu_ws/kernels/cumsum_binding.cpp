// Torch glue for kernels/cumsum.cpp: validates the input, allocates the output, registers `cumsum`.
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" void cumsum_rows(const float* x, float* out, int64_t rows, int64_t cols);

static torch::Tensor cumsum_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CPU tensor");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected a non-empty last dimension");
    auto out = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    cumsum_rows(x.data_ptr<float>(), out.data_ptr<float>(), x.numel() / cols, cols);
    return out;
}

REGISTER_BINDING(cumsum, [](pybind11::module& m) { m.def("cumsum", &cumsum_forward); });
