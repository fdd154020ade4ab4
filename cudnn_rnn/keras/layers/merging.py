"""The merging layers: Concatenate, Add, Subtract, Multiply, Average, Maximum, Minimum (with
Keras's mask rules) and Dot (axes, normalize); their modules and their builders."""
from __future__ import annotations

import torch
from torch import nn

from .registry import builder, keras_at_least
from .values import Values


class Merge(nn.Module):
    """Concatenate / Add / Subtract / Multiply / Average / Maximum / Minimum.

    Output masks follow the producer: Keras 3 ORs the masks (elementwise merges give None when
    any input has none; Concatenate counts a missing mask as all True); Keras 2 ANDs the masks
    that are present. From Keras 3.4 (`masked_values`) Maximum, Minimum and Multiply also read
    the input masks for their values: a masked step of one input takes the other inputs' value
    (Maximum / Minimum), or counts as 1 (Multiply, then 0 where every input is masked)."""

    def __init__(self, op: str, axis: int = -1, keras3: bool = True, masked_values: bool = False):
        super().__init__()
        self.op, self.axis, self.keras3, self.masked_values = op, axis, keras3, masked_values

    def forward(self, inputs, masks):
        if self.masked_values and self.op in ("maximum", "minimum", "multiply") and any(m is not None for m in masks):
            return [self._masked(inputs, masks)], [self._mask(inputs, masks)]
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

    def _masked(self, inputs, masks):
        """Keras 3.4+'s Maximum / Minimum (_apply_merge_op_and_or_mask) and Multiply
        (_merge_function) values where inputs carry masks."""
        if self.op == "multiply":
            every = all(m is not None for m in masks)
            y, seen = None, None
            for x, m in zip(inputs, masks):
                m = _spread(m, x)
                if m is not None:
                    x = torch.where(m, x, torch.ones((), dtype=x.dtype, device=x.device))
                    seen = m if seen is None else seen | m
                y = x if y is None else y * x
            return torch.where(seen, y, torch.zeros((), dtype=y.dtype, device=y.device)) if every else y
        op = torch.maximum if self.op == "maximum" else torch.minimum
        y, y_mask = inputs[0], _spread(masks[0], inputs[0])
        for x, m in zip(inputs[1:], masks[1:]):
            m = _spread(m, x)
            if m is not None:
                x = torch.where(m, x, y)
            if y_mask is not None:
                y = torch.where(y_mask, y, x)
            y_mask = y_mask | m if (m is not None and y_mask is not None) else None
            y = op(y, x)
        return y

    def _mask(self, inputs, masks):
        present = [m for m in masks if m is not None]
        if not present:
            return None
        if self.op == "concatenate":
            return self._concatenated_mask(inputs, masks)
        if not self.keras3:
            mask = present[0]
            for m in present[1:]:
                mask = mask & m
            return mask
        if len(present) != len(masks):
            return None
        mask = present[0]
        for m in present[1:]:
            mask = mask | m
        return mask

    def _concatenated_mask(self, inputs, masks):
        """Keras's Concatenate.compute_mask: each input's mask (all True where it has none) spread
        over the input's shape, concatenated along the axis, then reduced over the last axis: any
        (Keras 3) or all (Keras 2). Concatenating along time concatenates the masks."""
        full = [torch.ones(x.shape, dtype=torch.bool, device=x.device) if m is None else _spread(m, x)
                for x, m in zip(inputs, masks)]
        joined = torch.cat(full, dim=self.axis)
        return joined.any(dim=-1) if self.keras3 else joined.all(dim=-1)


def _spread(m, x):
    """A Keras mask (bool, or None) spread over x's shape: trailing dimensions added, then expanded."""
    if m is None:
        return None
    m = m.bool()
    while m.dim() < x.dim():
        m = m.unsqueeze(-1)
    return m.expand(x.shape)


_MERGES = {"Concatenate": "concatenate", "Add": "add", "Subtract": "subtract", "Multiply": "multiply",
           "Average": "average", "Maximum": "maximum", "Minimum": "minimum"}


@builder(*_MERGES, weights=False)
def build_merge(cfg, ctx):
    axis = Values(cfg, ctx).int("axis", -1, lo=-8, hi=8) if ctx.spec.class_name == "Concatenate" else -1
    return Merge(_MERGES[ctx.spec.class_name], axis, keras3=ctx.keras_major >= 3,
                 masked_values=keras_at_least(ctx.keras_version, 3, 4))


class Dot(nn.Module):
    """keras.layers.Dot: Keras's batch_dot of two inputs over one axis each (after an L2
    normalisation along those axes with normalize=True); no output mask."""

    def __init__(self, axes, normalize: bool, keras3: bool):
        super().__init__()
        self.axes, self.normalize, self.keras3 = axes, normalize, keras3

    def _l2(self, x, axis):
        square_sum = (x * x).sum(dim=axis, keepdim=True)
        if self.keras3:  # keras.ops.normalize: x * min(rsqrt(sum x^2), 1 / epsilon)
            return x * torch.clamp(torch.rsqrt(square_sum), max=1e7)
        return x * torch.rsqrt(torch.clamp(square_sum, min=1e-12))  # tf.linalg.l2_normalize

    def forward(self, inputs, masks):
        if len(inputs) != 2:
            raise ValueError(f"Dot takes 2 inputs; got {len(inputs)}")
        x, y = inputs
        if isinstance(self.axes, int):
            a0, a1 = (self.axes % x.dim(), self.axes % y.dim()) if self.axes < 0 else (self.axes, self.axes)
        else:
            a0, a1 = self.axes[0] % x.dim(), self.axes[1] % y.dim()
        if 0 in (a0, a1):
            raise ValueError("Dot cannot take the product over the batch axis")
        if self.normalize:
            x, y = self._l2(x, a0), self._l2(y, a1)
        x, y = x.movedim(a0, -1), y.movedim(a1, 1)
        b, k = x.shape[0], x.shape[-1]
        out_shape = (b,) + tuple(x.shape[1:-1]) + tuple(y.shape[2:])
        z = torch.bmm(x.reshape(b, -1, k), y.reshape(b, k, -1)).reshape(out_shape)
        return [z if z.dim() > 1 else z.reshape(b, 1)], [None]


@builder("Dot", weights=False)
def build_dot(cfg, ctx):
    axes = cfg.get("axes")
    if isinstance(axes, list):
        axes = Values(cfg, ctx).int_list("axes", lo=-8, hi=8)
        if len(axes) != 2:
            raise ctx.error(f"Dot axes={axes}; expected one axis or two")
    else:
        axes = Values(cfg, ctx).int("axes", lo=-8, hi=8)
    return Dot(axes, Values(cfg, ctx).bool("normalize", False), keras3=ctx.keras_major >= 3)
