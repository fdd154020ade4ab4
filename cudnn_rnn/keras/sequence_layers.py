"""The layers that work along the time axis (channels_last): Conv1D, MaxPooling1D /
AveragePooling1D, GlobalAveragePooling1D (mask-aware) / GlobalMaxPooling1D, and TimeDistributed
(of the non-recurrent layers, whose weights it addresses below itself with _SubWeights); their
modules and their builders."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..conv_lstm import same_padding
from .activations import _Activation, activation_name
from .basic_layers import _Single, _channels_last
from .graph import LayerSpec
from .recurrent import _RNN_CLASSES
from .registry import BUILDERS, BuildContext, builder, keras_groups, layer_config_of
from .values import Values, check_shapes, int_tuple
from .weights import LayerWeights


class GlobalPooling1D(nn.Module):
    """GlobalAveragePooling1D (mask-aware, as Keras) / GlobalMaxPooling1D, channels_last."""

    def __init__(self, average: bool, keepdims: bool):
        super().__init__()
        self.average, self.keepdims = average, keepdims

    def forward(self, inputs, masks):
        x, mask = inputs[0], masks[0]
        if self.average:
            if mask is None:
                y = x.mean(dim=1, keepdim=self.keepdims)
            else:
                m = mask.unsqueeze(-1).to(x.dtype)
                y = (x * m).sum(dim=1, keepdim=self.keepdims) / m.sum(dim=1, keepdim=self.keepdims)
        else:
            y = x.amax(dim=1, keepdim=self.keepdims)
        return [y], [None]


class Conv1D(_Single):
    keeps_mask = False

    def __init__(self, kernel, bias, stride, padding, dilation, groups, activation):
        super().__init__()
        self.weight = kernel  # torch layout (out, in / groups, k)
        self.bias = bias
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.activation = activation

    def keras_groups(self):
        return [("", [self.weight.permute(2, 1, 0)] + ([self.bias] if self.bias is not None else []))]

    def apply(self, x):
        h = x.transpose(1, 2)
        k = self.weight.shape[-1]
        if self.padding == "causal":
            h = F.pad(h, ((k - 1) * self.dilation, 0))
        elif self.padding == "same":
            h = F.pad(h, same_padding(h.shape[-1], k, self.stride, self.dilation))
        y = F.conv1d(h, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return self.activation(y.transpose(1, 2))


class ConvND(_Single):
    """Conv2D / Conv3D (what sits beside ConvLSTM layers): channels last or first, Keras's
    (possibly asymmetric) "same" padding, strides, dilation, groups."""

    keeps_mask = False

    def __init__(self, kernel, bias, strides, padding, dilation, groups, activation, channels_last: bool):
        super().__init__()
        self.weight = kernel  # torch layout (out, in / groups, *k)
        self.bias = bias
        self.strides, self.padding, self.dilation, self.groups = strides, padding, dilation, groups
        self.activation, self.channels_last = activation, channels_last

    def keras_groups(self):
        rank = self.weight.dim() - 2
        kernel = self.weight.permute(*range(2, 2 + rank), 1, 0)  # (out, in, *k) -> (*k, in, out)
        return [("", [kernel] + ([self.bias] if self.bias is not None else []))]

    def apply(self, x):
        rank = self.weight.dim() - 2
        h = x.movedim(-1, 1) if self.channels_last else x
        if self.padding == "same":
            pads = []
            for d in reversed(range(rank)):  # F.pad: last dimension first
                pads += list(same_padding(h.shape[2 + d], self.weight.shape[2 + d], self.strides[d], self.dilation[d]))
            h = F.pad(h, pads)
        conv = F.conv2d if rank == 2 else F.conv3d
        y = conv(h, self.weight, self.bias, self.strides, 0, self.dilation, self.groups)
        y = self.activation(y.movedim(1, -1)) if self.channels_last else self.activation(y.movedim(1, -1)).movedim(-1, 1)
        return y


class Pooling1D(_Single):
    keeps_mask = False

    def __init__(self, average: bool, pool: int, stride: int, padding: str):
        super().__init__()
        self.average, self.pool, self.stride, self.padding = average, pool, stride, padding

    def apply(self, x):
        h = x.transpose(1, 2)
        if self.padding == "same":
            left, right = same_padding(h.shape[-1], self.pool, self.stride, 1)
            if self.average:  # Keras averages over the real elements of a padded window
                ones = torch.ones_like(h[:, :1])
                num = F.avg_pool1d(F.pad(h, (left, right)), self.pool, self.stride) * self.pool
                den = F.avg_pool1d(F.pad(ones, (left, right)), self.pool, self.stride) * self.pool
                return (num / den).transpose(1, 2)
            h = F.pad(h, (left, right), value=-math.inf)
        y = F.avg_pool1d(h, self.pool, self.stride) if self.average else F.max_pool1d(h, self.pool, self.stride)
        return y.transpose(1, 2)


class TimeDistributed(nn.Module):
    """Applies the inner module to every timestep: (B, T, ...) -> (B*T, ...) -> (B, T, ...)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.layer = inner

    def keras_groups(self):
        return [("/".join(p for p in ("layer", sub) if p), ws) for sub, ws in keras_groups(self.layer)]

    def forward(self, inputs, masks):
        x = inputs[0]
        b, t = x.shape[0], x.shape[1]
        (y,), _ = self.layer([x.reshape((b * t,) + tuple(x.shape[2:]))], [None])
        return [y.reshape((b, t) + tuple(y.shape[1:]))], [masks[0]]


class _SubWeights:
    """The weights of a wrapped layer, addressed below the wrapper (Keras 3 sub-path)."""

    def __init__(self, outer: LayerWeights, sub: str):
        self.outer, self.sub = outer, sub

    def take(self, groups, shapes=None):
        return self.outer.take([("/".join(p for p in (self.sub, s) if p), n) for s, n in groups], shapes)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
@builder("GlobalAveragePooling1D", "GlobalMaxPooling1D", "GlobalAvgPool1D", "GlobalMaxPool1D")
def build_global_pool(cfg, ctx):
    _channels_last(cfg, ctx)
    return GlobalPooling1D("Av" in ctx.spec.class_name, Values(cfg, ctx).bool("keepdims", False))


@builder("MaxPooling1D", "AveragePooling1D", "MaxPool1D", "AvgPool1D")
def build_pool(cfg, ctx):
    _channels_last(cfg, ctx)
    v = Values(cfg, ctx)
    pool = v.ints("pool_size", 2, hi=1 << 16)
    return Pooling1D("Av" in ctx.spec.class_name, pool, v.ints("strides", pool, hi=1 << 16),
                     v.str("padding", "valid", ("valid", "same")))


@builder("Conv1D", "Convolution1D")
def build_conv1d(cfg, ctx):
    _channels_last(cfg, ctx)
    v = Values(cfg, ctx)
    filters, size = v.int("filters", lo=1), v.ints("kernel_size", hi=1 << 16)
    groups, use_bias = v.int("groups", 1, lo=1), v.bool("use_bias", True)
    strides, dilation = v.ints("strides", 1, hi=1 << 16), v.ints("dilation_rate", 1, hi=1 << 16)
    padding = v.str("padding", "valid", ("valid", "same", "causal"))
    if filters % groups:
        raise ctx.error(f"Conv1D filters={filters} is not divisible by groups={groups}")
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    check_shapes(ctx, "Conv1D", w, [(size, "in", filters), (filters,)][: len(w)])
    kernel = torch.as_tensor(np.ascontiguousarray(w[0])).permute(2, 1, 0)  # (k, in/g, out) -> (out, in/g, k)
    return Conv1D(ctx.tensor(kernel.numpy()), ctx.tensor(w[1]) if use_bias else None, strides, padding, dilation,
                  groups, activation)


@builder("Conv2D", "Convolution2D", "Conv3D", "Convolution3D")
def build_convnd(cfg, ctx):
    rank = 2 if "2D" in ctx.spec.class_name else 3
    v = Values(cfg, ctx)
    filters = v.int("filters", lo=1)
    kernel_size, strides = int_tuple(v, "kernel_size", rank, None), int_tuple(v, "strides", rank, 1)
    dilation = int_tuple(v, "dilation_rate", rank, 1)
    groups, use_bias = v.int("groups", 1, lo=1), v.bool("use_bias", True)
    padding = v.str("padding", "valid", ("valid", "same"))
    data_format = v.str("data_format", "channels_last", ("channels_last", "channels_first"))
    if filters % groups:
        raise ctx.error(f"{ctx.spec.class_name} filters={filters} is not divisible by groups={groups}")
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    check_shapes(ctx, ctx.spec.class_name, w, [(*kernel_size, "in", filters), (filters,)][: len(w)])
    kernel = torch.as_tensor(np.array(w[0])).permute(rank + 1, rank, *range(rank))  # (*k, in, out) -> (out, in, *k)
    return ConvND(ctx.tensor(kernel.numpy()), ctx.tensor(w[1]) if use_bias else None, strides, padding, dilation,
                  groups, activation, data_format == "channels_last")


@builder("TimeDistributed")
def build_time_distributed(cfg, ctx):
    try:
        cls, inner_cfg = layer_config_of(cfg.get("layer"))
    except ValueError as e:
        raise ctx.error(f"TimeDistributed: {e}") from None
    if cls not in BUILDERS or cls in _RNN_CLASSES or cls == "Bidirectional":
        raise ctx.error(f"TimeDistributed({cls}) is not supported")
    if not isinstance(inner_cfg, dict):
        raise ctx.error("TimeDistributed: the wrapped layer's config is not a JSON object")
    inner_spec = LayerSpec(f"{ctx.spec.name}/{str(inner_cfg.get('name', cls))[:100]}", cls, inner_cfg, [])
    inner_ctx = BuildContext(ctx.path, ctx.keras_version, inner_spec, _SubWeights(ctx.weights, "layer"), ctx.dtype)
    return TimeDistributed(BUILDERS[cls](inner_cfg, inner_ctx))
