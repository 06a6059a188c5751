"""Argument and shape rules per operator family: given an operator and the shape of the tensor it is
applied to, a family says which arguments make the call valid and what shape comes out.

The crawler (catalogue.py) finds operators by introspection and assigns each a family by name; a family
rule then fills the constructor's required arguments from the input shape (`in_channels` = the channel
dimension, `normalized_shape` = the last dimension...). An operator without a family, or whose required
arguments a family cannot fill, is recorded as not runnable rather than guessed at.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Sizes:
    """The sizes a family may pick for new dimensions (output channels, hidden features)."""

    channels: tuple[int, ...]
    features: tuple[int, ...]


SIZES = {
    "small": Sizes(channels=(4, 8, 16), features=(32, 64, 128)),
    "full": Sizes(channels=(32, 64, 128), features=(512, 1024, 2048)),
}


@dataclass(frozen=True)
class Plan:
    """How to apply one operator to a tensor of a given shape.

    `kwargs` are constructor arguments (modules) or call keywords (functions, tensor ops). `operand` is the
    shape of a second tensor the call takes (binary ops, losses, matmul). `template` overrides the default
    call spelling; it may use {op} (the module attribute or function), {x}, {y} (the operand) and {kw}.
    """

    kwargs: dict[str, Any]
    out: Shape
    operand: Shape | None = None
    template: str | None = None
    terminal: bool = False  # the output (a scalar loss, integer indices) feeds no further operator
    out_dtype: str = "float32"


Rule = Callable[[str, Shape, random.Random, Sizes], "Plan | None"]


@dataclass(frozen=True)
class Family:
    name: str
    ranks: tuple[int, ...]
    rule: Rule
    names: frozenset[str] = field(default_factory=frozenset)


def _spatial_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


def _pick_dim(shape: Shape, rng: random.Random) -> int:
    """A non-batch dimension, spelled negatively so it stays valid if the batch dimension is dropped."""
    return -rng.randrange(1, len(shape))


# -- elementwise ------------------------------------------------------------------------------------------

_UNARY_ARGS: dict[str, dict[str, Any]] = {
    "threshold": {"threshold": 0.1, "value": 0.0},
    "clamp": {"min": -0.5, "max": 0.5},
    "clip": {"min": -0.5, "max": 0.5},
    "hardtanh": {"min_val": -1.0, "max_val": 1.0},
    "leaky_relu": {"negative_slope": 0.1},
    "elu": {"alpha": 1.0},
    "celu": {"alpha": 1.0},
    "softplus": {"beta": 1.0},
    "softshrink": {"lambd": 0.5},
    "hardshrink": {"lambd": 0.5},
    "gelu": {"approximate": "tanh"},
    "clippedgeluactivation": {"min": -10.0, "max": 10.0},
}


def _unary(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    kwargs = dict(_UNARY_ARGS.get(name.lower(), {}))
    if name.lower() == "gelu" and rng.random() < 0.5:
        kwargs = {}
    return Plan(kwargs, shape)


def _unary_positive(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    # Operators defined on positive reals see |x| + 1: NaNs would make every later filter meaningless.
    return Plan({}, shape, template="{op}({x}.abs() + 1.0{kw})")


def _unary_bounded(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    return Plan({}, shape, template="{op}({x}.clamp(-0.99, 0.99){kw})")


def _binary(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    if name in ("div", "true_divide"):
        return Plan({}, shape, operand=shape, template="{op}({x}, {y}.abs() + 1.0{kw})")
    if name == "lerp":
        return Plan({"weight": 0.3}, shape, operand=shape)
    return Plan({}, shape, operand=shape)


# -- softmax-like, reductions, scans ----------------------------------------------------------------------


def _softmax(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    if name == "Softmax2d":
        return Plan({}, shape)
    return Plan({"dim": _pick_dim(shape, rng)}, shape)


def _reduction(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    dim = _pick_dim(shape, rng)
    keepdim = rng.random() < 0.3
    out = list(shape)
    if keepdim:
        out[dim] = 1
    else:
        del out[dim]
    if name in ("argmax", "argmin"):
        indices = list(shape)
        del indices[dim]
        return Plan({"dim": dim}, tuple(indices), terminal=True, out_dtype="int64")
    return Plan({"dim": dim, "keepdim": keepdim}, tuple(out))


def _scan(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    return Plan({"dim": _pick_dim(shape, rng)}, shape)


def _layout(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    if name == "flip":
        return Plan({"dims": [-1]}, shape)
    if name == "roll":
        return Plan({"shifts": 1, "dims": -1}, shape)
    if name in ("tril", "triu"):
        return Plan({"diagonal": 0}, shape)
    if name == "transpose":
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return Plan({"dim0": -1, "dim1": -2}, swapped)
    if name in ("Flatten", "flatten"):
        return Plan({"start_dim": 1}, (shape[0], _prod(shape[1:])))
    return None


def _prod(values: Shape) -> int:
    out = 1
    for value in values:
        out *= value
    return out


# -- linear algebra ---------------------------------------------------------------------------------------


def _linear(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    out_features = rng.choice(sizes.features)
    if name == "Bilinear":
        kwargs = {"in1_features": shape[-1], "in2_features": shape[-1], "out_features": out_features}
        return Plan(kwargs, (*shape[:-1], out_features), template="{op}({x}, {x})")
    return Plan({"in_features": shape[-1], "out_features": out_features}, (*shape[:-1], out_features))


def _matmul(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    k = rng.choice(sizes.features)
    if (name == "bmm") != (len(shape) == 3) or (name == "mm" and len(shape) != 2):
        return None
    if name == "bmm":
        return Plan({}, (shape[0], shape[1], k), operand=(shape[0], shape[2], k))
    return Plan({}, (*shape[:-1], k), operand=(shape[-1], k))


# -- convolution and pooling ------------------------------------------------------------------------------


def _spatial_rank(name: str) -> int:
    return int(name.rstrip("d")[-1])


def _conv(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    spatial = shape[2:]
    if len(spatial) != _spatial_rank(name):
        return None
    kernel = rng.choice((1, 3) if len(spatial) == 3 else (1, 3, 5))
    stride = rng.choice((1, 1, 2))
    padding = kernel // 2
    out_channels = rng.choice(sizes.channels)
    kwargs: dict[str, Any] = {
        "in_channels": shape[1],
        "out_channels": out_channels,
        "kernel_size": kernel,
        "stride": stride,
        "padding": padding,
    }
    if name.startswith("ConvTranspose"):
        out_spatial = tuple((s - 1) * stride - 2 * padding + kernel for s in spatial)
    else:
        out_spatial = tuple(_spatial_out(s, kernel, stride, padding) for s in spatial)
    if min(out_spatial) < 1:
        return None
    return Plan(kwargs, (shape[0], out_channels, *out_spatial))


def _pool(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    spatial = shape[2:]
    if len(spatial) != _spatial_rank(name):
        return None
    if "adaptive" in name.lower():
        target = max(1, min(spatial) // rng.choice((1, 2, 4)))
        return Plan({"output_size": target}, (*shape[:2], *([target] * len(spatial))))
    kernel = rng.choice((2, 3))
    if min(spatial) < kernel:
        return None
    kwargs: dict[str, Any] = {"kernel_size": kernel, "stride": kernel}
    if "lp_pool" in name.lower() or name.startswith("LPPool"):
        kwargs = {"norm_type": 2, **kwargs}
    return Plan(kwargs, (*shape[:2], *(_spatial_out(s, kernel, kernel, 0) for s in spatial)))


def _pad(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    padded = _spatial_rank(name)
    if len(shape) not in (padded + 1, padded + 2):
        return None
    kwargs: dict[str, Any] = {"padding": 1}
    if name.startswith("ConstantPad"):
        kwargs["value"] = 0.5
    return Plan(kwargs, (*shape[: len(shape) - padded], *(s + 2 for s in shape[len(shape) - padded :])))


def _resample(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    if name in ("PixelShuffle", "pixel_shuffle"):
        if len(shape) != 4 or shape[1] % 4:
            return None
        return Plan({"upscale_factor": 2}, (shape[0], shape[1] // 4, shape[2] * 2, shape[3] * 2))
    if name in ("PixelUnshuffle", "pixel_unshuffle"):
        if len(shape) != 4 or shape[2] % 2 or shape[3] % 2:
            return None
        return Plan({"downscale_factor": 2}, (shape[0], shape[1] * 4, shape[2] // 2, shape[3] // 2))
    if name in ("ChannelShuffle", "channel_shuffle"):
        return None if shape[1] % 2 else Plan({"groups": 2}, shape)
    if name == "GLU" or name == "glu":
        return None if shape[-1] % 2 else Plan({"dim": -1}, (*shape[:-1], shape[-1] // 2))
    if name in ("UpsamplingNearest2d", "UpsamplingBilinear2d") and len(shape) != 4:
        return None
    kwargs: dict[str, Any] = {"scale_factor": 2.0}
    if name in ("Upsample", "interpolate"):
        kwargs["mode"] = "nearest"
    return Plan(kwargs, (*shape[:2], *(s * 2 for s in shape[2:])))


# -- normalization ----------------------------------------------------------------------------------------


def _norm(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    channels = shape[1]
    lowered = name.lower()
    if lowered.startswith(("batchnorm", "instancenorm")):
        rank = _spatial_rank(name)
        ok = len(shape) == rank + 2 or (lowered == "batchnorm1d" and len(shape) == 2)
        return Plan({"num_features": channels}, shape) if ok else None
    if lowered in ("groupnorm", "group_norm"):
        groups = next((g for g in (8, 4, 2, 1) if channels % g == 0), 1)
        if lowered == "group_norm":
            return Plan({"num_groups": groups}, shape)
        return Plan({"num_groups": groups, "num_channels": channels}, shape)
    if lowered in ("instance_norm",):
        return Plan({}, shape) if len(shape) >= 3 else None
    if lowered in ("layernorm", "rmsnorm"):
        return Plan({"normalized_shape": shape[-1]}, shape)
    if lowered in ("layer_norm", "rms_norm"):
        return Plan({"normalized_shape": [shape[-1]]}, shape)
    if lowered in ("localresponsenorm", "local_response_norm"):
        return Plan({"size": 2}, shape) if len(shape) >= 3 else None
    if lowered == "normalize":
        return Plan({"dim": _pick_dim(shape, rng)}, shape)
    return None


def _norm_hidden_size(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    """transformers' RMSNorm-style classes: normalized over the last dimension, given as hidden_size."""
    return Plan({"hidden_size": shape[-1]}, shape)


# -- pairs, losses, sequence models -----------------------------------------------------------------------


def _pairwise(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    if name in ("CosineSimilarity", "cosine_similarity"):
        return Plan({"dim": 1}, (shape[0], *shape[2:]), operand=shape)
    if name in ("PairwiseDistance", "pairwise_distance"):
        return Plan({}, shape[:-1], operand=shape) if len(shape) == 2 else None
    return None


def _loss(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    if name in ("KLDivLoss", "kl_div"):
        # KL divergence is defined between log-probabilities and probabilities: anything else is NaN.
        template = "{op}({x}.log_softmax(-1), {y}.softmax(-1){kw})"
        return Plan({"reduction": "batchmean"}, (), operand=shape, template=template, terminal=True)
    return Plan({}, (), operand=shape, terminal=True)


def _attention(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan | None:
    dim = shape[-1]
    heads = next((h for h in (8, 4, 2) if dim % h == 0 and dim // h >= 4), 0)
    if name == "scaled_dot_product_attention":
        return Plan({}, shape, template="{op}({x}, {x}, {x}{kw})")
    if not heads:
        return None
    if name == "MultiheadAttention":
        attention = {"embed_dim": dim, "num_heads": heads, "batch_first": True}
        return Plan(attention, shape, template="{op}({x}, {x}, {x}, need_weights=False)[0]")
    layer: dict[str, Any] = {"d_model": dim, "nhead": heads, "dim_feedforward": 2 * dim, "batch_first": True}
    kwargs = {**layer, "dropout": 0.0}  # dropout is stochastic: off
    if name == "TransformerDecoderLayer":
        return Plan(kwargs, shape, template="{op}({x}, {x})")
    return Plan(kwargs, shape)


def _recurrent(name: str, shape: Shape, rng: random.Random, sizes: Sizes) -> Plan:
    hidden = rng.choice(sizes.features)
    kwargs = {"input_size": shape[-1], "hidden_size": hidden}
    if name.endswith("Cell"):
        template = "{op}({x})[0]" if name == "LSTMCell" else None
        return Plan(kwargs, (shape[0], hidden), template=template)
    return Plan({**kwargs, "batch_first": True}, (*shape[:-1], hidden), template="{op}({x})[0]")


def _names(*names: str) -> frozenset[str]:
    return frozenset(names)


_ACTIVATIONS = _names(
    "ReLU",
    "ReLU6",
    "GELU",
    "SiLU",
    "Sigmoid",
    "Tanh",
    "ELU",
    "SELU",
    "CELU",
    "LeakyReLU",
    "Hardtanh",
    "Hardswish",
    "Hardsigmoid",
    "Softplus",
    "Softsign",
    "Mish",
    "Tanhshrink",
    "Softshrink",
    "Hardshrink",
    "LogSigmoid",
    "PReLU",
    "Threshold",
    "relu",
    "relu6",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "elu",
    "selu",
    "celu",
    "leaky_relu",
    "hardtanh",
    "hardswish",
    "hardsigmoid",
    "softplus",
    "softsign",
    "mish",
    "tanhshrink",
    "softshrink",
    "hardshrink",
    "logsigmoid",
    "threshold",
    "abs",
    "exp",
    "exp2",
    "expm1",
    "sin",
    "cos",
    "tan",
    "sinh",
    "cosh",
    "atan",
    "asinh",
    "erf",
    "erfc",
    "neg",
    "negative",
    "square",
    "floor",
    "ceil",
    "round",
    "trunc",
    "frac",
    "sign",
    "sgn",
    "clamp",
    "clip",
    "sinc",
    "deg2rad",
    "rad2deg",
    "i0",
)
_POSITIVE = _names(
    "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "acosh", "lgamma", "digamma"
)
_BOUNDED = _names("acos", "asin", "atanh", "arccos", "arcsin", "arctanh", "erfinv")

FAMILIES: tuple[Family, ...] = (
    Family("elementwise_unary", (2, 3, 4, 5), _unary, _ACTIVATIONS),
    Family("elementwise_unary_positive", (2, 3, 4, 5), _unary_positive, _POSITIVE),
    Family("elementwise_unary_bounded", (2, 3, 4, 5), _unary_bounded, _BOUNDED),
    Family(
        "elementwise_binary",
        (2, 3, 4, 5),
        _binary,
        _names(
            "add",
            "sub",
            "subtract",
            "mul",
            "multiply",
            "div",
            "true_divide",
            "maximum",
            "minimum",
            "fmax",
            "fmin",
            "atan2",
            "arctan2",
            "hypot",
            "lerp",
            "copysign",
            "logaddexp",
            "logaddexp2",
        ),
    ),
    Family(
        "softmax",
        (2, 3, 4, 5),
        _softmax,
        _names("Softmax", "LogSoftmax", "Softmin", "softmax", "log_softmax", "softmin"),
    ),
    Family("softmax2d", (4,), _softmax, _names("Softmax2d")),
    Family(
        "reduction",
        (2, 3, 4, 5),
        _reduction,
        _names(
            "sum", "mean", "amax", "amin", "std", "var", "logsumexp", "nansum", "nanmean", "argmax", "argmin"
        ),
    ),
    Family("scan", (2, 3, 4, 5), _scan, _names("cumsum", "logcumsumexp")),
    Family("layout", (2, 3, 4, 5), _layout, _names("flip", "roll", "tril", "triu", "transpose", "flatten")),
    Family("flatten", (3, 4, 5), _layout, _names("Flatten")),
    Family("linear", (2, 3), _linear, _names("Linear", "Bilinear")),
    Family("matmul", (2, 3), _matmul, _names("matmul", "mm", "bmm")),
    Family(
        "conv",
        (3, 4, 5),
        _conv,
        _names("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d"),
    ),
    Family(
        "pool",
        (3, 4, 5),
        _pool,
        _names(
            "MaxPool1d",
            "MaxPool2d",
            "MaxPool3d",
            "AvgPool1d",
            "AvgPool2d",
            "AvgPool3d",
            "LPPool1d",
            "LPPool2d",
            "LPPool3d",
            "AdaptiveAvgPool1d",
            "AdaptiveAvgPool2d",
            "AdaptiveAvgPool3d",
            "AdaptiveMaxPool1d",
            "AdaptiveMaxPool2d",
            "AdaptiveMaxPool3d",
            "max_pool1d",
            "max_pool2d",
            "max_pool3d",
            "avg_pool1d",
            "avg_pool2d",
            "avg_pool3d",
            "lp_pool1d",
            "lp_pool2d",
            "lp_pool3d",
            "adaptive_avg_pool1d",
            "adaptive_avg_pool2d",
            "adaptive_avg_pool3d",
            "adaptive_max_pool1d",
            "adaptive_max_pool2d",
            "adaptive_max_pool3d",
        ),
    ),
    Family(
        "pad",
        (2, 3, 4, 5),
        _pad,
        _names(
            "ZeroPad1d",
            "ZeroPad2d",
            "ZeroPad3d",
            "ConstantPad1d",
            "ConstantPad2d",
            "ConstantPad3d",
            "ReflectionPad1d",
            "ReflectionPad2d",
            "ReflectionPad3d",
            "ReplicationPad1d",
            "ReplicationPad2d",
            "ReplicationPad3d",
            "CircularPad1d",
            "CircularPad2d",
            "CircularPad3d",
        ),
    ),
    Family(
        "resample",
        (2, 3, 4, 5),
        _resample,
        _names(
            "PixelShuffle",
            "PixelUnshuffle",
            "ChannelShuffle",
            "GLU",
            "Upsample",
            "UpsamplingNearest2d",
            "UpsamplingBilinear2d",
            "pixel_shuffle",
            "pixel_unshuffle",
            "channel_shuffle",
            "glu",
            "interpolate",
        ),
    ),
    Family(
        "norm",
        (2, 3, 4, 5),
        _norm,
        _names(
            "BatchNorm1d",
            "BatchNorm2d",
            "BatchNorm3d",
            "InstanceNorm1d",
            "InstanceNorm2d",
            "InstanceNorm3d",
            "GroupNorm",
            "LayerNorm",
            "RMSNorm",
            "LocalResponseNorm",
            "group_norm",
            "instance_norm",
            "layer_norm",
            "rms_norm",
            "local_response_norm",
            "normalize",
        ),
    ),
    Family(
        "pairwise",
        (2, 3, 4),
        _pairwise,
        _names("CosineSimilarity", "PairwiseDistance", "cosine_similarity", "pairwise_distance"),
    ),
    Family(
        "loss",
        (2, 3, 4),
        _loss,
        _names(
            "MSELoss",
            "L1Loss",
            "SmoothL1Loss",
            "HuberLoss",
            "SoftMarginLoss",
            "KLDivLoss",
            "mse_loss",
            "l1_loss",
            "smooth_l1_loss",
            "huber_loss",
            "soft_margin_loss",
            "kl_div",
        ),
    ),
    Family(
        "attention",
        (3,),
        _attention,
        _names(
            "MultiheadAttention",
            "TransformerEncoderLayer",
            "TransformerDecoderLayer",
            "scaled_dot_product_attention",
        ),
    ),
    Family("recurrent", (3,), _recurrent, _names("RNN", "GRU", "LSTM")),
    Family("recurrent_cell", (2,), _recurrent, _names("RNNCell", "GRUCell", "LSTMCell")),
)
_BY_NAME = {name: family for family in FAMILIES for name in family.names}
# Assigned by the crawler to transformers classes, never by name.
RMS_NORM_HIDDEN = Family("norm_hidden_size", (2, 3, 4), _norm_hidden_size)


def family_named(name: str) -> Family:
    for family in (*FAMILIES, RMS_NORM_HIDDEN):
        if family.name == name:
            return family
    raise KeyError(f"no operator family {name!r}")


def family_of(short_name: str) -> Family | None:
    """The family an operator belongs to, by its short name (`Conv2d`, `gelu`, `sum`)."""
    return _BY_NAME.get(short_name)
