"""CPU solution: row sums accumulated in double (more accurate than fp32 pairwise summation)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>

torch::Tensor row_sum(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "x: expected a contiguous float32 CPU tensor");
    TORCH_CHECK(x.dim() >= 1, "x: expected at least one dimension");
    const int64_t cols = x.size(-1);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    auto out_sizes = x.sizes().vec();
    out_sizes.pop_back();
    auto out = torch::empty(out_sizes, x.options());
    const float* px = x.data_ptr<float>();
    float* po = out.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = px + r * cols;
        double acc = 0.0;
        for (int64_t c = 0; c < cols; ++c) acc += row[c];
        po[r] = static_cast<float>(acc);
    }
    return out;
}
"""

_ext = load_inline(
    name="sol_row_sum_cpu",
    cpp_sources=_CPP,
    functions=["row_sum"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ext.row_sum(x)
