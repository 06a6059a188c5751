// Torch glue for kernels/layernorm.cu: checks tensors, allocates the output, launches on the current stream.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "binding_registry.h"

extern "C" cudaError_t layernorm_launch(const float* x, const float* weight, const float* bias, float* out,
                                        int64_t rows, int64_t cols, float eps, cudaStream_t stream);

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
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
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    const cudaError_t err = layernorm_launch(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                             out.data_ptr<float>(), x.numel() / cols, cols, static_cast<float>(eps),
                                             at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "layernorm launch failed: ", cudaGetErrorString(err));
    return out;
}

REGISTER_BINDING(layernorm, [](pybind11::module& m) { m.def("layernorm", &layernorm_forward); });
