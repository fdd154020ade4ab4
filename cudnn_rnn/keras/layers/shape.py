"""The shape layers: Flatten, Reshape, Permute, RepeatVector, Cropping1D/2D/3D, ZeroPadding1D/2D/3D,
UpSampling1D/2D/3D (nearest; bilinear and bicubic for 2-D); their modules and their builders.

Bicubic is Keras's on the torch backend (torch's cubic convolution, a = -0.75); TensorFlow's
resize uses a = -0.5, so a model run by Keras on TensorFlow differs there. The Lanczos filters
are refused, as Keras's torch backend refuses them."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
import torch.nn.functional as F

from .base import _Single, channels_last_format, class_rank, from_channels_first, to_channels_first
from .registry import builder
from .values import MAX_SIZE, Values


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

    def __init__(self, channels_last: bool):
        super().__init__()
        self.channels_last = channels_last

    def apply(self, x):
        if not self.channels_last and x.dim() > 2:  # Keras flattens in channels_last order
            x = x.movedim(1, -1)
        return x.reshape(x.shape[0], -1)


class Permute(_Single):
    keeps_mask = False

    def __init__(self, dims):
        super().__init__()
        self.dims = (0,) + tuple(int(d) for d in dims)

    def apply(self, x):
        # (contiguous: an elementwise op on the transposed view makes torch.export compare
        # strides over a free length, a guard it cannot prove)
        return x.permute(self.dims).contiguous()


class RepeatVector(_Single):
    keeps_mask = False

    def __init__(self, n):
        super().__init__()
        self.n = int(n)

    def apply(self, x):
        return x.unsqueeze(1).expand(x.shape[0], self.n, x.shape[1])


@builder("Flatten", weights=False)
def build_flatten(cfg, ctx):
    return Flatten(channels_last_format(cfg, ctx))


@builder("Reshape", weights=False)
def build_reshape(cfg, ctx):
    shape = Values(cfg, ctx).int_list("target_shape", lo=-1, hi=MAX_SIZE)
    if shape.count(-1) > 1 or 0 in shape:
        raise ctx.error(f"Reshape target_shape {shape} is not a shape")
    return Reshape(shape)


@builder("Permute", weights=False)
def build_permute(cfg, ctx):
    dims = Values(cfg, ctx).int_list("dims", lo=1, hi=8)
    if sorted(dims) != list(range(1, len(dims) + 1)):
        raise ctx.error(f"Permute dims {dims} is not a permutation of 1..{len(dims)}")
    return Permute(dims)


@builder("RepeatVector", weights=False)
def build_repeat(cfg, ctx):
    return RepeatVector(Values(cfg, ctx).int("n", lo=1, hi=1 << 16))


class Crop(_Single):
    """Cropping1D/2D/3D and ZeroPadding1D/2D/3D: (before, after) per spatial axis, negative to
    crop; the spatial axes follow the batch axis (channels_last) or the channel axis."""

    keeps_mask = False

    def __init__(self, pairs: Sequence[Tuple[int, int]], channels_last: bool, sign: int):
        super().__init__()
        self.pairs, self.channels_last, self.sign = tuple(pairs), channels_last, sign

    def apply(self, x):
        first = 1 if self.channels_last else 2
        if self.sign > 0:
            pads = []  # F.pad: the last axis first; channels_last inputs have the channel axis last
            if self.channels_last:
                pads += [0, 0]
            for before, after in reversed(self.pairs):
                pads += [before, after]
            return F.pad(x, pads)
        for d, (before, after) in enumerate(self.pairs):
            size = x.shape[first + d]
            if before + after >= size:
                raise ValueError(f"cropping {before} + {after} leaves nothing of an axis of {size}")
            x = x.narrow(first + d, before, size - before - after)
        return x


class UpSampling(_Single):
    keeps_mask = False

    def __init__(self, sizes: Sequence[int], channels_last: bool, interpolation: str):
        super().__init__()
        self.sizes, self.channels_last, self.interpolation = tuple(sizes), channels_last, interpolation

    def apply(self, x):
        if self.interpolation == "nearest":
            first = 1 if self.channels_last else 2
            for d, n in enumerate(self.sizes):
                x = torch.repeat_interleave(x, n, dim=first + d)
            return x
        # bilinear / bicubic: half-pixel resizes without antialiasing (torch's align_corners=False)
        h = to_channels_first(x, self.channels_last)
        size = [s * n for s, n in zip(h.shape[2:], self.sizes)]
        y = F.interpolate(h, size=size, mode=self.interpolation, align_corners=False, antialias=False)
        return from_channels_first(y, self.channels_last)


def _pairs(cfg, ctx, key: str, rank: int, default) -> Tuple[Tuple[int, int], ...]:
    """Keras's cropping / padding argument: an integer (every side), `rank` integers (both sides
    of each axis) or `rank` (before, after) pairs; a 1-D layer's pair is its one axis."""
    value = cfg.get(key, default)
    value = default if value is None else value
    bad = ctx.error(f"config {key}={str(value)[:60]!r}; expected an integer, {rank} of them or {rank} pairs")
    if rank == 1 and isinstance(value, list) and len(value) == 2 and not isinstance(value[0], list):
        value = [value]
    if not isinstance(value, list):
        value = [value] * rank
    if len(value) != rank:
        raise bad
    out = []
    for entry in value:
        pair = entry if isinstance(entry, list) else [entry, entry]
        if len(pair) != 2:
            raise bad
        out.append(tuple(Values({key: p}, ctx).int(key, lo=0, hi=1 << 16) for p in pair))
    return tuple(out)



@builder("Cropping1D", "Cropping2D", "Cropping3D", weights=False)
def build_cropping(cfg, ctx):
    rank = class_rank(ctx)
    return Crop(_pairs(cfg, ctx, "cropping", rank, 1 if rank == 1 else 0), rank == 1 or channels_last_format(cfg, ctx), -1)


@builder("ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D", weights=False)
def build_zero_padding(cfg, ctx):
    rank = class_rank(ctx)
    return Crop(_pairs(cfg, ctx, "padding", rank, 1), rank == 1 or channels_last_format(cfg, ctx), 1)


@builder("UpSampling1D", "UpSampling2D", "UpSampling3D", weights=False)
def build_up_sampling(cfg, ctx):
    rank = class_rank(ctx)
    value = cfg.get("size", 2)
    values = value if isinstance(value, list) else [value] * rank
    if len(values) != rank:
        raise ctx.error(f"config size={str(value)[:40]!r}; expected an integer or {rank} of them")
    sizes = [Values({"size": s}, ctx).int("size", lo=1, hi=1 << 10) for s in values]
    interpolation = "nearest"
    if rank == 2:
        interpolation = Values(cfg, ctx).str("interpolation", "nearest")
        if interpolation not in ("nearest", "bilinear", "bicubic"):
            raise ctx.error(f"UpSampling2D interpolation={interpolation[:40]!r} is not supported (nearest, bilinear, "
                            "bicubic; Keras's torch backend refuses the Lanczos filters too)")
    return UpSampling(sizes, rank == 1 or channels_last_format(cfg, ctx), interpolation)
