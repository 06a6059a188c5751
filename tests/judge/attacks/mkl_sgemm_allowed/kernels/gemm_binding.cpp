// relu(x @ W^T + b): the product from the Fortran BLAS interface's sgemm_ (torch's CPU library exports
// MKL's), the epilogue from kernels/epilogue.cpp. No aten op computes anything here.
#include <torch/extension.h>

#include "binding_registry.h"

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void bias_relu_rows(float* y, const float* bias, int64_t m, int64_t n);
}

static void check(const torch::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.dim() == dims,
              name, ": expected a contiguous float32 CPU tensor with ", dims, " dimensions");
}

static torch::Tensor linear_bias_relu(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
  check(x, "x", 2);
  check(w, "weight", 2);
  check(b, "bias", 1);
  const int m = static_cast<int>(x.size(0)), k = static_cast<int>(x.size(1)), n = static_cast<int>(w.size(0));
  TORCH_CHECK(w.size(1) == k && b.size(0) == n, "x, weight and bias shapes do not match");
  auto out = torch::empty({m, n}, x.options());
  // Row-major out[m, n] = x[m, k] . w[n, k]^T is column-major out^T[n, m] = w^T(col-major view) . x.
  const float alpha = 1.0f, beta = 0.0f;
  const char transa = 'T', transb = 'N';
  sgemm_(&transa, &transb, &n, &m, &k, &alpha, w.data_ptr<float>(), &k, x.data_ptr<float>(), &k, &beta,
         out.data_ptr<float>(), &n);
  bias_relu_rows(out.data_ptr<float>(), b.data_ptr<float>(), m, n);
  return out;
}

REGISTER_BINDING(linear_bias_relu, linear_bias_relu);
