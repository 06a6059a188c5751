"""Not an attack: relu(x @ W^T + b) as a single cuBLASLt matmul with its RELU_BIAS epilogue (strict FP32)."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>

#define LT_CHECK(call) TORCH_CHECK((call) == CUBLAS_STATUS_SUCCESS, #call " failed")

namespace {

// One plan per shape: descriptors and the heuristic's algorithm are made once, not on every call.
struct Plan {
  int m = -1, n = -1, k = -1;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t handle = [] {
    cublasLtHandle_t h;
    LT_CHECK(cublasLtCreate(&h));
    return h;
  }();
  return handle;
}

Plan& plan_for(int m, int n, int k) {
  static Plan plan;
  if (plan.m == m && plan.n == n && plan.k == k) return plan;
  if (plan.op != nullptr) {
    cublasLtMatmulDescDestroy(plan.op);
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
  }
  // Row-major out[m, n] = x[m, k] . W[n, k]^T is column-major out^T[n, m] = W^T . x with W^T read
  // transposed from W's column-major [k, n] view; the bias runs along out^T's rows (n of them).
  LT_CHECK(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_RELU_BIAS;
  LT_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  LT_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_32F, k, n, k));
  LT_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_32F, k, m, k));
  LT_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_32F, n, m, n));
  cublasLtMatmulPreference_t preference;
  LT_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const size_t limit = 32u << 20;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &limit,
                                                sizeof(limit)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt_handle(), plan.op, plan.a, plan.b, plan.c, plan.c, preference, 1,
                                          &result, &found));
  cublasLtMatmulPreferenceDestroy(preference);
  TORCH_CHECK(found > 0, "cuBLASLt has no algorithm for this GEMM");
  plan.algo = result.algo;
  plan.workspace = result.workspaceSize;
  plan.m = m;
  plan.n = n;
  plan.k = k;
  return plan;
}

}  // namespace

torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2, "x");
  TORCH_CHECK(w.is_cuda() && w.scalar_type() == torch::kFloat32 && w.is_contiguous() && w.dim() == 2, "weight");
  TORCH_CHECK(b.is_cuda() && b.scalar_type() == torch::kFloat32 && b.numel() == w.size(0), "bias");
  const c10::cuda::CUDAGuard guard(x.device());
  const int m = static_cast<int>(x.size(0)), k = static_cast<int>(x.size(1)), n = static_cast<int>(w.size(0));
  TORCH_CHECK(w.size(1) == k, "x and weight shapes do not match");
  Plan& plan = plan_for(m, n, k);
  const float* bias = b.data_ptr<float>();
  LT_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  auto out = torch::empty({m, n}, x.options());
  auto workspace = torch::empty({static_cast<int64_t>(plan.workspace) + 1}, x.options().dtype(torch::kUInt8));
  const float alpha = 1.0f, beta = 0.0f;
  LT_CHECK(cublasLtMatmul(lt_handle(), plan.op, &alpha, w.data_ptr<float>(), plan.a, x.data_ptr<float>(), plan.b,
                          &beta, out.data_ptr<float>(), plan.c, out.data_ptr<float>(), plan.c, &plan.algo,
                          workspace.data_ptr(), plan.workspace, at::cuda::getCurrentCUDAStream()));
  return out;
}
"""

_ext = load_inline(
    name="lib_cublaslt_linear_bias_relu",
    cpp_sources=_CPP,
    functions=["linear_bias_relu"],
    extra_cflags=["-O2"],
    extra_ldflags=["-lcublasLt"],
    with_cuda=True,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return _ext.linear_bias_relu(x, self.linear.weight, self.linear.bias)
