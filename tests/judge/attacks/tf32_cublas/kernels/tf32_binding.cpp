// Attack: cuBLAS GEMM with compute type CUBLAS_COMPUTE_32F_FAST_TF32 (10-bit mantissa tensor cores),
// called directly on torch's handle, so no global precision switch is touched and nothing in the source
// looks unusual: GEMM libraries are allowed from inside the extension, TF32 math is not.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "binding_registry.h"

extern "C" cudaError_t bias_relu_inplace(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream);

static torch::Tensor linear_tf32(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2, "x");
    TORCH_CHECK(w.is_cuda() && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.dim() == 2, "weight");
    TORCH_CHECK(b.is_cuda() && b.scalar_type() == torch::kFloat32 && b.numel() == w.size(0), "bias");
    const c10::cuda::CUDAGuard guard(x.device());
    const int m = static_cast<int>(x.size(0)), k = static_cast<int>(x.size(1)), n = static_cast<int>(w.size(0));
    auto out = torch::empty({m, n}, x.options());
    // Row-major out[m, n] = x[m, k] . w[n, k]^T is column-major out^T[n, m] = w . x^T.
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t status = cublasGemmEx(
        at::cuda::getCurrentCUDABlasHandle(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w.data_ptr<float>(),
        CUDA_R_32F, k, x.data_ptr<float>(), CUDA_R_32F, k, &beta, out.data_ptr<float>(), CUDA_R_32F, n,
        CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "cublasGemmEx failed: ", static_cast<int>(status));
    const cudaError_t err =
        bias_relu_inplace(out.data_ptr<float>(), b.data_ptr<float>(), m, n, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));
    return out;
}

REGISTER_BINDING(tf32, [](pybind11::module& m) { m.def("linear_tf32", &linear_tf32); });
