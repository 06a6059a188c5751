// Torch glue for kernels/softmax.cu: checks the tensor, allocates the output, launches on the current stream.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "binding_registry.h"

extern "C" cudaError_t softmax_rows_launch(const float* x, float* out, int64_t rows, int64_t cols,
                                           cudaStream_t stream);

static torch::Tensor softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CUDA tensor");
    TORCH_CHECK(x.dim() >= 1, "x: expected at least one dimension");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty_like(x);
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const cudaError_t err = softmax_rows_launch(x.data_ptr<float>(), out.data_ptr<float>(), rows, cols,
                                                at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "softmax launch failed: ", cudaGetErrorString(err));
    return out;
}

REGISTER_BINDING(softmax, [](pybind11::module& m) { m.def("softmax", &softmax_forward); });
