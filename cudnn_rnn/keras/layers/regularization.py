"""The regularisation layers, as Keras runs them: identity at inference; in training, Dropout
(noise_shape), SpatialDropout1D/2D/3D (one decision per sample and channel), GaussianNoise,
GaussianDropout and AlphaDropout draw their noise from torch's generator (Keras's own random
streams cannot be reproduced outside Keras); ActivityRegularization only adds a loss, so it is
the identity here."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .base import Identity, _Single, channels_last_format, class_rank
from .registry import builder
from .values import Values

_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


class Dropout(_Single):
    """Dropout and SpatialDropout: `noise` is Keras's noise_shape with None for the input's own
    size (SpatialDropout: 1 on the spatial axes)."""

    def __init__(self, rate: float, noise: Optional[Sequence[Optional[int]]] = None):
        super().__init__()
        self.rate, self.noise = rate, None if noise is None else tuple(noise)

    def apply(self, x):
        if not self.training or self.rate <= 0.0:
            return x
        if self.noise is None:
            return F.dropout(x, self.rate, True)
        if len(self.noise) != x.dim():
            raise ValueError(f"noise_shape {list(self.noise)} does not fit an input of shape {tuple(x.shape)}")
        return drop(x, self.rate, [x.shape[d] if n is None else n for d, n in enumerate(self.noise)])


def drop(x: torch.Tensor, rate: float, shape) -> torch.Tensor:
    """x with each block of the noise `shape` (broadcast against x) zeroed with probability
    `rate`, the rest scaled by 1 / (1 - rate), as Keras's dropout with a noise shape draws it."""
    keep = (torch.rand(shape, device=x.device) >= rate).to(x.dtype)
    return x * keep / (1.0 - rate)


class Noise(_Single):
    """GaussianNoise (x + N(0, stddev)), GaussianDropout (x * N(1, rate / (1 - rate))) and
    AlphaDropout (SELU-preserving), in training only."""

    def __init__(self, kind: str, value: float):
        super().__init__()
        self.kind, self.value = kind, value

    def apply(self, x):
        if not self.training or self.value <= 0.0:
            return x
        if self.kind == "gaussian_noise":
            return x + torch.randn_like(x) * self.value
        if self.kind == "gaussian_dropout":
            return x * (1.0 + torch.randn_like(x) * math.sqrt(self.value / (1.0 - self.value)))
        rate, alpha_p = self.value, -_SELU_ALPHA * _SELU_SCALE
        kept = (torch.rand_like(x) >= rate).to(x.dtype)
        a = ((1 - rate) * (1 + rate * alpha_p ** 2)) ** -0.5
        b = -a * alpha_p * rate
        return a * (x * kept + alpha_p * (1 - kept)) + b


def _rate(cfg, ctx) -> float:
    return min(Values(cfg, ctx).float("rate", 0.0, 0.0, 1.0), 1.0 - 1e-7)


@builder("Dropout", weights=False)
def build_dropout(cfg, ctx):
    noise = cfg.get("noise_shape")
    if noise is not None:
        if not isinstance(noise, list) or not 1 <= len(noise) <= 8 or not all(
                n is None or (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 1 << 24) for n in noise):
            raise ctx.error(f"config noise_shape={str(noise)[:60]!r}; expected a list of sizes or None")
    return Dropout(_rate(cfg, ctx), noise)


@builder("SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", weights=False)
def build_spatial_dropout(cfg, ctx):
    rank = class_rank(ctx)
    last = rank == 1 or channels_last_format(cfg, ctx)
    noise = [None] + [1] * rank + [None] if last else [None, None] + [1] * rank
    return Dropout(_rate(cfg, ctx), noise)


@builder("GaussianNoise", weights=False)
def build_gaussian_noise(cfg, ctx):
    return Noise("gaussian_noise", Values(cfg, ctx).float("stddev", 0.0, 0.0))


@builder("GaussianDropout", "AlphaDropout", weights=False)
def build_noise_dropout(cfg, ctx):
    return Noise("gaussian_dropout" if ctx.spec.class_name == "GaussianDropout" else "alpha_dropout", _rate(cfg, ctx))


@builder("ActivityRegularization", weights=False)
def build_activity_regularization(cfg, ctx):
    return Identity()
