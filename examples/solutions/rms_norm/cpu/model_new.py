"""CPU solution: RMS norm per row with the mean of squares accumulated in double."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CPU tensor");
    TORCH_CHECK(weight.device().is_cpu() && weight.scalar_type() == torch::kFloat32 && weight.is_contiguous(),
                "weight: expected a contiguous float32 CPU tensor");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.numel() == cols, "weight: expected ", cols, " elements");
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    auto out = torch::empty_like(x);
    const float* px = x.data_ptr<float>();
    const float* pw = weight.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = px + r * cols;
        double squares = 0.0;
        for (int64_t c = 0; c < cols; ++c) squares += static_cast<double>(row[c]) * row[c];
        const double inv_rms = 1.0 / std::sqrt(squares / cols + eps);
        for (int64_t c = 0; c < cols; ++c) po[r * cols + c] = static_cast<float>(row[c] * inv_rms * pw[c]);
    }
    return out;
}
"""

_ext = load_inline(
    name="sol_rms_norm_cpu",
    cpp_sources=_CPP,
    functions=["rms_norm"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, normalized_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(normalized_size) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.rms_norm(x, self.weight, self.eps)
