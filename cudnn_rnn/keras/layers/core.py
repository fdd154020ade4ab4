"""The core layers: InputLayer, Identity, Dense, EinsumDense, Embedding, ReversibleEmbedding,
Masking; their modules and their builders."""
from __future__ import annotations

import re

import numpy as np
import torch
from torch import nn

from .activations import _Activation, activation_name
from .registry import builder
from .base import Identity, Reversible, _Single, lookup, without_mask_in_keras2
from .quantized import (build_float8_dense, build_quantized_dense, build_quantized_embedding,
                        build_quantized_reversible, keras_quantization)
from .values import Values, check_shapes


class Dense(_Single):
    # Set by cudnn_rnn.quantize_dynamic: float32 CPU inputs go through the int8 op.
    quantized = False

    def __init__(self, kernel, bias, activation: _Activation):
        super().__init__()
        self.kernel = kernel
        self.bias = bias
        self.activation = activation

    def keras_groups(self):
        return [("", [self.kernel] + ([self.bias] if self.bias is not None else []))]

    def apply(self, x):
        if self.quantized and self.training:
            raise RuntimeError("Dense: a layer quantized by cudnn_rnn.quantize_dynamic runs inference only; "
                               "call model.eval()")
        if self.quantized and x.device.type == "cpu" and x.dtype == torch.float32 and self.kernel.dtype == torch.float32:
            with torch.no_grad():
                return self.activation(torch.ops.cudnn_rnn.linear_int8(x, self.kernel, self.bias))
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
        # Keras looks up float ids truncated (a cast to int) but masks on the values as given: 0.5
        # is row 0 and a real step
        return [lookup(inputs[0].long(), self.embeddings)], [inputs[0] != 0 if self.mask_zero else None]


class ReversibleEmbedding(Reversible, Embedding):
    """keras.layers.ReversibleEmbedding: the embedding lookup, or with reverse=True logits against
    the (tied or own) reverse embeddings, computed in reverse_dtype where the config names one."""

    def __init__(self, weight, mask_zero: bool, reverse_weight, directions, soft_cap, reverse_dtype=None):
        super().__init__(weight, mask_zero)
        self.reverse_embeddings, self.reverse_dtype = reverse_weight, reverse_dtype
        self.directions_and_cap(directions, soft_cap)

    def keras_groups(self):
        return [("", [self.embeddings] + ([self.reverse_embeddings] if self.reverse_embeddings is not None else []))]

    def logits(self, x):
        kernel = self.embeddings.t() if self.reverse_embeddings is None else self.reverse_embeddings
        # in reverse_dtype, else in the inputs' and the table's common type (Keras's matmul
        # promotes a bfloat16 input and a float32 table to float32)
        dtype = self.reverse_dtype or torch.promote_types(x.dtype, kernel.dtype)
        return torch.matmul(x.to(dtype), kernel.to(dtype))


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
    return without_mask_in_keras2(Identity(), ctx) if ctx.spec.class_name == "Identity" else Identity()


@builder("Dense")
def build_dense(cfg, ctx):
    v = Values(cfg, ctx)
    units, use_bias = v.int("units", lo=1), v.bool("use_bias", True)
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    def checked(w):  # -> the bias
        check_shapes(ctx, "Dense", w, [("in", units), (units,)][: len(w)])
        return ctx.tensor(w[1]) if use_bias else None

    q = keras_quantization(cfg, ctx)
    if q is not None and q.mode == "float8":
        return build_float8_dense(ctx, None, use_bias, activation, checked)
    if q is not None:
        return build_quantized_dense(ctx, q, None, [units], use_bias, activation, checked)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    return Dense(ctx.tensor(w[0]), checked(w), activation)


@builder("Embedding")
def build_embedding(cfg, ctx):
    v = Values(cfg, ctx)
    shape = (v.int("input_dim", lo=1), v.int("output_dim", lo=1))
    mask_zero = v.bool("mask_zero", False)
    q = keras_quantization(cfg, ctx)
    if q is not None:
        return build_quantized_embedding(ctx, q, shape, mask_zero)
    (w,) = ctx.weights.take([("", 1)], [[shape]])
    return Embedding(ctx.tensor(w[0]), mask_zero)


@builder("ReversibleEmbedding")
def build_reversible_embedding(cfg, ctx):
    v = Values(cfg, ctx)
    shape = (v.int("input_dim", lo=1), v.int("output_dim", lo=1))
    tie, mask_zero = v.bool("tie_weights", True), v.bool("mask_zero", False)
    soft_cap = v.float("logit_soft_cap", None, 1e-12)
    reverse_dtype = v.str("reverse_dtype", None, tuple(_REVERSE_DTYPES))
    directions = [bool(c.kwargs.get("reverse", False)) for c in ctx.spec.calls] or [False]
    q = keras_quantization(cfg, ctx)
    if q is not None:  # (Keras's quantized reverse call computes in the layer's dtype, whatever reverse_dtype says)
        return build_quantized_reversible(ctx, q, shape, tie, cfg.get("quantization_config"), directions, soft_cap)
    (w,) = ctx.weights.take([("", 1 if tie else 2)], [[shape] + ([shape[::-1]] if not tie else [])])
    return ReversibleEmbedding(ctx.tensor(w[0]), mask_zero, None if tie else ctx.tensor(w[1]), directions, soft_cap,
                               _REVERSE_DTYPES[reverse_dtype] if reverse_dtype is not None else None)


# (float64 as Keras on TensorFlow computes it: Keras on torch and JAX type a matmul by a
# result_type that maps 64-bit types to 32 bits, and return float32 logits; docs/limits.md)
_REVERSE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
                   "float64": torch.float64}


@builder("Masking", weights=False)
def build_masking(cfg, ctx):
    return Masking(Values(cfg, ctx).float("mask_value", 0.0))


_EINSUM = re.compile(r"^([a-zA-Z]+|\.\.\.[a-zA-Z]*|[a-zA-Z]*\.\.\.),([a-zA-Z]+)->([a-zA-Z]+|\.\.\.[a-zA-Z]*|[a-zA-Z]*\.\.\.)$")


class EinsumDense(_Single):
    keeps_mask = False

    def __init__(self, equation: str, kernel, bias, activation: _Activation):
        super().__init__()
        self.equation, self.kernel, self.bias, self.activation = equation, kernel, bias, activation

    def keras_groups(self):
        return [("", [self.kernel] + ([self.bias] if self.bias is not None else []))]

    def apply(self, x):
        y = torch.einsum(self.equation, x, self.kernel)
        return self.activation(y + self.bias if self.bias is not None else y)


@builder("EinsumDense")
def build_einsum_dense(cfg, ctx):
    v = Values(cfg, ctx)
    equation = v.str("equation")
    match = _EINSUM.match(equation.replace(" ", ""))
    if match is None:
        raise ctx.error(f"EinsumDense equation {equation[:60]!r} is not of the form 'ab,bc->ac' (one input, one kernel)")
    input_spec, kernel_spec, output_spec = match.groups()
    bias_axes = v.str("bias_axes", None)
    if bias_axes is not None and (not bias_axes or any(c not in output_spec for c in bias_axes)):
        raise ctx.error(f"EinsumDense bias_axes {bias_axes[:20]!r} are not all in the output {output_spec!r}")
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    def checked(w):  # -> the bias
        if np.ndim(w[0]) != len(kernel_spec):
            raise ctx.error(f"EinsumDense kernel has shape {tuple(np.shape(w[0]))}; the equation names "
                            f"{len(kernel_spec)} axes")
        return _einsum_bias(ctx, w, bias_axes, kernel_spec, output_spec) if bias_axes is not None else None

    q = keras_quantization(cfg, ctx)
    if q is not None and q.mode == "float8":
        return build_float8_dense(ctx, equation.replace(" ", ""), bias_axes is not None, activation, checked)
    if q is not None:
        return build_quantized_dense(ctx, q, equation.replace(" ", ""), cfg.get("output_shape"), bias_axes is not None,
                                     activation, checked)
    (w,) = ctx.weights.take([("", 1 + int(bias_axes is not None))])
    return EinsumDense(equation.replace(" ", ""), ctx.tensor(w[0]), checked(w), activation)


def _einsum_bias(ctx, w, bias_axes: str, kernel_spec: str, output_spec: str):
    """The bias w[1] checked against the kernel w[0] (its shape: Keras: from the first bias axis on,
    the bias axes' sizes and 1 elsewhere)."""
    first = min(output_spec.index(c) for c in bias_axes)
    expected = tuple("size" + c if c in bias_axes else 1 for c in output_spec[first:])
    if np.ndim(w[1]) != len(expected):
        raise ctx.error(f"EinsumDense bias has shape {tuple(np.shape(w[1]))}; bias_axes {bias_axes!r} of the output "
                        f"{output_spec!r} imply {len(expected)} axes")
    sizes = {c: n for c, n in zip(kernel_spec, np.shape(w[0]))}
    check_shapes(ctx, "EinsumDense", w[1:2], [tuple(sizes.get(e[4:], e) if isinstance(e, str) else e for e in expected)])
    return ctx.tensor(w[1])


class RandomFourierFeatures(_Single):
    """tf.keras 2's layers.experimental.RandomFourierFeatures: cos(x @ (kernel / scale) + bias)."""

    keeps_mask = False

    def __init__(self, kernel, bias, scale):
        super().__init__()
        self.kernel, self.bias, self.scale = kernel, bias, scale

    def apply(self, x):
        return torch.cos(torch.matmul(x, (1.0 / self.scale) * self.kernel) + self.bias)


@builder("RandomFourierFeatures")
def build_random_fourier_features(cfg, ctx):
    units = Values(cfg, ctx).int("output_dim", lo=1)
    # (kernel, bias, scale); tf.keras lists the trainable scale first (a legacy .h5 names them)
    (w,) = ctx.weights.take([("", 3)], order=["unscaled_kernel", "bias", "kernel_scale"])
    if np.ndim(w[0]) == 1 and np.ndim(w[1]) == 2:
        w = w[1:] + w[:1]
    check_shapes(ctx, "RandomFourierFeatures", w, [("in", units), (units,), (1,)])
    return RandomFourierFeatures(*(ctx.tensor(a) for a in w))
