"""The core layers: InputLayer, Identity, Dense, Embedding, Masking; their modules and their
builders."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .activations import _Activation, activation_name
from .registry import builder
from .base import Identity, _Single
from .values import Values, check_shapes


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


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
@builder("InputLayer", "Identity", weights=False)
def build_input(cfg, ctx):
    return Identity()


@builder("Dense")
def build_dense(cfg, ctx):
    v = Values(cfg, ctx)
    units, use_bias = v.int("units", lo=1), v.bool("use_bias", True)
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    check_shapes(ctx, "Dense", w, [("in", units), (units,)][: len(w)])
    return Dense(ctx.tensor(w[0]), ctx.tensor(w[1]) if use_bias else None, activation)


@builder("Embedding")
def build_embedding(cfg, ctx):
    v = Values(cfg, ctx)
    shape = (v.int("input_dim", lo=1), v.int("output_dim", lo=1))
    mask_zero = v.bool("mask_zero", False)
    (w,) = ctx.weights.take([("", 1)], [[shape]])
    return Embedding(ctx.tensor(w[0]), mask_zero)


@builder("Masking", weights=False)
def build_masking(cfg, ctx):
    return Masking(Values(cfg, ctx).float("mask_value", 0.0))
