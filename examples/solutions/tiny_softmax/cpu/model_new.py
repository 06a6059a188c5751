"""CPU solution: numerically safe softmax per row (max, then a double sum of exponentials, then scale)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CPU tensor");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected a non-empty last dimension");
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / cols;
    auto out = torch::empty_like(x);
    const float* px = x.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = px + r * cols;
        float* orow = po + r * cols;
        float row_max = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < cols; ++c) row_max = row[c] > row_max ? row[c] : row_max;
        double total = 0.0;
        for (int64_t c = 0; c < cols; ++c) total += std::exp(static_cast<double>(row[c]) - row_max);
        const double inv_total = 1.0 / total;
        for (int64_t c = 0; c < cols; ++c) {
            orow[c] = static_cast<float>(std::exp(static_cast<double>(row[c]) - row_max) * inv_total);
        }
    }
    return out;
}
"""

_ext = load_inline(
    name="sol_tiny_softmax_cpu",
    cpp_sources=_CPP,
    functions=["softmax_rows"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.softmax_rows(x)
