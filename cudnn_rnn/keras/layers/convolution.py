"""The convolution layers: Conv1D/2D/3D (valid, same and causal padding, strides, dilation,
groups), Conv1D/2D/3DTranspose (output_padding), DepthwiseConv1D/2D (depth_multiplier) and
SeparableConv1D/2D, in both data formats; one module (Convolution) and its builders.

Padding is Keras's: "same" pads (k - 1) * dilation + 1 - stride-aligned, the extra element after
(TensorFlow's rule); a transposed convolution's output is the window JAX computes, which Keras 3
uses on every backend (the full transposed convolution cropped, or zero-extended, on each side)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import torch
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


# ---------------------------------------------------------------------------------------------
# LocallyConnected1D / 2D (tf.keras 2 and Keras 2; Keras 3 has none)
# ---------------------------------------------------------------------------------------------
class LocallyConnected(_Single):
    """An unshared convolution: every output position its own kernel. `weight` is Keras's
    implementation=1 layout, (positions, patch, filters), the patch flattened as Keras slices
    it (channels_last: (*k, C); channels_first: (C, *k)); `pad` pads the input before (Keras's
    "same" of implementations 2 and 3 centres each window: k // 2 before, clipped at the borders,
    which zero padding and zero weights reproduce). The bias is Keras's (*out, filters), added
    as Keras adds it (channels_first: reshaped, not transposed, to (filters, *out))."""

    keeps_mask = False

    def __init__(self, weight, bias, kernel_size, strides, pad, activation, channels_last: bool):
        super().__init__()
        self.weight, self.bias, self.activation, self.channels_last = weight, bias, activation, channels_last
        self.kernel_size, self.strides, self.pad = tuple(kernel_size), tuple(strides), tuple(pad)

    def apply(self, x):
        rank = len(self.kernel_size)
        h = to_channels_first(x, self.channels_last)  # [B, C, *S]
        if any(self.pad):
            h = F.pad(h, [p for d in reversed(range(rank)) for p in self.pad[d]])
        for d in range(rank):
            h = h.unfold(2 + d, self.kernel_size[d], self.strides[d])  # -> [B, C, *O, *k]
        out = tuple(h.shape[2:2 + rank])
        if int(np.prod(out)) != self.weight.shape[0]:
            raise ValueError(f"LocallyConnected{rank}D: an input of shape {tuple(x.shape)} gives {out} output "
                             f"positions; the kernel has {self.weight.shape[0]}")
        k_axes = list(range(2 + rank, 2 + 2 * rank))
        order = [0, *range(2, 2 + rank)] + (k_axes + [1] if self.channels_last else [1] + k_axes)
        patches = h.permute(order).reshape(h.shape[0], self.weight.shape[0], -1)  # [B, P, patch]
        y = torch.einsum("bpj,pjf->bpf", patches, self.weight).reshape(h.shape[0], *out, -1)
        if self.channels_last:
            y = y if self.bias is None else y + self.bias
        else:
            y = y.permute(0, rank + 1, *range(1, rank + 1))
            y = y if self.bias is None else y + self.bias.reshape(1, self.bias.shape[-1], *self.bias.shape[:-1])
        return self.activation(y)


def _from_dense_kernel(kernel: np.ndarray, rank: int, k, strides, same: bool, last: bool):
    """Keras's implementation=2 kernel (channels_last (*S, C, *O, F); channels_first (C, *S, F,
    *O): a dense input-by-output matrix, read where Keras's mask keeps it) in the
    implementation=1 layout, and the padding that layout needs."""
    if last:
        S, C, O, Fo = kernel.shape[:rank], kernel.shape[rank], kernel.shape[rank + 1:2 * rank + 1], kernel.shape[-1]
    else:
        C, S, Fo, O = kernel.shape[0], kernel.shape[1:rank + 1], kernel.shape[rank + 1], kernel.shape[rank + 2:]
    before = [kd // 2 if same else 0 for kd in k]
    pad = [(b, max(0, (o - 1) * s + kd - n - b)) for b, o, s, kd, n in zip(before, O, strides, k, S)]
    o_idx = np.stack(np.meshgrid(*[np.arange(n) for n in O], indexing="ij"), -1).reshape(-1, rank)  # [P, r]
    j_idx = np.stack(np.meshgrid(*[np.arange(n) for n in k], indexing="ij"), -1).reshape(-1, rank)  # [K, r]
    pos = o_idx[:, None, :] * np.asarray(strides) - np.asarray(before) + j_idx[None]  # [P, K, r] input positions
    inside = np.all((pos >= 0) & (pos < np.asarray(S)), axis=-1)  # [P, K]
    pos = np.where(inside[..., None], pos, 0)
    flat_pos = np.ravel_multi_index(tuple(pos.reshape(-1, rank).T), S).reshape(pos.shape[:2])  # [P, K]
    flat_out = np.arange(o_idx.shape[0])
    n_s, n_o = int(np.prod(S)), int(np.prod(O))
    if last:  # rows: (s, c) -> s * C + c; columns: (o, f) -> o * F + f
        dense = kernel.reshape(n_s * C, n_o * Fo)
        rows = flat_pos[:, :, None] * C + np.arange(C)  # [P, K, C]
        w = dense[rows[..., None], flat_out[:, None, None, None] * Fo + np.arange(Fo)]  # [P, K, C, F]
        w = np.where(inside[:, :, None, None], w, 0).reshape(len(flat_out), -1, Fo)
    else:  # rows: (c, s) -> c * S + s; columns: (f, o) -> f * O + o
        dense = kernel.reshape(C * n_s, Fo * n_o)
        rows = np.arange(C)[None, :, None] * n_s + flat_pos[:, None, :]  # [P, C, K]
        w = dense[rows[..., None], np.arange(Fo) * n_o + flat_out[:, None, None, None]]  # [P, C, K, F]
        w = np.where(inside[:, None, :, None], w, 0).reshape(len(flat_out), -1, Fo)
    return w, pad


@builder("LocallyConnected1D", "LocallyConnected2D")
def build_locally_connected(cfg, ctx):
    rank = class_rank(ctx)
    v, k, strides, _, padding, activation, last = _common(cfg, ctx, rank)
    filters, use_bias = v.int("filters", lo=1), v.bool("use_bias", True)
    implementation = v.int("implementation", 1, lo=1, hi=3)
    if implementation == 3:
        raise ctx.error(f"{ctx.spec.class_name} implementation=3 (a sparse kernel, laid out by the input's shape, "
                        "which the layer's weights do not say) is not supported; implementations 1 and 2 are")
    if implementation == 1 and padding != "valid":
        raise ctx.error(f"{ctx.spec.class_name} implementation=1 takes padding='valid' only (Keras refuses "
                        f"{padding!r})")
    (w,) = ctx.weights.take([("", 1 + int(use_bias))])
    kernel = np.asarray(w[0])
    if implementation == 1:
        if kernel.ndim != 3 or kernel.shape[2] != filters or kernel.shape[1] % int(np.prod(k)):
            raise ctx.error(f"{ctx.spec.class_name} kernel has shape {kernel.shape}; implementation=1 implies "
                            f"(positions, {'x'.join(map(str, k))} x channels, {filters})")
        pad = [(0, 0)] * rank
    else:
        if kernel.ndim != 2 * rank + 2 or kernel.shape[-1 if last else rank + 1] != filters:
            raise ctx.error(f"{ctx.spec.class_name} kernel has shape {kernel.shape}; implementation=2 implies "
                            f"{2 * rank + 2} axes with {filters} filters")
        spatial = kernel.shape[:rank] if last else kernel.shape[1:rank + 1]
        if any(kd > n for kd, n in zip(k, spatial)):
            raise ctx.error(f"{ctx.spec.class_name} kernel_size {tuple(k)} is larger than the input {tuple(spatial)} "
                            "its implementation=2 kernel covers")
        kernel, pad = _from_dense_kernel(kernel, rank, k, strides, padding == "same", last)
    bias = None
    if use_bias:
        b = np.asarray(w[1])
        if b.ndim != rank + 1 or b.shape[-1] != filters or int(np.prod(b.shape[:-1])) != kernel.shape[0]:
            raise ctx.error(f"{ctx.spec.class_name} bias has shape {b.shape}; the kernel implies "
                            f"{kernel.shape[0]} positions x {filters} filters")
        bias = ctx.tensor(b)
    return LocallyConnected(ctx.tensor(kernel), bias, k, strides, pad, activation, last)
