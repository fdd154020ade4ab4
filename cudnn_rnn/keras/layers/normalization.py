"""The normalisation layers: BatchNormalization (its moving statistics), LayerNormalization,
GroupNormalization, RMSNormalization and UnitNormalization over any axes; their modules and their
builders."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .base import _Single
from .registry import builder
from .values import Values, check_shapes


def _axes(axes: Sequence[int], x: Tensor) -> list:
    out = sorted(a % x.dim() for a in axes)
    if 0 in out:
        raise ValueError(f"normalization over the batch axis (axis {list(axes)} of a {x.dim()}-D input)")
    return out


def _along(t: Optional[Tensor], axes: Sequence[int], x: Tensor,
           keras_axes: Sequence[int] = ()) -> Optional[Tensor]:
    """A weight of the input's sizes on `axes` shaped to broadcast against x. keras_axes: the
    layer's axis list as Keras sorted it (LayerNormalization: numerically, negative axes first),
    whose order gives the weight's shape; Keras reshapes such a weight onto the axes' positions,
    its values in that order, and so does this."""
    if t is None:
        return None
    want = tuple(x.shape[a] for a in axes)
    keras_shape = tuple(x.shape[a % x.dim()] for a in sorted(keras_axes))
    # exact shapes only: a (1,) weight would broadcast silently
    if tuple(t.shape) != want and not (keras_axes and tuple(t.shape) == keras_shape):
        raise ValueError(f"normalization weights have shape {tuple(t.shape)}; the input has {want} on axes {list(axes)}")
    shape = [1] * x.dim()
    for a in axes:
        shape[a] = x.shape[a]
    return t.reshape(shape)


class Normalization(_Single):
    """BatchNormalization (the moving statistics, as Keras at inference) and LayerNormalization
    (mean and variance over `axes` of each sample; rms_scaling: the deprecated variance-only form)."""

    def __init__(self, kind, gamma, beta, mean, var, epsilon, axes, rms_scaling=False):
        super().__init__()
        self.kind, self.epsilon, self.axes, self.rms_scaling = kind, epsilon, tuple(axes), rms_scaling
        self.gamma, self.beta = gamma, beta
        self.register_buffer("moving_mean", mean)
        self.register_buffer("moving_variance", var)

    def keras_groups(self):
        own = [t for t in (self.gamma, self.beta) if t is not None]
        if self.kind == "batch":
            own += [self.moving_mean, self.moving_variance]
        return [("", own)]

    def apply(self, x):
        axes = _axes(self.axes, x)
        if self.kind == "batch":
            y = (x - _along(self.moving_mean, axes, x)) * torch.rsqrt(_along(self.moving_variance, axes, x) + self.epsilon)
        else:
            y = self._layer_norm(x, axes)
            if y.is_floating_point():
                return y
            # an integer input: Keras's result in its dtype (truncated), cast to the compute dtype
            return y.to(next((t.dtype for t in (self.gamma, self.beta) if t is not None), torch.float32))
        if self.gamma is not None:
            y = y * _along(self.gamma, axes, x)
        if self.beta is not None:
            y = y + _along(self.beta, axes, x)
        return y

    def _layer_norm(self, x: Tensor, axes: list) -> Tensor:
        """Keras 3's own computation (keras.ops.layer_normalization on the torch backend), in
        float32 whatever the input's dtype (Keras computes float16, bfloat16 and float64 there in
        float32 and casts back): F.layer_norm where Keras's axis list is consecutive and names the
        trailing axes, else the moments with the variance as E[x^2] - E[x]^2. Samples whose
        statistics overflow then come out as Keras's do (NaN where E[x]^2 overflows). (For a
        consecutive list of other axes Keras's torch backend hands F.layer_norm the wrong ones;
        these are normalised over the axes named, as Keras's other backends do.)"""
        raw = sorted(self.axes)
        step = raw[1] - raw[0] if len(raw) > 1 else 1
        consecutive = step in (1, -1) and all(b - a == step for a, b in zip(raw, raw[1:]))
        xf = x.float()
        gamma = None if self.gamma is None else _along(self.gamma, axes, x, self.axes).float()
        beta = None if self.beta is None else _along(self.beta, axes, x, self.axes).float()
        if self.rms_scaling:
            y = xf * torch.rsqrt(xf.var(dim=axes, keepdim=True, unbiased=False) + self.epsilon)
            y = y if gamma is None else y * gamma
            y = y if beta is None else y + beta
        elif consecutive and axes == list(range(x.dim() - len(axes), x.dim())):
            shape = tuple(x.shape[a] for a in axes)
            y = F.layer_norm(xf, shape, None if gamma is None else gamma.reshape(shape),
                             None if beta is None else beta.reshape(shape), self.epsilon)
        else:
            mean = xf.mean(dim=axes, keepdim=True)
            inv = torch.rsqrt((xf * xf).mean(dim=axes, keepdim=True) - mean * mean + self.epsilon)
            inv = inv if gamma is None else inv * gamma
            res = -mean * inv
            y = xf * inv + (res if beta is None else res + beta)
        return y.to(x.dtype)


class GroupNormalization(_Single):
    """Mean and variance over each group of `groups` channel groups (and every other non-batch
    axis), then the per-channel gamma and beta."""

    def __init__(self, groups: int, axis: int, epsilon: float, gamma, beta):
        super().__init__()
        self.groups, self.axis, self.epsilon, self.gamma, self.beta = groups, axis, epsilon, gamma, beta

    def keras_groups(self):
        return [("", [t for t in (self.gamma, self.beta) if t is not None])]

    def apply(self, x):
        axis = self.axis % x.dim()
        channels = x.shape[axis]
        groups = channels if self.groups == -1 else self.groups
        if axis == 0 or channels % groups:
            raise ValueError(f"GroupNormalization: {channels} channels on axis {axis} do not split into {groups} groups")
        shape = list(x.shape)
        shape[axis:axis + 1] = [groups, channels // groups]
        g = x.reshape(shape)
        reduce = [d for d in range(1, g.dim()) if d != axis]
        mean = g.mean(dim=reduce, keepdim=True)
        var = g.var(dim=reduce, keepdim=True, unbiased=False)
        y = ((g - mean) * torch.rsqrt(var + self.epsilon)).reshape(x.shape)
        if self.gamma is not None:
            y = y * _along(self.gamma, [axis], x)
        if self.beta is not None:
            y = y + _along(self.beta, [axis], x)
        return y


class RMSNormalization(_Single):
    keeps_mask = False

    def __init__(self, axes, epsilon: float, scale):
        super().__init__()
        self.axes, self.epsilon, self.scale = tuple(axes), epsilon, scale

    def keras_groups(self):
        return [("", [self.scale])]

    def apply(self, x):
        axes = _axes(self.axes, x)
        return x * torch.rsqrt((x * x).mean(dim=axes, keepdim=True) + self.epsilon) * _along(self.scale, axes, x)


class UnitNormalization(_Single):
    """x / max(||x||, 1e-12) (Keras 3: keras.ops.normalize(order=2, epsilon=1e-12)), or
    x / sqrt(max(||x||^2, 1e-12)) (tf.keras 2: tf.math.l2_normalize), which differ for a norm
    below 1e-6."""

    def __init__(self, axes, keras3: bool = True):
        super().__init__()
        self.axes, self.keras3 = tuple(axes), keras3

    def apply(self, x):
        squares = (x * x).sum(dim=_axes(self.axes, x), keepdim=True)
        if self.keras3:
            return x * torch.clamp(torch.rsqrt(squares), max=1e12)
        return x * torch.rsqrt(torch.clamp(squares, min=1e-12))


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
def _scale_center(cfg, ctx, statistics: int, axes: list):
    """gamma / beta (when scale / center) and `statistics` more vectors, all of the input's
    sizes on `axes`, as tensors."""
    v = Values(cfg, ctx)
    scale, center = v.bool("scale", True), v.bool("center", True)
    (w,) = ctx.weights.take([("", int(scale) + int(center) + statistics)])
    check_shapes(ctx, ctx.spec.class_name, w, [tuple(f"d{i}" for i in range(len(axes)))] * len(w))
    w = list(w)
    gamma = ctx.tensor(w.pop(0)) if scale else None
    beta = ctx.tensor(w.pop(0)) if center else None
    return gamma, beta, [torch.as_tensor(a, dtype=ctx.dtype) for a in w]


@builder("BatchNormalization", "SyncBatchNormalization")  # (tf.keras 2 experimental: the same at inference)
def build_batchnorm(cfg, ctx):
    axes = Values(cfg, ctx).axes()
    if len(axes) != 1:
        raise ctx.error(f"BatchNormalization over {len(axes)} axes is not supported (one axis)")
    epsilon = Values(cfg, ctx).float("epsilon", 1e-3, 0.0, 1.0)
    # tf.keras 2's renorm=True adds moving_stddev, renorm_mean and renorm_stddev, which serve its
    # training: at inference it normalizes by the moving mean and variance alone
    renorm = Values(cfg, ctx).bool("renorm", False)
    gamma, beta, (mean, var, *_) = _scale_center(cfg, ctx, 5 if renorm else 2, axes)
    return Normalization("batch", gamma, beta, mean, var, epsilon, axes)


def _scaled_or_centered(cfg) -> bool:
    return cfg.get("scale", True) is not False or cfg.get("center", True) is not False or bool(cfg.get("rms_scaling"))


@builder("LayerNormalization", weights=_scaled_or_centered)
def build_layernorm(cfg, ctx):
    axes = Values(cfg, ctx).axes()
    v = Values(cfg, ctx)
    epsilon, rms = v.float("epsilon", 1e-3, 0.0, 1.0), v.bool("rms_scaling", False)
    if rms:  # gamma only
        cfg = dict(cfg, scale=True, center=False)
    gamma, beta, _ = _scale_center(cfg, ctx, 0, axes)
    return Normalization("layer", gamma, beta, None, None, epsilon, axes, rms)


@builder("GroupNormalization", weights=_scaled_or_centered)
def build_group_normalization(cfg, ctx):
    v = Values(cfg, ctx)
    groups = v.int("groups", 32, lo=-1)
    if groups == 0:
        raise ctx.error("config groups=0; expected a positive number or -1")
    axes = Values(cfg, ctx).axes()
    if len(axes) != 1:
        raise ctx.error("GroupNormalization takes one axis")
    gamma, beta, _ = _scale_center(cfg, ctx, 0, axes)
    return GroupNormalization(groups, axes[0], v.float("epsilon", 1e-3, 0.0, 1.0), gamma, beta)


@builder("RMSNormalization")
def build_rms_normalization(cfg, ctx):
    axes = Values(cfg, ctx).axes()
    (w,) = ctx.weights.take([("", 1)])
    check_shapes(ctx, "RMSNormalization", w, [tuple(f"d{i}" for i in range(len(axes)))])
    return RMSNormalization(axes, Values(cfg, ctx).float("epsilon", 1e-6, 0.0, 1.0), ctx.tensor(w[0]))


@builder("UnitNormalization", weights=False)
def build_unit_normalization(cfg, ctx):
    return UnitNormalization(Values(cfg, ctx).axes(), keras3=ctx.keras_major >= 3)
