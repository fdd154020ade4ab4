"""Preprocessing saved inside models: Rescaling, Normalization (adapted or given mean and
variance, invert), CenterCrop; and the image augmentation layers (RandomFlip, RandomRotation,
RandomZoom, ...), which Keras runs only in training: here they are exactly the identity at
inference, and a model in training mode refuses them with one error (their random transforms are
Keras's own and are not reproduced); their modules and their builders."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .base import _Single, channels_last_format
from .registry import builder
from .values import MAX_SIZE, Values

# Keras 3's image augmentation layers: random in training, the identity at inference (Keras's
# BaseImagePreprocessingLayer returns its input unchanged when training is False).
AUGMENTATION = (
    "AugMix", "CutMix", "MixUp", "RandAugment", "RandomBrightness", "RandomColorDegeneration", "RandomColorJitter",
    "RandomContrast", "RandomElasticTransform", "RandomErasing", "RandomFlip", "RandomGaussianBlur",
    "RandomGrayscale", "RandomHue", "RandomInvert", "RandomPerspective", "RandomPosterization", "RandomRotation",
    "RandomSaturation", "RandomSharpness", "RandomShear", "RandomTranslation", "RandomZoom", "Solarization",
    "MaxNumBoundingBoxes",
)


class Augmentation(_Single):
    keeps_mask = False

    def __init__(self, class_name: str):
        super().__init__()
        self.class_name = class_name

    def apply(self, x):
        if self.training:
            raise RuntimeError(f"{self.class_name} is a Keras augmentation layer: it is the identity at inference, and "
                               "its random training-time transform is not reproduced here; call model.eval(), or "
                               "augment the data before the model")
        return x

    def extra_repr(self):
        return self.class_name


class Rescaling(_Single):
    keeps_mask = False

    def __init__(self, scale: torch.Tensor, offset: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)

    def apply(self, x):
        return x.to(self.scale.dtype) * self.scale + self.offset


class Standardize(_Single):
    """keras.layers.Normalization: (x - mean) / max(sqrt(variance), 1e-7), or its inverse."""

    keeps_mask = False

    def __init__(self, mean: torch.Tensor, variance: torch.Tensor, axes, invert: bool, adapted: bool):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("variance", variance)
        self.axes, self.invert, self.adapted = tuple(axes), invert, adapted

    def keras_groups(self):  # adapted: Keras keeps mean, variance and a count (unused) as weights
        return [("", [self.mean, self.variance, torch.zeros((), dtype=torch.int64)])] if self.adapted else []

    def _shaped(self, t, x):
        if t.dim() == 0:
            return t
        axes = sorted(a % x.dim() for a in self.axes)
        shape = [1] * x.dim()
        for a, n in zip(axes, t.shape):
            shape[a] = n
        return t.reshape(shape)

    def apply(self, x):
        mean, std = self._shaped(self.mean, x), torch.clamp(torch.sqrt(self._shaped(self.variance, x)), min=1e-7)
        x = x.to(self.mean.dtype)
        return mean + x * std if self.invert else (x - mean) / std


class CenterCrop(_Single):
    keeps_mask = False

    def __init__(self, height: int, width: int, channels_last: bool):
        super().__init__()
        self.height, self.width, self.channels_last = height, width, channels_last

    def apply(self, x):
        h_axis = x.dim() - 3 if self.channels_last else x.dim() - 2
        h, w = x.shape[h_axis], x.shape[h_axis + 1]
        if h < self.height or w < self.width:
            raise ValueError(f"CenterCrop to {self.height}x{self.width} of a {h}x{w} image: Keras resizes smaller "
                             "images first, which is not supported here")
        return x.narrow(h_axis, (h - self.height) // 2, self.height).narrow(h_axis + 1, (w - self.width) // 2, self.width)


def _numbers(cfg, ctx, key: str, default: float) -> torch.Tensor:
    value = cfg.get(key, default)
    value = default if value is None else value
    array = np.asarray(value if isinstance(value, list) else [value], dtype=object)
    if array.ndim != 1 or not 1 <= array.size <= MAX_SIZE or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in array):
        raise ctx.error(f"config {key}={str(value)[:60]!r}; expected a number or a list of numbers")
    out = torch.tensor([float(v) for v in array], dtype=ctx.dtype)
    return out if isinstance(value, list) else out[0]


@builder(*AUGMENTATION, weights=False)
def build_augmentation(cfg, ctx):
    return Augmentation(ctx.spec.class_name)


@builder("Rescaling", weights=False)
def build_rescaling(cfg, ctx):
    return Rescaling(_numbers(cfg, ctx, "scale", 1.0), _numbers(cfg, ctx, "offset", 0.0))


def _normalization_has_weights(cfg) -> bool:
    return cfg.get("mean") is None  # adapted: mean, variance and count are weights; given: in the config


@builder("Normalization", weights=_normalization_has_weights)
def build_normalization(cfg, ctx):
    axis = cfg.get("axis", -1)
    axis = [] if axis is None else axis
    axes = Values({"axis": axis if isinstance(axis, list) else [axis]}, ctx).int_list("axis", lo=-8, hi=8)
    invert = Values(cfg, ctx).bool("invert", False)
    if cfg.get("mean") is not None:
        mean = np.asarray(cfg.get("mean"), dtype=np.float64)
        variance = np.asarray(cfg.get("variance"), dtype=np.float64)
        if mean.shape != variance.shape or mean.size > MAX_SIZE or not np.all(np.isfinite(mean)) or \
                not np.all(np.isfinite(variance)):
            raise ctx.error("config mean and variance must be finite numbers of one shape")
        return Standardize(torch.as_tensor(mean, dtype=ctx.dtype), torch.as_tensor(variance, dtype=ctx.dtype), axes,
                           invert, adapted=False)
    (w,) = ctx.weights.take([("", 3)])
    mean, variance, count = (np.asarray(a) for a in w)
    if mean.shape != variance.shape or mean.ndim != len(axes) or count.size != 1:
        raise ctx.error(f"Normalization weights have shapes {[mean.shape, variance.shape, count.shape]}; "
                        f"expected mean and variance of {len(axes)} axes and a count")
    return Standardize(torch.as_tensor(mean, dtype=ctx.dtype), torch.as_tensor(variance, dtype=ctx.dtype), axes, invert,
                       adapted=True)


@builder("CenterCrop", weights=False)
def build_center_crop(cfg, ctx):
    v = Values(cfg, ctx)
    return CenterCrop(v.int("height", lo=1), v.int("width", lo=1), channels_last_format(cfg, ctx))
