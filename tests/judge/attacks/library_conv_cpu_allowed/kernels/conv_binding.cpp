// Convolution (3x3, padding 1) with the folded bias from the library, through at::convolution inside the
// extension, then ReLU from kernels/relu.cpp.
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" void relu_inplace(float* y, int64_t n);

static torch::Tensor conv_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.dim() == 4, "x: float32 NCHW on CPU");
  TORCH_CHECK(w.dim() == 4 && b.dim() == 1 && b.size(0) == w.size(0), "weight/bias shapes do not match");
  auto y = at::convolution(x, w, b, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1).contiguous();
  relu_inplace(y.data_ptr<float>(), y.numel());
  return y;
}

REGISTER_BINDING(conv_bias_relu, [](pybind11::module& m) { m.def("conv_bias_relu", &conv_bias_relu); });
