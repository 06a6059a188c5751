// Torch glue for kernels/rms_norm.cu: checks tensors, allocates the output, launches on the current stream.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "binding_registry.h"

extern "C" cudaError_t rms_norm_launch(const float* x, const float* weight, float* out, int64_t rows, int64_t cols,
                                       float eps, cudaStream_t stream);

static torch::Tensor rms_norm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CUDA tensor");
    TORCH_CHECK(weight.is_cuda() && weight.scalar_type() == torch::kFloat32 && weight.is_contiguous(),
                "weight: expected a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected a non-empty last dimension");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.numel() == cols, "weight: expected ", cols, " elements");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    const cudaError_t err = rms_norm_launch(x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(),
                                            x.numel() / cols, cols, static_cast<float>(eps),
                                            at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "rms_norm launch failed: ", cudaGetErrorString(err));
    return out;
}

REGISTER_BINDING(rms_norm, [](pybind11::module& m) { m.def("rms_norm", &rms_norm_forward); });
