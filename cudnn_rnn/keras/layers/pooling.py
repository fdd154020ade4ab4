"""The pooling layers: MaxPooling / AveragePooling 1D-3D (valid and same padding, strides, both
data formats), GlobalMaxPooling / GlobalAveragePooling 1D-3D (keepdims; the 1-D average reads the
mask) and AdaptiveMaxPooling / AdaptiveAveragePooling 1D-3D; their modules and their builders.

"same" pooling follows TensorFlow's and JAX's definition of Keras's pooling: a window that hangs
over the edge reduces over its real elements only (max ignores the padding, the average divides by
the count of real elements). Keras 3.15's torch backend differs where its "same" padding is
uneven: it pads by repeating the edge element, so its average counts that element again."""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...conv_lstm import any_padding, same_padding
from .base import _Single, channels_last_format, class_rank, from_channels_first, to_channels_first
from .registry import builder
from .values import Values, int_tuple


def _max_pool1d(h, pool, strides):
    """F.max_pool1d as a max_pool2d over a unit row: torch.export (2.14) makes max_pool1d's input
    length a constant (the example's), max_pool2d's it keeps dynamic. The same maxima."""
    return F.max_pool2d(h.unsqueeze(-2), (1, pool[0]), (1, strides[0])).squeeze(-2)


_MAX = {1: _max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_ADAPTIVE_MAX = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}
_ADAPTIVE_AVG = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


class Pooling(_Single):
    keeps_mask = False

    def __init__(self, average: bool, pool: Sequence[int], strides: Sequence[int], padding: str, channels_last: bool):
        super().__init__()
        self.average, self.pool, self.strides = average, tuple(pool), tuple(strides)
        self.padding, self.channels_last = padding, channels_last

    def apply(self, x):
        rank = len(self.pool)
        h = to_channels_first(x, self.channels_last)
        if self.padding == "same":
            pads = []  # F.pad: the last axis first
            for d in reversed(range(rank)):
                pads += list(same_padding(h.shape[2 + d], self.pool[d], self.strides[d], 1))
            if any_padding(pads):
                if self.average:  # sum of the real elements / their count
                    ones = torch.ones_like(h[:, :1])
                    num, den = self._sum(F.pad(h, pads)), self._sum(F.pad(ones, pads))
                    return from_channels_first(num / den, self.channels_last)
                h = F.pad(h, pads, value=-math.inf)
        y = _AVG[rank](h, self.pool, self.strides) if self.average else _MAX[rank](h, self.pool, self.strides)
        return from_channels_first(y, self.channels_last)


    def _sum(self, h):
        """Window sums (avg_pool1d has no divisor_override)."""
        if len(self.pool) == 1:
            return F.avg_pool1d(h, self.pool, self.strides) * self.pool[0]
        return _AVG[len(self.pool)](h, self.pool, self.strides, divisor_override=1)


class GlobalPooling(nn.Module):
    """The mean or max over every spatial axis; the 1-D mean over the real steps of a mask.
    Keras 3 selects the real steps; tf.keras 2 multiplies by the mask (multiply_mask), so a NaN or
    an infinity at a masked step makes the mean NaN there."""

    def __init__(self, average: bool, rank: int, keepdims: bool, channels_last: bool, multiply_mask: bool = False):
        super().__init__()
        self.average, self.rank, self.keepdims, self.channels_last = average, rank, keepdims, channels_last
        self.multiply_mask = multiply_mask

    def forward(self, inputs, masks):
        x, mask = inputs[0], masks[0]
        axes = list(range(1, 1 + self.rank)) if self.channels_last else list(range(2, 2 + self.rank))
        if not self.average:
            return [x.amax(dim=axes, keepdim=self.keepdims)], [None]
        if mask is None or self.rank != 1:
            return [x.mean(dim=axes, keepdim=self.keepdims)], [None]
        m = mask.bool().unsqueeze(2 if self.channels_last else 1)
        kept = x * m.to(x.dtype) if self.multiply_mask else torch.where(m, x, torch.zeros_like(x))
        total = kept.sum(dim=axes, keepdim=self.keepdims)
        return [total / m.to(x.dtype).sum(dim=axes, keepdim=self.keepdims)], [None]


class AdaptivePooling(_Single):
    keeps_mask = False

    def __init__(self, average: bool, output_size: Sequence[int], channels_last: bool):
        super().__init__()
        self.average, self.output_size, self.channels_last = average, tuple(output_size), channels_last

    def apply(self, x):
        rank = len(self.output_size)
        h = to_channels_first(x, self.channels_last)
        if torch.compiler.is_exporting():
            for d, n in enumerate(self.output_size):
                h = _adaptive_along(h, 2 + d, n, self.average)
            return from_channels_first(h, self.channels_last)
        size = self.output_size[0] if rank == 1 else self.output_size
        fn = _ADAPTIVE_AVG[rank] if self.average else _ADAPTIVE_MAX[rank]
        return from_channels_first(fn(h, size), self.channels_last)


def _adaptive_along(h, axis: int, n: int, average: bool):
    """Adaptive pooling of one axis to n windows, window i over [floor(i L / n), ceil((i + 1) L / n))
    as torch's and Keras's adaptive pooling take them, from a [n, L] window mask: what exports
    (torch.export and the ONNX exporter fix the windows of F.adaptive_*_pool to the example's
    length; ONNX then computes wrong values, or fails, at other lengths). Boxes are products of
    intervals, so pooling axis by axis pools the box."""
    length = h.shape[axis]
    steps = torch.arange(length, device=h.device)
    windows = torch.arange(n, device=h.device)
    start = (windows * length) // n
    end = ((windows + 1) * length + n - 1) // n
    inside = (steps[None, :] >= start[:, None]) & (steps[None, :] < end[:, None])  # [n, L]
    x = h.movedim(axis, -1).unsqueeze(-2)  # [..., 1, L]
    if average:
        y = torch.where(inside, x, torch.zeros((), dtype=h.dtype, device=h.device)).sum(-1) / (end - start).to(h.dtype)
    else:
        y = torch.where(inside, x, torch.full((), -math.inf, dtype=h.dtype, device=h.device)).amax(-1)
    return y.movedim(-1, axis)


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
_POOLS = [f"{kind}{pool}{rank}D" for kind in ("Max", "Average", "Avg") for pool in ("Pooling", "Pool") for rank in (1, 2, 3)
          if not (kind == "Average" and pool == "Pool") and not (kind == "Avg" and pool == "Pooling")]
_GLOBAL = [f"Global{kind}{pool}{rank}D" for kind, pool in (("Max", "Pooling"), ("Max", "Pool"), ("Average", "Pooling"),
                                                          ("Avg", "Pool")) for rank in (1, 2, 3)]
_ADAPTIVE = [f"Adaptive{kind}Pooling{rank}D" for kind in ("Max", "Average") for rank in (1, 2, 3)]



@builder(*_POOLS, weights=False)
def build_pool(cfg, ctx):
    rank, v = class_rank(ctx), Values(cfg, ctx)
    pool = int_tuple(v, "pool_size", rank, 2)
    strides = int_tuple(v, "strides", rank, list(pool))
    padding = v.str("padding", "valid", ("valid", "same"))
    return Pooling("Av" in ctx.spec.class_name, pool, strides, padding, channels_last_format(cfg, ctx))


@builder(*_GLOBAL, weights=False)
def build_global_pool(cfg, ctx):
    return GlobalPooling("Av" in ctx.spec.class_name, class_rank(ctx), Values(cfg, ctx).bool("keepdims", False),
                         channels_last_format(cfg, ctx), multiply_mask=ctx.keras_major < 3)


@builder(*_ADAPTIVE, weights=False)
def build_adaptive_pool(cfg, ctx):
    rank = class_rank(ctx)
    return AdaptivePooling("Average" in ctx.spec.class_name, int_tuple(Values(cfg, ctx), "output_size", rank, None),
                           channels_last_format(cfg, ctx))
