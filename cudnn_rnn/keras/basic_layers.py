"""The layers that work on one vector at a time or pass tensors through: InputLayer, Dense,
Activation, ReLU, Softmax, Embedding, Masking, Flatten, Reshape, Permute, RepeatVector, the
dropout-likes (identity at inference), the merges (Concatenate, Add, ...) and
Batch/LayerNormalization; their modules and their builders. _Single (one input, one output) and
_channels_last are shared with sequence_layers.py."""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .activations import _Activation, activation_name
from .registry import builder
from .values import MAX_SIZE, Values, check_shapes


class _Single(nn.Module):
    """One input, one output; the mask passes through (Keras supports_masking) or is dropped."""

    keeps_mask = True

    def forward(self, inputs: List[Tensor], masks: List[Optional[Tensor]]):
        return [self.apply(inputs[0])], [masks[0] if self.keeps_mask else None]


class Identity(_Single):
    def apply(self, x):
        return x


class Dropout(_Single):
    """Dropout / SpatialDropout1D: identity at inference, Keras's rate in training."""

    def __init__(self, rate: float, spatial: bool):
        super().__init__()
        self.rate, self.spatial = rate, spatial

    def apply(self, x):
        if not self.training or self.rate <= 0.0:
            return x
        if self.spatial:  # one decision per (sample, channel), shared over time
            keep = (torch.rand(x.shape[0], 1, x.shape[-1], device=x.device) >= self.rate).to(x.dtype)
            return x * keep / (1.0 - self.rate)
        return F.dropout(x, self.rate, True)


class Dense(_Single):
    def __init__(self, kernel, bias, activation: _Activation):
        super().__init__()
        self.kernel = kernel
        self.bias = bias
        self.activation = activation

    def keras_groups(self):
        return [("", [self.kernel] + ([self.bias] if self.bias is not None else []))]

    def apply(self, x):
        y = torch.matmul(x, self.kernel)
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)


class ActivationLayer(_Single):
    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def apply(self, x):
        return self.activation(x)


class Embedding(nn.Module):
    def __init__(self, weight, mask_zero: bool):
        super().__init__()
        self.embeddings = weight
        self.mask_zero = mask_zero

    def keras_groups(self):
        return [("", [self.embeddings])]

    def forward(self, inputs, masks):
        ids = inputs[0].long()
        return [F.embedding(ids, self.embeddings)], [ids != 0 if self.mask_zero else None]


class Masking(nn.Module):
    def __init__(self, mask_value: float):
        super().__init__()
        self.mask_value = mask_value

    def forward(self, inputs, masks):
        x = inputs[0]
        mask = (x != self.mask_value).any(dim=-1)
        return [x * mask.unsqueeze(-1).to(x.dtype)], [mask]


# Reshape, Flatten, Permute and RepeatVector look alike on purpose: each is the smallest form of
# the call protocol (a stored argument and one tensor method in apply); a shared base taking the
# method would save a few lines and hide what each one does.
class Reshape(_Single):
    keeps_mask = False

    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(shape)

    def apply(self, x):
        return x.reshape((x.shape[0],) + self.shape)


class Flatten(_Single):
    keeps_mask = False

    def apply(self, x):
        return x.reshape(x.shape[0], -1)


class Permute(_Single):
    keeps_mask = False

    def __init__(self, dims):
        super().__init__()
        self.dims = (0,) + tuple(int(d) for d in dims)

    def apply(self, x):
        return x.permute(self.dims)


class RepeatVector(_Single):
    keeps_mask = False

    def __init__(self, n):
        super().__init__()
        self.n = int(n)

    def apply(self, x):
        return x.unsqueeze(1).expand(x.shape[0], self.n, x.shape[1])


class Normalization(_Single):
    """BatchNormalization (inference statistics) and LayerNormalization over the last axis."""

    def __init__(self, kind, gamma, beta, mean, var, epsilon, axes):
        super().__init__()
        self.kind, self.epsilon, self.axes = kind, epsilon, axes
        self.gamma, self.beta = gamma, beta
        self.register_buffer("moving_mean", mean)
        self.register_buffer("moving_variance", var)

    def keras_groups(self):
        own = [t for t in (self.gamma, self.beta) if t is not None]
        if self.kind == "batch":
            own += [self.moving_mean, self.moving_variance]
        return [("", own)]

    def apply(self, x):
        width = next((t.shape[-1] for t in (self.gamma, self.beta, self.moving_mean) if t is not None), x.shape[-1])
        if width != x.shape[-1]:  # a (1,) weight would broadcast silently
            raise ValueError(f"{self.kind} normalization weights have {width} features; the input has {x.shape[-1]}")
        if self.kind == "batch":
            y = (x - self.moving_mean) * torch.rsqrt(self.moving_variance + self.epsilon)
        else:
            mean = x.mean(dim=self.axes, keepdim=True)
            var = x.var(dim=self.axes, keepdim=True, unbiased=False)
            y = (x - mean) * torch.rsqrt(var + self.epsilon)
        if self.gamma is not None:
            y = y * self.gamma
        if self.beta is not None:
            y = y + self.beta
        return y


class Merge(nn.Module):
    """Concatenate / Add / Subtract / Multiply / Average / Maximum / Minimum.

    Output masks follow the producer: Keras 3 ORs the masks (elementwise merges give None when
    any input has none; Concatenate counts a missing mask as all True); Keras 2 ANDs the masks
    that are present."""

    def __init__(self, op: str, axis: int = -1, keras3: bool = True):
        super().__init__()
        self.op, self.axis, self.keras3 = op, axis, keras3

    def forward(self, inputs, masks):
        if self.op == "concatenate":
            y = torch.cat(inputs, dim=self.axis)
        elif self.op == "add":
            y = inputs[0]
            for t in inputs[1:]:
                y = y + t
        elif self.op == "subtract":
            y = inputs[0] - inputs[1]
        elif self.op == "multiply":
            y = inputs[0]
            for t in inputs[1:]:
                y = y * t
        elif self.op == "average":
            y = torch.stack(inputs).mean(0)
        elif self.op == "maximum":
            y = torch.stack(inputs).amax(0)
        else:
            y = torch.stack(inputs).amin(0)
        return [y], [self._mask(inputs, masks)]

    def _mask(self, inputs, masks):
        present = [m for m in masks if m is not None]
        if not present:
            return None
        if not self.keras3:
            mask = present[0]
            for m in present[1:]:
                mask = mask & m
            return mask
        if self.op != "concatenate":
            if len(present) != len(masks):
                return None
            mask = present[0]
            for m in present[1:]:
                mask = mask | m
            return mask
        full = [m if m is not None else torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
                for x, m in zip(inputs, masks)]
        mask = full[0]
        for m in full[1:]:
            mask = mask | m
        return mask


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
@builder("InputLayer")
def build_input(cfg, ctx):
    return Identity()


@builder("Dropout", "SpatialDropout1D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization")
def build_dropout(cfg, ctx):
    rate = Values(cfg, ctx).float("rate", 0.0, 0.0, 1.0) if ctx.spec.class_name in ("Dropout", "SpatialDropout1D") else 0.0
    return Dropout(min(rate, 1.0 - 1e-7), spatial=ctx.spec.class_name == "SpatialDropout1D")


@builder("Dense")
def build_dense(cfg, ctx):
    v = Values(cfg, ctx)
    units, use_bias = v.int("units", lo=1), v.bool("use_bias", True)
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    check_shapes(ctx, "Dense", w, [("in", units), (units,)][: len(w)])
    return Dense(ctx.tensor(w[0]), ctx.tensor(w[1]) if use_bias else None, activation)


@builder("Activation")
def build_activation(cfg, ctx):
    return ActivationLayer(_Activation(activation_name(cfg.get("activation"), ctx), ctx))


@builder("ReLU")
def build_relu(cfg, ctx):
    v = Values(cfg, ctx)
    max_value = v.float("max_value", None)
    if max_value not in (None, 6.0) or v.float("negative_slope", 0.0) or v.float("threshold", 0.0):
        raise ctx.error("ReLU with negative_slope / threshold / max_value other than 6 is not supported")
    return ActivationLayer(_Activation("relu6" if max_value else "relu", ctx))


@builder("Softmax")
def build_softmax(cfg, ctx):
    if Values(cfg, ctx).int("axis", -1, lo=-8, hi=8) != -1:
        raise ctx.error("Softmax over an axis other than the last is not supported")
    return ActivationLayer(_Activation("softmax", ctx))


@builder("Embedding")
def build_embedding(cfg, ctx):
    v = Values(cfg, ctx)
    shape = (v.int("input_dim", lo=1), v.int("output_dim", lo=1))
    mask_zero = v.bool("mask_zero", False)
    (w,) = ctx.weights.take([("", 1)], [[shape]])
    return Embedding(ctx.tensor(w[0]), mask_zero)


@builder("Masking")
def build_masking(cfg, ctx):
    return Masking(Values(cfg, ctx).float("mask_value", 0.0))


@builder("Flatten")
def build_flatten(cfg, ctx):
    _channels_last(cfg, ctx)
    return Flatten()


@builder("Reshape")
def build_reshape(cfg, ctx):
    shape = Values(cfg, ctx).int_list("target_shape", lo=-1, hi=MAX_SIZE)
    if shape.count(-1) > 1 or 0 in shape:
        raise ctx.error(f"Reshape target_shape {shape} is not a shape")
    return Reshape(shape)


@builder("Permute")
def build_permute(cfg, ctx):
    dims = Values(cfg, ctx).int_list("dims", lo=1, hi=8)
    if sorted(dims) != list(range(1, len(dims) + 1)):
        raise ctx.error(f"Permute dims {dims} is not a permutation of 1..{len(dims)}")
    return Permute(dims)


@builder("RepeatVector")
def build_repeat(cfg, ctx):
    return RepeatVector(Values(cfg, ctx).int("n", lo=1, hi=1 << 16))


def _channels_last(cfg, ctx):
    if cfg.get("data_format", "channels_last") not in ("channels_last", None):
        raise ctx.error(f"data_format={str(cfg.get('data_format'))[:40]!r} is not supported (channels_last only)")


def _last_axis(cfg, ctx, what):
    axis = cfg.get("axis", -1)
    if isinstance(axis, list) and len(axis) == 1:
        axis = axis[0]
    if isinstance(axis, bool) or axis not in (-1, 2):
        raise ctx.error(f"{what} axis={str(axis)[:40]} is not supported (last axis only)")


def _normalization(cfg, ctx, kind: str, statistics: int):
    """The shared part of BatchNormalization / LayerNormalization: last axis only, optional
    gamma and beta, then `statistics` more vectors (moving mean and variance), all (features,)."""
    what = ctx.spec.class_name
    _last_axis(cfg, ctx, what)
    v = Values(cfg, ctx)
    scale, center = v.bool("scale", True), v.bool("center", True)
    epsilon = v.float("epsilon", 1e-3, 0.0, 1.0)
    if v.bool("rms_scaling", False):
        raise ctx.error(f"{what} rms_scaling=True is not supported")
    (w,) = ctx.weights.take([("", int(scale) + int(center) + statistics)])
    check_shapes(ctx, what, w, [("features",)] * len(w))
    w = list(w)
    gamma = ctx.tensor(w.pop(0)) if scale else None
    beta = ctx.tensor(w.pop(0)) if center else None
    mean, var = (torch.as_tensor(a, dtype=ctx.dtype) for a in w) if statistics else (None, None)
    return Normalization(kind, gamma, beta, mean, var, epsilon, None if statistics else (-1,))


@builder("BatchNormalization")
def build_batchnorm(cfg, ctx):
    return _normalization(cfg, ctx, "batch", 2)


@builder("LayerNormalization")
def build_layernorm(cfg, ctx):
    return _normalization(cfg, ctx, "layer", 0)


_MERGES = {"Concatenate": "concatenate", "Add": "add", "Subtract": "subtract", "Multiply": "multiply",
           "Average": "average", "Maximum": "maximum", "Minimum": "minimum"}


@builder(*_MERGES)
def build_merge(cfg, ctx):
    axis = Values(cfg, ctx).int("axis", -1, lo=-8, hi=8) if ctx.spec.class_name == "Concatenate" else -1
    return Merge(_MERGES[ctx.spec.class_name], axis, keras3=ctx.keras_major >= 3)
