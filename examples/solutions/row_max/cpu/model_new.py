"""CPU solution: row maxima; a NaN anywhere in a row makes that row's maximum NaN, as torch.amax does."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>

torch::Tensor row_max(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CPU tensor");
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) > 0, "x: expected a non-empty last dimension");
    const int64_t cols = x.size(-1);
    const int64_t rows = x.numel() / cols;
    auto out_sizes = x.sizes().vec();
    out_sizes.pop_back();
    auto out = torch::empty(out_sizes, x.options());
    const float* px = x.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = px + r * cols;
        float best = -std::numeric_limits<float>::infinity();
        for (int64_t c = 0; c < cols; ++c) {
            const float v = row[c];
            if (std::isnan(v)) { best = v; break; }
            best = v > best ? v : best;
        }
        po[r] = best;
    }
    return out;
}
"""

_ext = load_inline(
    name="sol_row_max_cpu",
    cpp_sources=_CPP,
    functions=["row_max"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_max(x)
