"""Dropout masks that trace under torch.compile, dynamic shapes included.

Unseeded masks come from torch.rand (the global generator). A layer with a `seed` draws from a
counter-based generator instead: each element's uniform is a hash (splitmix64's finalizer) of
the seed, the number of masks the layer has drawn so far and the element's index, computed with
int64 tensor ops. It needs no torch.Generator (which torch.compile cannot take inside a graph),
gives the same masks eagerly, compiled, on the CPU and on CUDA, and a new mask per call.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers, as signed int64
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


def _int64(v: int) -> int:
    """A Python integer wrapped to int64 (two's complement), as the tensor arithmetic wraps."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _shift_right(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def hashed_uniform(shape: Sequence, seed: int, draw: Tensor, device) -> Tensor:
    """float32 uniforms in [0, 1) of `shape`: element i is a hash of (seed, draw, i)."""
    n = 1
    for s in shape:
        n = n * s
    x = torch.arange(n, device=device, dtype=torch.int64)
    x = x + (draw.to(device=device, dtype=torch.int64) << 40) + _int64(int(seed) * _GOLDEN)
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    x = x ^ _shift_right(x, 31)
    return (_shift_right(x, 40).to(torch.float32) * (1.0 / (1 << 24))).reshape(shape)


class MaskSource:
    """The dropout masks of one layer: keep_mask(shape, rate, like) -> 0 or 1 / (1 - rate).
    `draws` is the layer's non-persistent int64 buffer counting the masks a seeded layer drew."""

    @staticmethod
    def keep_mask(shape, rate: float, like: Tensor, seed: Optional[int], draws: Optional[Tensor]) -> Tensor:
        keep = 1.0 - rate
        if keep <= 0.0:
            return like.new_zeros(shape)
        if seed is None:
            u = torch.rand(shape, device=like.device, dtype=like.dtype)
        else:
            u = hashed_uniform(shape, seed, draws, like.device)
            draws.add_(1)
        return (u < keep).to(like.dtype) / keep
