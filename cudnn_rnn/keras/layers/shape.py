"""The shape layers: Flatten, Reshape, Permute, RepeatVector, Cropping1D/2D/3D, ZeroPadding1D/2D/3D,
UpSampling1D/2D/3D (nearest; bilinear and bicubic for 2-D); their modules and their builders.

Bicubic (here, in Resizing and in a recorded image resize) is TensorFlow's or JAX's where that
backend's Keras wrote the file (legacy .h5 and model.to_json() record the backend; tf.keras 2 runs
on TensorFlow only: Keys's cubic, a = -0.5, renormalised at the borders) and Keras's on the torch
backend otherwise (torch's cubic convolution, a = -0.75; a Keras 3 .keras file does not say which
backend wrote it). The Lanczos filters
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


def _keys_cubic_weights(n_in: int, n_out: int, device, table: bool) -> torch.Tensor:
    """[n_out, n_in]: a bicubic resize along one axis with half-pixel centres as TensorFlow's
    ResizeBicubic and JAX's scale_and_translate compute it: Keys's cubic with a = -0.5, taps
    outside the image weighed 0 and the rest renormalised, in float32; table: the fraction read
    from TensorFlow's 1024-entry table (JAX evaluates it exactly)."""
    a = -0.5
    loc = (torch.arange(n_out, dtype=torch.float32, device=device) + 0.5) * (float(n_in) / float(n_out)) - 0.5
    floor = torch.floor(loc)
    # (the table's entry: round half to even, as lrintf)
    step = torch.round((loc - floor) * 1024.0) if table else (loc - floor) * 1024.0

    def near(x):  # |d| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |d| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    t, u = step / 1024.0, (1024.0 - step) / 1024.0
    w = torch.stack([far(t + 1), near(t), near(u), far(u + 1)], dim=1)
    taps = floor.long().unsqueeze(1) + torch.arange(-1, 3, device=device)
    inside = (taps >= 0) & (taps < n_in)
    w = torch.where(inside, w, torch.zeros_like(w))
    w = w / w.sum(dim=1, keepdim=True)
    return torch.zeros(n_out, n_in, dtype=torch.float32, device=device).scatter_add_(1, taps.clamp(0, n_in - 1), w)


def keys_bicubic_resize(x: torch.Tensor, size: Sequence[int], table: bool) -> torch.Tensor:
    """x [N, C, H, W] resized as TensorFlow's tf.image.resize(method="bicubic") (table) or
    jax.image.resize(method="bicubic") without antialiasing computes it (float32). torch's
    bicubic (Keras's torch backend) uses a = -0.75 and repeats the border pixels: 2e-3 apart on
    smooth images; TensorFlow's table and JAX's exact fraction, up to 5e-4."""
    rows = _keys_cubic_weights(x.shape[-2], size[0], x.device, table)
    cols = _keys_cubic_weights(x.shape[-1], size[1], x.device, table)
    return torch.matmul(torch.matmul(rows, x.float()), cols.t())


def resize_image(x: torch.Tensor, size: Sequence[int], mode: str, antialias: bool = False,
                 cubic: str = "torch") -> torch.Tensor:
    """x [N, C, H, W] resized with half-pixel centres: nearest (Keras's: the nearest centre),
    bilinear or bicubic (cubic: whose, cubic_of)."""
    if mode == "bicubic" and cubic in ("tensorflow", "jax") and not antialias:
        return keys_bicubic_resize(x, size, table=cubic == "tensorflow")
    mode = "nearest-exact" if mode == "nearest" else mode
    return F.interpolate(x, size=list(size), mode=mode, align_corners=None if mode == "nearest-exact" else False,
                         antialias=antialias)


def cubic_of(ctx) -> str:
    """Whose bicubic resize a file's model computes: "tensorflow" or "jax" where the file says
    that backend's Keras wrote it (legacy .h5 and model.to_json() record the backend, tf.keras 2
    has no other), else "torch" (Keras 3 .keras files record none)."""
    return ctx.backend if ctx.backend in ("tensorflow", "jax") else "torch"


class UpSampling(_Single):
    keeps_mask = False

    def __init__(self, sizes: Sequence[int], channels_last: bool, interpolation: str, cubic: str = "torch"):
        super().__init__()
        self.sizes, self.channels_last, self.interpolation = tuple(sizes), channels_last, interpolation
        self.cubic = cubic

    def apply(self, x):
        if self.interpolation == "nearest":
            first = 1 if self.channels_last else 2
            for d, n in enumerate(self.sizes):
                x = torch.repeat_interleave(x, n, dim=first + d)
            return x
        # bilinear / bicubic: half-pixel resizes without antialiasing
        h = to_channels_first(x, self.channels_last)
        size = [s * n for s, n in zip(h.shape[2:], self.sizes)]
        return from_channels_first(resize_image(h, size, self.interpolation, cubic=self.cubic), self.channels_last)


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
    return UpSampling(sizes, rank == 1 or channels_last_format(cfg, ctx), interpolation, cubic_of(ctx))
