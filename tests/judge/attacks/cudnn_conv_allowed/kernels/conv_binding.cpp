// Convolution (3x3, padding 1) + folded bias + ReLU as one cudnnConvolutionBiasActivationForward call.
// FMA math keeps it strict FP32 (no TF32 tensor cores); the handle is bound to torch's current stream.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cudnn.h>

#include "binding_registry.h"

#define DNN_CHECK(call)                                                             \
  do {                                                                              \
    const cudnnStatus_t status_ = (call);                                           \
    TORCH_CHECK(status_ == CUDNN_STATUS_SUCCESS, #call ": ", cudnnGetErrorString(status_)); \
  } while (0)

namespace {

struct Descriptors {
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  cudnnActivationDescriptor_t relu;
  Descriptors() {
    DNN_CHECK(cudnnCreateTensorDescriptor(&x));
    DNN_CHECK(cudnnCreateTensorDescriptor(&y));
    DNN_CHECK(cudnnCreateTensorDescriptor(&bias));
    DNN_CHECK(cudnnCreateFilterDescriptor(&w));
    DNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    DNN_CHECK(cudnnCreateActivationDescriptor(&relu));
    DNN_CHECK(cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN_CHECK(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
    DNN_CHECK(cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  }
};

cudnnHandle_t handle() {
  static cudnnHandle_t h = [] {
    cudnnHandle_t created;
    DNN_CHECK(cudnnCreate(&created));
    return created;
  }();
  return h;
}

Descriptors& descriptors() {
  static Descriptors d;
  return d;
}

}  // namespace

static torch::Tensor conv_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 4, "x: NCHW");
  TORCH_CHECK(w.is_cuda() && w.is_contiguous() && w.dim() == 4 && w.size(2) == 3 && w.size(3) == 3, "weight");
  TORCH_CHECK(b.is_cuda() && b.is_contiguous() && b.numel() == w.size(0), "bias");
  const c10::cuda::CUDAGuard guard(x.device());
  const int n = static_cast<int>(x.size(0)), c = static_cast<int>(x.size(1));
  const int h = static_cast<int>(x.size(2)), wd = static_cast<int>(x.size(3)), k = static_cast<int>(w.size(0));
  TORCH_CHECK(w.size(1) == c, "weight does not match the input channels");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  DNN_CHECK(cudnnSetStream(handle(), stream));
  Descriptors& d = descriptors();
  DNN_CHECK(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, wd));
  DNN_CHECK(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, h, wd));
  DNN_CHECK(cudnnSetTensor4dDescriptor(d.bias, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, k, 1, 1));
  DNN_CHECK(cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, 3, 3));
  // ReLU in this call requires the implicit precomputed GEMM algorithm.
  const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
  size_t workspace_bytes = 0;
  DNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle(), d.x, d.w, d.conv, d.y, algo, &workspace_bytes));
  auto workspace = torch::empty({static_cast<int64_t>(workspace_bytes) + 1}, x.options().dtype(torch::kUInt8));
  auto y = torch::empty({n, k, h, wd}, x.options());
  // z (the residual input) is y with alpha2 = 0; zero it first so no stale value can leak through.
  TORCH_CHECK(cudaMemsetAsync(y.data_ptr(), 0, y.nbytes(), stream) == cudaSuccess, "memset failed");
  const float alpha1 = 1.0f, alpha2 = 0.0f;
  DNN_CHECK(cudnnConvolutionBiasActivationForward(handle(), &alpha1, d.x, x.data_ptr<float>(), d.w,
                                                  w.data_ptr<float>(), d.conv, algo, workspace.data_ptr(),
                                                  workspace_bytes, &alpha2, d.y, y.data_ptr<float>(), d.bias,
                                                  b.data_ptr<float>(), d.relu, d.y, y.data_ptr<float>()));
  return y;
}

REGISTER_BINDING(conv_bias_relu, conv_bias_relu);
