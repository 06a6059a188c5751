"""CPU solution: direct 3x3 convolution with the eval-mode batch norm folded into a per-channel scale/shift, then ReLU."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CPP = r"""
#include <torch/extension.h>
#include <cmath>
#include <vector>

static void check_input(const torch::Tensor& t, const char* name, int64_t dims) {
    TORCH_CHECK(t.device().is_cpu(), name, ": expected a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, ": expected float32");
    TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
    TORCH_CHECK(t.dim() == dims, name, ": expected ", dims, " dimensions");
}

torch::Tensor conv_bn_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor running_mean,
                           torch::Tensor running_var, torch::Tensor gamma, torch::Tensor beta, double eps) {
    check_input(x, "x", 4);
    check_input(weight, "weight", 4);
    check_input(running_mean, "running_mean", 1);
    check_input(running_var, "running_var", 1);
    check_input(gamma, "gamma", 1);
    check_input(beta, "beta", 1);
    const int64_t batch = x.size(0), cin = x.size(1), height = x.size(2), width = x.size(3);
    const int64_t cout = weight.size(0);
    TORCH_CHECK(weight.size(1) == cin && weight.size(2) == 3 && weight.size(3) == 3, "weight: expected [cout, cin, 3, 3]");
    auto out = torch::empty({batch, cout, height, width}, x.options());
    const float* px = x.data_ptr<float>();
    const float* pw = weight.data_ptr<float>();
    const float* pm = running_mean.data_ptr<float>();
    const float* pv = running_var.data_ptr<float>();
    const float* pg = gamma.data_ptr<float>();
    const float* pbeta = beta.data_ptr<float>();
    float* po = out.data_ptr<float>();
    std::vector<double> plane(static_cast<size_t>(height * width));
    for (int64_t n = 0; n < batch; ++n) {
        for (int64_t co = 0; co < cout; ++co) {
            std::fill(plane.begin(), plane.end(), 0.0);
            for (int64_t ci = 0; ci < cin; ++ci) {
                const float* xin = px + (n * cin + ci) * height * width;
                const float* wk = pw + (co * cin + ci) * 9;
                for (int64_t kh = 0; kh < 3; ++kh) {
                    for (int64_t kw = 0; kw < 3; ++kw) {
                        const double wv = wk[kh * 3 + kw];
                        for (int64_t h = 0; h < height; ++h) {
                            const int64_t ih = h + kh - 1;
                            if (ih < 0 || ih >= height) continue;
                            for (int64_t w = 0; w < width; ++w) {
                                const int64_t iw = w + kw - 1;
                                if (iw < 0 || iw >= width) continue;
                                plane[h * width + w] += wv * xin[ih * width + iw];
                            }
                        }
                    }
                }
            }
            const double scale = pg[co] / std::sqrt(static_cast<double>(pv[co]) + eps);
            const double shift = pbeta[co] - pm[co] * scale;
            float* dst = po + (n * cout + co) * height * width;
            for (int64_t i = 0; i < height * width; ++i) {
                const double v = plane[i] * scale + shift;
                dst[i] = v > 0.0 ? static_cast<float>(v) : 0.0f;
            }
        }
    }
    return out;
}
"""

_ext = load_inline(
    name="sol_conv_bn_relu_cpu",
    cpp_sources=_CPP,
    functions=["conv_bn_relu"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        # Built exactly like the task's Model (same modules, same init order) so seeded weights match.
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn = self.bn
        return _ext.conv_bn_relu(
            x, self.conv.weight, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps
        )
