"""The convolution layers: Conv1D/2D/3D (valid, same and causal padding, strides, dilation,
groups), Conv1D/2D/3DTranspose (output_padding), DepthwiseConv1D/2D (depth_multiplier) and
SeparableConv1D/2D, in both data formats; one module (Convolution) and its builders.

Padding is Keras's: "same" pads (k - 1) * dilation + 1 - stride-aligned, the extra element after
(TensorFlow's rule); a transposed convolution's output is the window JAX computes, which Keras 3
uses on every backend (the full transposed convolution cropped, or zero-extended, on each side)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch.nn.functional as F
from torch import nn

from ...conv_lstm import any_padding, same_padding
from .activations import _Activation, activation_name
from .base import _Single, channels_last_format, class_rank, from_channels_first, to_channels_first
from .registry import builder
from .values import Values, check_shapes, int_tuple

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def transpose_crops(kernel: int, stride: int, dilation: int, padding: str, output_padding: Optional[int]) -> Tuple[int, int]:
    """(left, right) to crop from the full transposed convolution ((n - 1) * stride + span) to
    get Keras's output; negative: zeros to add. Keras 3's JAX padding rule."""
    span = (kernel - 1) * dilation + 1
    if padding == "valid":
        output_padding = max(span, stride) - span if output_padding is None else output_padding
        left, right = span - 1, span - 1 + output_padding
    else:
        pad = stride + span - 2 if output_padding is None else span + span % 2 - 2 + output_padding
        left = min(pad // 2 + pad % 2, span - 1)
        right = pad - left
    return span - 1 - left, span - 1 - right


class Convolution(_Single):
    """kind "conv" (grouped), "depthwise", "separable" or "transpose". `weight` is in torch's
    layout (conv: (out, in / groups, *k); depthwise: (in * multiplier, 1, *k); transpose:
    (in, out, *k)); `pointwise` (separable) is (out, in * multiplier, 1, ...)."""

    keeps_mask = False

    def __init__(self, kind: str, weight, bias, strides, padding, dilation, groups, activation, channels_last: bool,
                 pointwise=None, output_padding: Optional[Sequence[Optional[int]]] = None):
        super().__init__()
        self.kind, self.weight, self.pointwise, self.bias = kind, weight, pointwise, bias
        self.strides, self.padding, self.dilation, self.groups = tuple(strides), padding, tuple(dilation), groups
        self.activation, self.channels_last = activation, channels_last
        self.output_padding = None if output_padding is None else tuple(output_padding)

    @property
    def rank(self) -> int:
        return self.weight.dim() - 2

    def keras_groups(self):
        rank = self.rank
        spatial = list(range(2, 2 + rank))
        bias = [self.bias] if self.bias is not None else []
        if self.kind == "conv":  # (out, in, *k) -> (*k, in, out)
            return [("", [self.weight.permute(*spatial, 1, 0)] + bias)]
        if self.kind == "transpose":  # (in, out, *k) -> (*k, out, in)
            return [("", [self.weight.permute(*spatial, 1, 0)] + bias)]
        channels = self.groups
        depthwise = self.weight.permute(*spatial, 1, 0).reshape(*self.weight.shape[2:], channels, -1)
        if self.kind == "depthwise":
            return [("", [depthwise] + bias)]
        return [("", [depthwise, self.pointwise.permute(*spatial, 1, 0)] + bias)]

    def _same(self, h):
        pads = []  # F.pad: the last axis first
        for d in reversed(range(self.rank)):
            pads += list(same_padding(h.shape[2 + d], self.weight.shape[2 + d], self.strides[d], self.dilation[d]))
        return F.pad(h, pads) if any_padding(pads) else h

    def apply(self, x):
        rank = self.rank
        h = to_channels_first(x, self.channels_last)
        if self.kind == "transpose":
            y = _CONV_T[rank](h, self.weight, None, self.strides, 0, 0, 1, self.dilation)
            pads = []
            for d in reversed(range(rank)):
                left, right = transpose_crops(self.weight.shape[2 + d], self.strides[d], self.dilation[d], self.padding,
                                              self.output_padding[d] if self.output_padding else None)
                pads += [-left, -right]  # F.pad crops with negative pads
            y = F.pad(y, pads)
            if self.bias is not None:
                y = y + self.bias.reshape(-1, *([1] * rank))
        else:
            if self.padding == "causal":
                h = F.pad(h, ((self.weight.shape[-1] - 1) * self.dilation[0], 0))
            elif self.padding == "same":
                h = self._same(h)
            last_bias = self.bias if self.kind != "separable" else None
            y = _CONV[rank](h, self.weight, last_bias, self.strides, 0, self.dilation, self.groups)
            if self.kind == "separable":
                y = _CONV[rank](y, self.pointwise, self.bias)
        return self.activation(from_channels_first(y, self.channels_last))  # Keras: on the output as laid out


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
def _common(cfg, ctx, rank: int, paddings=("valid", "same")):
    v = Values(cfg, ctx)
    kernel_size = int_tuple(v, "kernel_size", rank, None)
    strides, dilation = int_tuple(v, "strides", rank, 1), int_tuple(v, "dilation_rate", rank, 1)
    padding = v.str("padding", "valid", paddings)
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    return v, kernel_size, strides, dilation, padding, activation, channels_last_format(cfg, ctx)


def _weights(ctx, use_bias: bool, kernel: tuple, filters: int):
    (w,) = ctx.weights.take([("", 1 + int(use_bias))])
    check_shapes(ctx, ctx.spec.class_name, w, [kernel] + ([(filters,)] if use_bias else []))
    return [np.array(a) for a in w]


def _bias(ctx, w, use_bias):
    return ctx.tensor(w[-1]) if use_bias else None


def _torch(ctx, array: np.ndarray, order) -> nn.Parameter:
    return ctx.tensor(np.ascontiguousarray(np.transpose(array, order)))


@builder("Conv1D", "Convolution1D", "Conv2D", "Convolution2D", "Conv3D", "Convolution3D")
def build_conv(cfg, ctx):
    rank = class_rank(ctx)
    v, k, strides, dilation, padding, activation, last = _common(cfg, ctx, rank, ("valid", "same", "causal")
                                                                  if rank == 1 else ("valid", "same"))
    filters, groups, use_bias = v.int("filters", lo=1), v.int("groups", 1, lo=1), v.bool("use_bias", True)
    if filters % groups:
        raise ctx.error(f"{ctx.spec.class_name} filters={filters} is not divisible by groups={groups}")
    w = _weights(ctx, use_bias, (*k, "in", filters), filters)
    weight = _torch(ctx, w[0], (rank + 1, rank, *range(rank)))  # (*k, in/g, out) -> (out, in/g, *k)
    return Convolution("conv", weight, _bias(ctx, w, use_bias), strides, padding, dilation, groups, activation, last)


@builder("Conv1DTranspose", "Convolution1DTranspose", "Conv2DTranspose", "Convolution2DTranspose",
         "Conv3DTranspose", "Convolution3DTranspose")
def build_conv_transpose(cfg, ctx):
    rank = class_rank(ctx)
    v, k, strides, dilation, padding, activation, last = _common(cfg, ctx, rank)
    filters, use_bias = v.int("filters", lo=1), v.bool("use_bias", True)
    output_padding = cfg.get("output_padding")
    if output_padding is not None:
        values = output_padding if isinstance(output_padding, list) else [output_padding] * rank
        if len(values) != rank:
            raise ctx.error(f"config output_padding={str(output_padding)[:40]!r}; expected an integer or {rank} of them")
        output_padding = [Values({"output_padding": p}, ctx).int("output_padding", lo=0, hi=1 << 16) for p in values]
        if any(p >= s for p, s in zip(output_padding, strides)):
            raise ctx.error(f"output_padding={output_padding} must be smaller than strides={list(strides)}")
    w = _weights(ctx, use_bias, (*k, filters, "in"), filters)
    weight = _torch(ctx, w[0], (rank + 1, rank, *range(rank)))  # (*k, out, in) -> (in, out, *k)
    return Convolution("transpose", weight, _bias(ctx, w, use_bias), strides, padding, dilation, 1, activation, last,
                       output_padding=output_padding)


def _depthwise(ctx, array: np.ndarray, rank: int) -> nn.Parameter:
    """(*k, in, multiplier) -> (in * multiplier, 1, *k), output channel c * multiplier + m."""
    k, channels, multiplier = array.shape[:rank], array.shape[rank], array.shape[rank + 1]
    return _torch(ctx, array.reshape(*k, 1, channels * multiplier), (rank + 1, rank, *range(rank)))


@builder("DepthwiseConv1D", "DepthwiseConv2D")
def build_depthwise(cfg, ctx):
    rank = class_rank(ctx)
    v, k, strides, dilation, padding, activation, last = _common(cfg, ctx, rank)
    multiplier, use_bias = v.int("depth_multiplier", 1, lo=1), v.bool("use_bias", True)
    (w,) = ctx.weights.take([("", 1 + int(use_bias))])
    check_shapes(ctx, ctx.spec.class_name, w[:1], [(*k, "in", multiplier)])
    channels = int(np.shape(w[0])[rank])
    if use_bias:
        check_shapes(ctx, ctx.spec.class_name, w[1:], [(channels * multiplier,)])
    return Convolution("depthwise", _depthwise(ctx, np.array(w[0]), rank), _bias(ctx, w, use_bias), strides, padding,
                       dilation, channels, activation, last)


@builder("SeparableConv1D", "SeparableConvolution1D", "SeparableConv2D", "SeparableConvolution2D")
def build_separable(cfg, ctx):
    rank = class_rank(ctx)
    # (tf.keras's SeparableConv1D pads causally too; Keras 3's refuses it)
    v, k, strides, dilation, padding, activation, last = _common(cfg, ctx, rank, ("valid", "same", "causal")
                                                                 if rank == 1 else ("valid", "same"))
    filters, multiplier, use_bias = v.int("filters", lo=1), v.int("depth_multiplier", 1, lo=1), v.bool("use_bias", True)
    (w,) = ctx.weights.take([("", 2 + int(use_bias))])
    check_shapes(ctx, ctx.spec.class_name, w[:1], [(*k, "in", multiplier)])
    channels = int(np.shape(w[0])[rank])
    check_shapes(ctx, ctx.spec.class_name, w[1:], [(*([1] * rank), channels * multiplier, filters)] +
                 ([(filters,)] if use_bias else []))
    pointwise = _torch(ctx, np.array(w[1]), (rank + 1, rank, *range(rank)))
    return Convolution("separable", _depthwise(ctx, np.array(w[0]), rank), _bias(ctx, w, use_bias), strides, padding,
                       dilation, channels, activation, last, pointwise=pointwise)
