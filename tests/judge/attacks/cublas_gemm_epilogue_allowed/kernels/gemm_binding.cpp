// relu(x @ W^T + b): cublasSgemm on a handle of our own (default math: no TF32), bound to torch's current
// stream on every call, then the bias + ReLU kernel of kernels/epilogue.cu on the same stream.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublas_v2.h>

#include "binding_registry.h"

extern "C" cudaError_t bias_relu(float* y, const float* bias, int64_t m, int64_t n, cudaStream_t stream);

static cublasHandle_t handle() {
  static cublasHandle_t h = [] {
    cublasHandle_t created;
    TORCH_CHECK(cublasCreate(&created) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
    TORCH_CHECK(cublasSetMathMode(created, CUBLAS_PEDANTIC_MATH) == CUBLAS_STATUS_SUCCESS, "math mode");
    return created;
  }();
  return h;
}

static torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2, "x");
  TORCH_CHECK(w.is_cuda() && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.dim() == 2, "weight");
  TORCH_CHECK(b.is_cuda() && b.scalar_type() == torch::kFloat32 && b.numel() == w.size(0), "bias");
  const c10::cuda::CUDAGuard guard(x.device());
  const int m = static_cast<int>(x.size(0)), k = static_cast<int>(x.size(1)), n = static_cast<int>(w.size(0));
  TORCH_CHECK(w.size(1) == k, "x and weight shapes do not match");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  TORCH_CHECK(cublasSetStream(handle(), stream) == CUBLAS_STATUS_SUCCESS, "cublasSetStream failed");
  auto out = torch::empty({m, n}, x.options());
  // Row-major out[m, n] = x[m, k] . W[n, k]^T is column-major out^T[n, m] = W^T . x.
  const float alpha = 1.0f, beta = 0.0f;
  TORCH_CHECK(cublasSgemm(handle(), CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, w.data_ptr<float>(), k,
                          x.data_ptr<float>(), k, &beta, out.data_ptr<float>(), n) == CUBLAS_STATUS_SUCCESS,
              "cublasSgemm failed");
  const cudaError_t err = bias_relu(out.data_ptr<float>(), b.data_ptr<float>(), m, n, stream);
  TORCH_CHECK(err == cudaSuccess, "bias_relu launch failed: ", cudaGetErrorString(err));
  return out;
}

REGISTER_BINDING(linear_bias_relu, linear_bias_relu);
