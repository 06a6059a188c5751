"""CUDA solution: direct 3x3 convolution fused with eval-mode batch norm and ReLU in one kernel.

Each 256-thread block computes a 16x32 pixel tile for 16 output channels: input channels are staged four
at a time (with their one-pixel halo) in shared memory, the weights are stored channel-innermost so one
float4 broadcast feeds four output channels, and each thread keeps two pixels x 16 channels in registers.
The batch norm is folded into a per-channel scale/shift applied with the ReLU before the single store.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <cuda_runtime.h>
#include <cstdint>

constexpr int kTileW = 16, kTileH = 32, kCoTile = 16, kCiChunk = 4;
constexpr int kHaloW = kTileW + 2, kHaloH = kTileH + 2;

__global__ void __launch_bounds__(256)
conv3x3_bn_relu_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                       const float* __restrict__ running_mean, const float* __restrict__ running_var,
                       const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                       float* __restrict__ out, int cin, int cout, int height, int width, int tiles_w) {
    __shared__ float s_in[kCiChunk][kHaloH][kHaloW];
    __shared__ __align__(16) float s_w[kCiChunk][9][kCoTile];
    __shared__ float s_scale[kCoTile], s_shift[kCoTile];

    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * kTileW + tx;
    const int w0 = (blockIdx.x % tiles_w) * kTileW, h0 = (blockIdx.x / tiles_w) * kTileH;
    const int co0 = blockIdx.y * kCoTile;
    const int n = blockIdx.z;

    if (tid < kCoTile) {
        const int co = co0 + tid;
        float scale = 0.0f, shift = 0.0f;
        if (co < cout) {
            scale = gamma[co] / sqrtf(running_var[co] + eps);
            shift = beta[co] - running_mean[co] * scale;
        }
        s_scale[tid] = scale;
        s_shift[tid] = shift;
    }
    __syncthreads();

    float acc0[kCoTile], acc1[kCoTile];
#pragma unroll
    for (int c = 0; c < kCoTile; ++c) acc0[c] = acc1[c] = 0.0f;

    const int64_t plane = static_cast<int64_t>(height) * width;
    const float* x_n = x + static_cast<int64_t>(n) * cin * plane;
    for (int ci0 = 0; ci0 < cin; ci0 += kCiChunk) {
        for (int idx = tid; idx < kCiChunk * kHaloH * kHaloW; idx += 256) {
            const int c = idx / (kHaloH * kHaloW);
            const int rem = idx % (kHaloH * kHaloW);
            const int ih = h0 + rem / kHaloW - 1, iw = w0 + rem % kHaloW - 1;
            const int ci = ci0 + c;
            float v = 0.0f;
            if (ci < cin && ih >= 0 && ih < height && iw >= 0 && iw < width) v = x_n[ci * plane + ih * width + iw];
            s_in[c][rem / kHaloW][rem % kHaloW] = v;
        }
        for (int idx = tid; idx < kCiChunk * 9 * kCoTile; idx += 256) {
            const int co_l = idx % kCoTile, tap = (idx / kCoTile) % 9, c = idx / (kCoTile * 9);
            const int co = co0 + co_l, ci = ci0 + c;
            s_w[c][tap][co_l] = (co < cout && ci < cin) ? weight[(static_cast<int64_t>(co) * cin + ci) * 9 + tap] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < kCiChunk; ++c) {
#pragma unroll
            for (int kh = 0; kh < 3; ++kh) {
#pragma unroll
                for (int kw = 0; kw < 3; ++kw) {
                    const float v0 = s_in[c][ty + kh][tx + kw];
                    const float v1 = s_in[c][ty + 16 + kh][tx + kw];
                    const float4* w4 = reinterpret_cast<const float4*>(&s_w[c][kh * 3 + kw][0]);
#pragma unroll
                    for (int q = 0; q < kCoTile / 4; ++q) {
                        const float4 wv = w4[q];
                        acc0[4 * q + 0] = fmaf(v0, wv.x, acc0[4 * q + 0]);
                        acc0[4 * q + 1] = fmaf(v0, wv.y, acc0[4 * q + 1]);
                        acc0[4 * q + 2] = fmaf(v0, wv.z, acc0[4 * q + 2]);
                        acc0[4 * q + 3] = fmaf(v0, wv.w, acc0[4 * q + 3]);
                        acc1[4 * q + 0] = fmaf(v1, wv.x, acc1[4 * q + 0]);
                        acc1[4 * q + 1] = fmaf(v1, wv.y, acc1[4 * q + 1]);
                        acc1[4 * q + 2] = fmaf(v1, wv.z, acc1[4 * q + 2]);
                        acc1[4 * q + 3] = fmaf(v1, wv.w, acc1[4 * q + 3]);
                    }
                }
            }
        }
        __syncthreads();
    }

    const int w = w0 + tx;
    if (w >= width) return;
    float* out_n = out + static_cast<int64_t>(n) * cout * plane;
#pragma unroll
    for (int c = 0; c < kCoTile; ++c) {
        const int co = co0 + c;
        if (co >= cout) break;
        const int h_a = h0 + ty, h_b = h0 + ty + 16;
        if (h_a < height) {
            const float v = acc0[c] * s_scale[c] + s_shift[c];
            out_n[co * plane + h_a * width + w] = v > 0.0f ? v : 0.0f;
        }
        if (h_b < height) {
            const float v = acc1[c] * s_scale[c] + s_shift[c];
            out_n[co * plane + h_b * width + w] = v > 0.0f ? v : 0.0f;
        }
    }
}

cudaError_t conv_bn_relu_launch(const float* x, const float* weight, const float* running_mean,
                                const float* running_var, const float* gamma, const float* beta, float eps,
                                float* out, int batch, int cin, int cout, int height, int width, cudaStream_t stream) {
    if (batch == 0 || cout == 0 || height == 0 || width == 0) return cudaSuccess;
    const int tiles_w = (width + kTileW - 1) / kTileW, tiles_h = (height + kTileH - 1) / kTileH;
    const dim3 grid(static_cast<unsigned>(tiles_w * tiles_h), static_cast<unsigned>((cout + kCoTile - 1) / kCoTile),
                    static_cast<unsigned>(batch));
    const dim3 block(kTileW, kTileH / 2);
    conv3x3_bn_relu_kernel<<<grid, block, 0, stream>>>(x, weight, running_mean, running_var, gamma, beta, eps, out,
                                                       cin, cout, height, width, tiles_w);
    return cudaGetLastError();
}
"""

_CPP = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

cudaError_t conv_bn_relu_launch(const float* x, const float* weight, const float* running_mean,
                                const float* running_var, const float* gamma, const float* beta, float eps,
                                float* out, int batch, int cin, int cout, int height, int width, cudaStream_t stream);

static void check_input(const torch::Tensor& t, const char* name, int64_t dims) {
    TORCH_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, ": expected float32");
    TORCH_CHECK(t.is_contiguous(), name, ": expected a contiguous tensor");
    TORCH_CHECK(t.dim() == dims, name, ": expected ", dims, " dimensions");
}

torch::Tensor conv_bn_relu(torch::Tensor x, torch::Tensor weight, torch::Tensor running_mean, torch::Tensor running_var,
                           torch::Tensor gamma, torch::Tensor beta, double eps) {
    check_input(x, "x", 4);
    check_input(weight, "weight", 4);
    check_input(running_mean, "running_mean", 1);
    check_input(running_var, "running_var", 1);
    check_input(gamma, "gamma", 1);
    check_input(beta, "beta", 1);
    const int64_t batch = x.size(0), cin = x.size(1), height = x.size(2), width = x.size(3), cout = weight.size(0);
    TORCH_CHECK(weight.size(1) == cin && weight.size(2) == 3 && weight.size(3) == 3, "weight: expected [cout, cin, 3, 3]");
    TORCH_CHECK(batch < 65536 && height * width < (int64_t{1} << 31), "x: too large for this kernel's indexing");
    const c10::cuda::CUDAGuard guard(x.device());
    auto out = torch::empty({batch, cout, height, width}, x.options());
    const cudaError_t err = conv_bn_relu_launch(
        x.data_ptr<float>(), weight.data_ptr<float>(), running_mean.data_ptr<float>(), running_var.data_ptr<float>(),
        gamma.data_ptr<float>(), beta.data_ptr<float>(), static_cast<float>(eps), out.data_ptr<float>(),
        static_cast<int>(batch), static_cast<int>(cin), static_cast<int>(cout), static_cast<int>(height),
        static_cast<int>(width), at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, "conv_bn_relu launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

_ext = load_inline(
    name="sol_conv_bn_relu_cuda",
    cpp_sources=_CPP,
    cuda_sources=_CUDA,
    functions=["conv_bn_relu"],
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
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
        return _ext.conv_bn_relu(x, self.conv.weight, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps)
