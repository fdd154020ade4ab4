"""Typed reads of a layer's config and shape checks of its weights: what every builder uses so
that a config value of the wrong type or range, or a weight of the wrong shape, is refused with
a ConversionError naming the layer and the key when the layer is built, not when it first runs."""
from __future__ import annotations

import math

import numpy as np

_REQUIRED = object()
MAX_SIZE = 1 << 24   # units, filters, vocabulary sizes: larger than any real layer


class Values:
    """Typed reads of one layer's config. Each raises ConversionError naming the layer, the key,
    what it holds and what was expected; a missing key gives the default (or an error when the
    key is required). JSON has no integer/float distinction that configs keep reliably, so
    integral floats are accepted as integers; booleans are never numbers."""

    def __init__(self, cfg: dict, ctx):
        self.cfg, self.ctx = cfg, ctx

    def _get(self, key, default):
        if key in self.cfg and self.cfg[key] is not None:
            return self.cfg[key], True
        if default is _REQUIRED:
            raise self.ctx.error(f"config has no {key!r}")
        return default, False

    def _bad(self, key, value, expected):
        return self.ctx.error(f"config {key}={str(value)[:60]!r}; expected {expected}")

    def int(self, key, default=_REQUIRED, lo=0, hi=MAX_SIZE) -> int:
        value, given = self._get(key, default)
        if not given:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise self._bad(key, value, f"an integer in [{lo}, {hi}]")
        return value

    def ints(self, key, default=_REQUIRED, lo=1, hi=MAX_SIZE) -> int:
        """An integer, or a list holding one (Keras 1-D layers write kernel_size=[3])."""
        value, given = self._get(key, default)
        if given and isinstance(value, list):
            if len(value) != 1:
                raise self._bad(key, value, "one integer")
            return Values({key: value[0]}, self.ctx).int(key, lo=lo, hi=hi)
        return Values({key: value}, self.ctx).int(key, lo=lo, hi=hi) if given else value

    def float(self, key, default=_REQUIRED, lo=-math.inf, hi=math.inf) -> float:
        value, given = self._get(key, default)
        if not given:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not lo <= value <= hi:
            raise self._bad(key, value, f"a finite number in [{lo}, {hi}]")
        return float(value)

    def bool(self, key, default=False) -> bool:
        """A flag. Keras tests flags by truth, so a number that a user passed for one (stateful=-1)
        is read as Python reads it; anything else but true / false is refused."""
        value, given = self._get(key, default)
        if given and not (isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))):
            raise self._bad(key, value, "true or false")
        return bool(value)

    def str(self, key, default=_REQUIRED, choices=None):
        value, given = self._get(key, default)
        if given and (not isinstance(value, str) or (choices is not None and value not in choices)):
            raise self._bad(key, value, f"one of {sorted(choices)}" if choices else "a string")
        return value

    def axes(self, key="axis", default=-1) -> list:
        """An axis or a list of them (Keras's `axis`): distinct, and never the batch axis."""
        value, _ = self._get(key, default)
        axes = Values({key: value if isinstance(value, list) else [value]}, self.ctx).int_list(key, lo=-8, hi=8)
        if not axes or 0 in axes or len(set(axes)) != len(axes):
            raise self._bad(key, value, "distinct non-batch axes")
        return axes

    def int_list(self, key, lo=-MAX_SIZE, hi=MAX_SIZE, allow_none=False) -> list:
        value, _ = self._get(key, _REQUIRED)
        if not isinstance(value, list) or len(value) > 8 or not all(
                (v is None and allow_none) or (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi)
                for v in value):
            raise self._bad(key, value, f"a list of integers in [{lo}, {hi}]")
        return value


def int_tuple(v: "Values", key: str, rank: int, default) -> tuple:
    """An integer or a list of `rank` of them (kernel_size, strides, dilation_rate of a 2-D or
    3-D convolution) as a rank-tuple of integers in [1, 2^16]."""
    value = v.cfg.get(key, default)
    value = default if value is None else value
    values = value if isinstance(value, list) else [value] * rank
    if len(values) != rank:
        raise v.ctx.error(f"config {key}={str(value)[:40]!r}; expected an integer or {rank} of them")
    return tuple(Values({key: e}, v.ctx).int(key, lo=1, hi=1 << 16) for e in values)


def check_shapes(ctx, what: str, arrays, expected) -> None:
    """Weights against the shapes the config implies; a str in `expected` is a size the config
    leaves free (the input width), bound by its first use and checked everywhere else."""
    bound = {}
    got = [tuple(np.shape(a)) for a in arrays]
    ok = len(got) == len(expected)
    for shape, want in zip(got, expected):
        if len(shape) != len(want):
            ok = False
            break
        for d, w in zip(shape, want):
            if isinstance(w, str):
                w = bound.setdefault(w, d)
            if d != w:
                ok = False
    if not ok:
        shown = [tuple(bound.get(w, w) if isinstance(w, str) else w for w in want) for want in expected]
        raise ctx.error(f"{what} weights have shapes {got}; the config implies {shown}")
