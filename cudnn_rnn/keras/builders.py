"""Keras layer configs -> torch modules, one small builder per class (the registry).

Every built module has the same call protocol, which the graph executor (model.py) relies on:

    forward(inputs: List[Tensor], masks: List[Optional[Tensor]]) -> (outputs, output_masks)

masks follow Keras's propagation rules (Embedding mask_zero, Masking, RNN compute_mask, merge
layers AND their masks, most other layers pass the mask through or drop it).

Adding a layer is one function decorated with @builder("ClassName") that reads the config, takes
its weights from `ctx` and returns a module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import layers as rnn_layers
from .errors import ConversionError
from .graph import LayerSpec
from .values import MAX_SIZE, Values, check_shapes
from .weights import LayerWeights

BUILDERS: Dict[str, Callable] = {}


def builder(*class_names):
    def register(fn):
        for name in class_names:
            BUILDERS[name] = fn
        return fn

    return register


@dataclass
class BuildContext:
    path: str
    keras_version: Optional[str]
    spec: LayerSpec
    weights: LayerWeights
    dtype: torch.dtype = torch.float32

    @property
    def keras_major(self) -> int:
        """The producer's major version; files without one come from Keras 2 or older."""
        if not self.keras_version:
            return 2
        try:
            return int(str(self.keras_version).split(".")[0])
        except ValueError:
            return 2

    def error(self, message: str) -> ConversionError:
        return ConversionError(self.path, message, self.spec.name)

    def tensor(self, array: np.ndarray) -> nn.Parameter:
        return nn.Parameter(torch.as_tensor(np.ascontiguousarray(array), dtype=self.dtype))


def layer_config_of(serialized) -> tuple:
    """(class_name, config) of a serialized inner layer ({"class_name", "config"})."""
    if not isinstance(serialized, dict) or not isinstance(serialized.get("class_name"), str) \
            or not isinstance(serialized.get("config") or {}, dict):
        raise ValueError(f"not a serialized layer: {str(serialized)[:200]}")
    return serialized["class_name"], serialized.get("config") or {}


# ---------------------------------------------------------------------------------------------
# activations for non-recurrent layers
# ---------------------------------------------------------------------------------------------
def activation_name(value, ctx: BuildContext) -> str:
    """A Keras activation config value as a name; hard_sigmoid resolved by producer version."""
    if value is None:
        return "linear"
    if isinstance(value, dict):
        value = value.get("config") if isinstance(value.get("config"), str) else value.get("class_name")
    if not isinstance(value, str):
        raise ctx.error(f"unsupported activation {str(value)[:60]!r}")
    value = {"swish": "silu", "hard_swish": "hard_silu"}.get(value, value)
    if value == "hard_sigmoid" and ctx.keras_major < 3:
        return "hard_sigmoid_keras2"
    return value


_TORCH_ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda x: F.softmax(x, dim=-1),
    "log_softmax": lambda x: F.log_softmax(x, dim=-1),
    "softplus": F.softplus,
    "softsign": F.softsign,
    "elu": F.elu,
    "selu": F.selu,
    "gelu": lambda x: F.gelu(x),
    "silu": F.silu,
    "mish": F.mish,
    "hard_sigmoid": F.hardsigmoid,
    "hard_sigmoid_keras2": lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0),
    "hard_silu": F.hardswish,
    "exponential": torch.exp,
    "relu6": F.relu6,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "log_sigmoid": F.logsigmoid,
    "tanh_shrink": F.tanhshrink,
}


class _Activation(nn.Module):
    def __init__(self, name: str, ctx: BuildContext):
        super().__init__()
        if name not in _TORCH_ACTIVATIONS:
            raise ctx.error(f"activation '{name}' is not supported (supported: {sorted(_TORCH_ACTIVATIONS)})")
        self.name = name
        self.fn = _TORCH_ACTIVATIONS[name]

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self):
        return self.name


# ---------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------
class _Single(nn.Module):
    """One input, one output; the mask passes through (Keras supports_masking) or is dropped."""

    keeps_mask = True

    def forward(self, inputs: List[Tensor], masks: List[Optional[Tensor]]):
        return [self.apply(inputs[0])], [masks[0] if self.keeps_mask else None]


class Identity(_Single):
    def apply(self, x):
        return x


class Dropout(_Single):
    """Dropout / SpatialDropout1D: identity at inference, Keras's rate in training."""

    def __init__(self, rate: float, spatial: bool):
        super().__init__()
        self.rate, self.spatial = rate, spatial

    def apply(self, x):
        if not self.training or self.rate <= 0.0:
            return x
        if self.spatial:  # one decision per (sample, channel), shared over time
            keep = (torch.rand(x.shape[0], 1, x.shape[-1], device=x.device) >= self.rate).to(x.dtype)
            return x * keep / (1.0 - self.rate)
        return F.dropout(x, self.rate, True)


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


class ActivationLayer(_Single):
    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def apply(self, x):
        return self.activation(x)


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


class Reshape(_Single):
    keeps_mask = False

    def __init__(self, shape):
        super().__init__()
        self.shape = tuple(shape)

    def apply(self, x):
        return x.reshape((x.shape[0],) + self.shape)


class Flatten(_Single):
    keeps_mask = False

    def apply(self, x):
        return x.reshape(x.shape[0], -1)


class Permute(_Single):
    keeps_mask = False

    def __init__(self, dims):
        super().__init__()
        self.dims = (0,) + tuple(int(d) for d in dims)

    def apply(self, x):
        return x.permute(self.dims)


class RepeatVector(_Single):
    keeps_mask = False

    def __init__(self, n):
        super().__init__()
        self.n = int(n)

    def apply(self, x):
        return x.unsqueeze(1).expand(x.shape[0], self.n, x.shape[1])


class GlobalPooling1D(nn.Module):
    """GlobalAveragePooling1D (mask-aware, as Keras) / GlobalMaxPooling1D, channels_last."""

    def __init__(self, average: bool, keepdims: bool):
        super().__init__()
        self.average, self.keepdims = average, keepdims

    def forward(self, inputs, masks):
        x, mask = inputs[0], masks[0]
        if self.average:
            if mask is None:
                y = x.mean(dim=1, keepdim=self.keepdims)
            else:
                m = mask.unsqueeze(-1).to(x.dtype)
                y = (x * m).sum(dim=1, keepdim=self.keepdims) / m.sum(dim=1, keepdim=self.keepdims)
        else:
            y = x.amax(dim=1, keepdim=self.keepdims)
        return [y], [None]


def _same_padding(length_in: int, kernel: int, stride: int, dilation: int):
    effective = (kernel - 1) * dilation + 1
    out = -(-length_in // stride)
    total = max((out - 1) * stride + effective - length_in, 0)
    return total // 2, total - total // 2


class Conv1D(_Single):
    keeps_mask = False

    def __init__(self, kernel, bias, stride, padding, dilation, groups, activation):
        super().__init__()
        self.weight = kernel  # torch layout (out, in / groups, k)
        self.bias = bias
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.activation = activation

    def keras_groups(self):
        return [("", [self.weight.permute(2, 1, 0)] + ([self.bias] if self.bias is not None else []))]

    def apply(self, x):
        h = x.transpose(1, 2)
        k = self.weight.shape[-1]
        if self.padding == "causal":
            h = F.pad(h, ((k - 1) * self.dilation, 0))
        elif self.padding == "same":
            h = F.pad(h, _same_padding(h.shape[-1], k, self.stride, self.dilation))
        y = F.conv1d(h, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)
        return self.activation(y.transpose(1, 2))


class Pooling1D(_Single):
    keeps_mask = False

    def __init__(self, average: bool, pool: int, stride: int, padding: str):
        super().__init__()
        self.average, self.pool, self.stride, self.padding = average, pool, stride, padding

    def apply(self, x):
        h = x.transpose(1, 2)
        if self.padding == "same":
            left, right = _same_padding(h.shape[-1], self.pool, self.stride, 1)
            if self.average:  # Keras averages over the real elements of a padded window
                ones = torch.ones_like(h[:, :1])
                num = F.avg_pool1d(F.pad(h, (left, right)), self.pool, self.stride) * self.pool
                den = F.avg_pool1d(F.pad(ones, (left, right)), self.pool, self.stride) * self.pool
                return (num / den).transpose(1, 2)
            h = F.pad(h, (left, right), value=-math.inf)
        y = F.avg_pool1d(h, self.pool, self.stride) if self.average else F.max_pool1d(h, self.pool, self.stride)
        return y.transpose(1, 2)


class Normalization(_Single):
    """BatchNormalization (inference statistics) and LayerNormalization over the last axis."""

    def __init__(self, kind, gamma, beta, mean, var, epsilon, axes):
        super().__init__()
        self.kind, self.epsilon, self.axes = kind, epsilon, axes
        self.gamma, self.beta = gamma, beta
        self.register_buffer("moving_mean", mean)
        self.register_buffer("moving_variance", var)

    def keras_groups(self):
        own = [t for t in (self.gamma, self.beta) if t is not None]
        if self.kind == "batch":
            own += [self.moving_mean, self.moving_variance]
        return [("", own)]

    def apply(self, x):
        width = next((t.shape[-1] for t in (self.gamma, self.beta, self.moving_mean) if t is not None), x.shape[-1])
        if width != x.shape[-1]:  # a (1,) weight would broadcast silently
            raise ValueError(f"{self.kind} normalization weights have {width} features; the input has {x.shape[-1]}")
        if self.kind == "batch":
            y = (x - self.moving_mean) * torch.rsqrt(self.moving_variance + self.epsilon)
        else:
            mean = x.mean(dim=self.axes, keepdim=True)
            var = x.var(dim=self.axes, keepdim=True, unbiased=False)
            y = (x - mean) * torch.rsqrt(var + self.epsilon)
        if self.gamma is not None:
            y = y * self.gamma
        if self.beta is not None:
            y = y + self.beta
        return y


class Merge(nn.Module):
    """Concatenate / Add / Subtract / Multiply / Average / Maximum / Minimum.

    Output masks follow the producer: Keras 3 ORs the masks (elementwise merges give None when
    any input has none; Concatenate counts a missing mask as all True); Keras 2 ANDs the masks
    that are present."""

    def __init__(self, op: str, axis: int = -1, keras3: bool = True):
        super().__init__()
        self.op, self.axis, self.keras3 = op, axis, keras3

    def forward(self, inputs, masks):
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

    def _mask(self, inputs, masks):
        present = [m for m in masks if m is not None]
        if not present:
            return None
        if not self.keras3:
            mask = present[0]
            for m in present[1:]:
                mask = mask & m
            return mask
        if self.op != "concatenate":
            if len(present) != len(masks):
                return None
            mask = present[0]
            for m in present[1:]:
                mask = mask | m
            return mask
        full = [m if m is not None else torch.ones(x.shape[:-1], dtype=torch.bool, device=x.device)
                for x, m in zip(inputs, masks)]
        mask = full[0]
        for m in full[1:]:
            mask = mask | m
        return mask


class TimeDistributed(nn.Module):
    """Applies the inner module to every timestep: (B, T, ...) -> (B*T, ...) -> (B, T, ...)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.layer = inner

    def keras_groups(self):
        return [("/".join(p for p in ("layer", sub) if p), ws) for sub, ws in keras_groups(self.layer)]

    def forward(self, inputs, masks):
        x = inputs[0]
        b, t = x.shape[0], x.shape[1]
        (y,), _ = self.layer([x.reshape((b * t,) + tuple(x.shape[2:]))], [None])
        return [y.reshape((b, t) + tuple(y.shape[1:]))], [masks[0]]


class Recurrent(nn.Module):
    """A cudnn_rnn layer (or Bidirectional) in the graph: inputs[0] is the sequence, inputs[1:]
    the initial states; outputs [output, *states] as Keras; the output mask is the input mask
    when return_sequences (Keras RNN.compute_mask)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def keras_groups(self):
        if isinstance(self.layer, rnn_layers.Bidirectional):
            return [("forward_layer/cell", self.layer.forward_layer.layer_weights(0)),
                    ("backward_layer/cell", self.layer.backward_layer.layer_weights(0))]
        return [("cell", self.layer.layer_weights(0))]

    def forward(self, inputs, masks):
        initial = list(inputs[1:]) or None
        out = self.layer(inputs[0], mask=masks[0], initial_state=initial)
        outs = out if isinstance(out, list) else [out]
        seq_mask = masks[0] if self.layer.return_sequences else None
        n_outputs = 2 if isinstance(self.layer, rnn_layers.Bidirectional) and self.layer.merge_mode is None else 1
        return outs, [seq_mask] * n_outputs + [None] * (len(outs) - n_outputs)


def keras_groups(module: nn.Module):
    """The module's weights as Keras stores them: [(sub-path, [tensors in Keras order])]; the
    inverse of what its builder took."""
    fn = getattr(module, "keras_groups", None)
    return fn() if fn is not None else []


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
@builder("InputLayer")
def build_input(cfg, ctx):
    return Identity()


@builder("Dropout", "SpatialDropout1D", "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization")
def build_dropout(cfg, ctx):
    rate = Values(cfg, ctx).float("rate", 0.0, 0.0, 1.0) if ctx.spec.class_name in ("Dropout", "SpatialDropout1D") else 0.0
    return Dropout(min(rate, 1.0 - 1e-7), spatial=ctx.spec.class_name == "SpatialDropout1D")


@builder("Dense")
def build_dense(cfg, ctx):
    v = Values(cfg, ctx)
    units, use_bias = v.int("units", lo=1), v.bool("use_bias", True)
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    check_shapes(ctx, "Dense", w, [("in", units), (units,)][: len(w)])
    return Dense(ctx.tensor(w[0]), ctx.tensor(w[1]) if use_bias else None, activation)


@builder("Activation")
def build_activation(cfg, ctx):
    return ActivationLayer(_Activation(activation_name(cfg.get("activation"), ctx), ctx))


@builder("ReLU")
def build_relu(cfg, ctx):
    v = Values(cfg, ctx)
    max_value = v.float("max_value", None)
    if max_value not in (None, 6.0) or v.float("negative_slope", 0.0) or v.float("threshold", 0.0):
        raise ctx.error("ReLU with negative_slope / threshold / max_value other than 6 is not supported")
    return ActivationLayer(_Activation("relu6" if max_value else "relu", ctx))


@builder("Softmax")
def build_softmax(cfg, ctx):
    if Values(cfg, ctx).int("axis", -1, lo=-8, hi=8) != -1:
        raise ctx.error("Softmax over an axis other than the last is not supported")
    return ActivationLayer(_Activation("softmax", ctx))


@builder("Embedding")
def build_embedding(cfg, ctx):
    v = Values(cfg, ctx)
    shape = (v.int("input_dim", lo=1), v.int("output_dim", lo=1))
    mask_zero = v.bool("mask_zero", False)
    (w,) = ctx.weights.take([("", 1)], [[shape]])
    return Embedding(ctx.tensor(w[0]), mask_zero)


@builder("Masking")
def build_masking(cfg, ctx):
    return Masking(Values(cfg, ctx).float("mask_value", 0.0))


@builder("Flatten")
def build_flatten(cfg, ctx):
    _channels_last(cfg, ctx)
    return Flatten()


@builder("Reshape")
def build_reshape(cfg, ctx):
    shape = Values(cfg, ctx).int_list("target_shape", lo=-1, hi=MAX_SIZE)
    if shape.count(-1) > 1 or 0 in shape:
        raise ctx.error(f"Reshape target_shape {shape} is not a shape")
    return Reshape(shape)


@builder("Permute")
def build_permute(cfg, ctx):
    dims = Values(cfg, ctx).int_list("dims", lo=1, hi=8)
    if sorted(dims) != list(range(1, len(dims) + 1)):
        raise ctx.error(f"Permute dims {dims} is not a permutation of 1..{len(dims)}")
    return Permute(dims)


@builder("RepeatVector")
def build_repeat(cfg, ctx):
    return RepeatVector(Values(cfg, ctx).int("n", lo=1, hi=1 << 16))


def _channels_last(cfg, ctx):
    if cfg.get("data_format", "channels_last") not in ("channels_last", None):
        raise ctx.error(f"data_format={str(cfg.get('data_format'))[:40]!r} is not supported (channels_last only)")


@builder("GlobalAveragePooling1D", "GlobalMaxPooling1D", "GlobalAvgPool1D", "GlobalMaxPool1D")
def build_global_pool(cfg, ctx):
    _channels_last(cfg, ctx)
    return GlobalPooling1D("Av" in ctx.spec.class_name, Values(cfg, ctx).bool("keepdims", False))


@builder("MaxPooling1D", "AveragePooling1D", "MaxPool1D", "AvgPool1D")
def build_pool(cfg, ctx):
    _channels_last(cfg, ctx)
    v = Values(cfg, ctx)
    pool = v.ints("pool_size", 2, hi=1 << 16)
    return Pooling1D("Av" in ctx.spec.class_name, pool, v.ints("strides", pool, hi=1 << 16),
                     v.str("padding", "valid", ("valid", "same")))


@builder("Conv1D", "Convolution1D")
def build_conv1d(cfg, ctx):
    _channels_last(cfg, ctx)
    v = Values(cfg, ctx)
    filters, size = v.int("filters", lo=1), v.ints("kernel_size", hi=1 << 16)
    groups, use_bias = v.int("groups", 1, lo=1), v.bool("use_bias", True)
    strides, dilation = v.ints("strides", 1, hi=1 << 16), v.ints("dilation_rate", 1, hi=1 << 16)
    padding = v.str("padding", "valid", ("valid", "same", "causal"))
    if filters % groups:
        raise ctx.error(f"Conv1D filters={filters} is not divisible by groups={groups}")
    activation = _Activation(activation_name(cfg.get("activation"), ctx), ctx)
    (w,) = ctx.weights.take([("", 2 if use_bias else 1)])
    check_shapes(ctx, "Conv1D", w, [(size, "in", filters), (filters,)][: len(w)])
    kernel = torch.as_tensor(np.ascontiguousarray(w[0])).permute(2, 1, 0)  # (k, in/g, out) -> (out, in/g, k)
    return Conv1D(ctx.tensor(kernel.numpy()), ctx.tensor(w[1]) if use_bias else None, strides, padding, dilation,
                  groups, activation)


def _last_axis(cfg, ctx, what):
    axis = cfg.get("axis", -1)
    if isinstance(axis, list) and len(axis) == 1:
        axis = axis[0]
    if isinstance(axis, bool) or axis not in (-1, 2):
        raise ctx.error(f"{what} axis={str(axis)[:40]} is not supported (last axis only)")


def _normalization(cfg, ctx, kind: str, statistics: int):
    """The shared part of BatchNormalization / LayerNormalization: last axis only, optional
    gamma and beta, then `statistics` more vectors (moving mean and variance), all (features,)."""
    what = ctx.spec.class_name
    _last_axis(cfg, ctx, what)
    v = Values(cfg, ctx)
    scale, center = v.bool("scale", True), v.bool("center", True)
    epsilon = v.float("epsilon", 1e-3, 0.0, 1.0)
    if v.bool("rms_scaling", False):
        raise ctx.error(f"{what} rms_scaling=True is not supported")
    (w,) = ctx.weights.take([("", int(scale) + int(center) + statistics)])
    check_shapes(ctx, what, w, [("features",)] * len(w))
    w = list(w)
    gamma = ctx.tensor(w.pop(0)) if scale else None
    beta = ctx.tensor(w.pop(0)) if center else None
    mean, var = (torch.as_tensor(a, dtype=ctx.dtype) for a in w) if statistics else (None, None)
    return Normalization(kind, gamma, beta, mean, var, epsilon, None if statistics else (-1,))


@builder("BatchNormalization")
def build_batchnorm(cfg, ctx):
    return _normalization(cfg, ctx, "batch", 2)


@builder("LayerNormalization")
def build_layernorm(cfg, ctx):
    return _normalization(cfg, ctx, "layer", 0)


_MERGES = {"Concatenate": "concatenate", "Add": "add", "Subtract": "subtract", "Multiply": "multiply",
           "Average": "average", "Maximum": "maximum", "Minimum": "minimum"}


@builder(*_MERGES)
def build_merge(cfg, ctx):
    axis = Values(cfg, ctx).int("axis", -1, lo=-8, hi=8) if ctx.spec.class_name == "Concatenate" else -1
    return Merge(_MERGES[ctx.spec.class_name], axis, keras3=ctx.keras_major >= 3)


@builder("TimeDistributed")
def build_time_distributed(cfg, ctx):
    try:
        cls, inner_cfg = layer_config_of(cfg.get("layer"))
    except ValueError as e:
        raise ctx.error(f"TimeDistributed: {e}") from None
    if cls not in BUILDERS or cls in _RNN_CLASSES or cls == "Bidirectional":
        raise ctx.error(f"TimeDistributed({cls}) is not supported")
    if not isinstance(inner_cfg, dict):
        raise ctx.error("TimeDistributed: the wrapped layer's config is not a JSON object")
    inner_spec = LayerSpec(f"{ctx.spec.name}/{str(inner_cfg.get('name', cls))[:100]}", cls, inner_cfg, [])
    inner_ctx = BuildContext(ctx.path, ctx.keras_version, inner_spec, _SubWeights(ctx.weights, "layer"), ctx.dtype)
    return TimeDistributed(BUILDERS[cls](inner_cfg, inner_ctx))


class _SubWeights:
    """The weights of a wrapped layer, addressed below the wrapper (Keras 3 sub-path)."""

    def __init__(self, outer: LayerWeights, sub: str):
        self.outer, self.sub = outer, sub

    def take(self, groups, shapes=None):
        return self.outer.take([("/".join(p for p in (self.sub, s) if p), n) for s, n in groups], shapes)


# ---------------------------------------------------------------------------------------------
# Keras 3 operations recorded in functional graphs (mostly the mask computations)
# ---------------------------------------------------------------------------------------------
class Op(nn.Module):
    """A keras.ops function in the graph: tensors in, one tensor out, no mask."""

    def __init__(self, fn: Callable, description: str):
        super().__init__()
        self.fn, self.description = fn, description

    def forward(self, inputs, masks):
        return [self.fn(*inputs)], [None]

    def extra_repr(self):
        return self.description


def _op_constant(ctx, default=None):
    consts = ctx.spec.calls[0].constants if ctx.spec.calls else []
    return consts[0] if consts else default


def _axis_reduce(reduce):
    def build(cfg, ctx):
        axis, keepdims = cfg.get("axis"), bool(cfg.get("keepdims", False))
        if axis is None:
            return Op(lambda x: reduce(x.reshape(-1), 0, False) if not keepdims else reduce(x, None, True), "all axes")
        axes = tuple(axis) if isinstance(axis, list) else (axis,)

        def fn(x):
            for a in sorted((a % x.dim() for a in axes), reverse=True):
                x = reduce(x, a, keepdims)
            return x

        return Op(fn, f"axis={axis}, keepdims={keepdims}")

    return build


_OPS: Dict[str, Callable] = {
    "NotEqual": lambda cfg, ctx: _binary(torch.ne, ctx),
    "Equal": lambda cfg, ctx: _binary(torch.eq, ctx),
    "Greater": lambda cfg, ctx: _binary(torch.gt, ctx),
    "Less": lambda cfg, ctx: _binary(torch.lt, ctx),
    "LogicalOr": lambda cfg, ctx: _binary(torch.logical_or, ctx),
    "LogicalAnd": lambda cfg, ctx: _binary(torch.logical_and, ctx),
    "LogicalNot": lambda cfg, ctx: Op(torch.logical_not, "not"),
    "Any": _axis_reduce(lambda x, a, k: x.any(dim=a, keepdim=k) if a is not None else x.any()),
    "All": _axis_reduce(lambda x, a, k: x.all(dim=a, keepdim=k) if a is not None else x.all()),
    "ExpandDims": lambda cfg, ctx: Op(lambda x: x.unsqueeze(int(cfg["axis"]) if int(cfg["axis"]) >= 0 else x.dim() + 1 + int(cfg["axis"])),
                                      f"axis={cfg.get('axis')}"),
    "ZerosLike": lambda cfg, ctx: Op(lambda x: torch.zeros_like(x, dtype=_dtype_of(cfg, x)), "zeros_like"),
    "OnesLike": lambda cfg, ctx: Op(lambda x: torch.ones_like(x, dtype=_dtype_of(cfg, x)), "ones_like"),
    "Concatenate": lambda cfg, ctx: Op(lambda *xs: torch.cat(xs, dim=int(cfg.get("axis", 0))), f"axis={cfg.get('axis')}"),
    "Cast": lambda cfg, ctx: Op(lambda x: x.to(_dtype_of(cfg, x)), f"dtype={cfg.get('dtype')}"),
}


def _dtype_of(cfg, x):
    name = cfg.get("dtype")
    if not name:
        return x.dtype
    return {"bool": torch.bool, "float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
            "int64": torch.int64}.get(str(name), x.dtype)


def _binary(fn, ctx):
    constant = _op_constant(ctx)
    if constant is None:
        return Op(fn, fn.__name__)
    return Op(lambda x: fn(x, torch.as_tensor(constant, dtype=x.dtype if not isinstance(constant, bool) else torch.bool)),
              f"{fn.__name__} {constant!r}")


def build_op(spec: LayerSpec, ctx: "BuildContext") -> nn.Module:
    build = _OPS.get(spec.class_name)
    if build is None:
        raise ctx.error(f"Keras operation {spec.module[:60]}.{spec.class_name[:60]} is not supported "
                        f"(supported: {', '.join(sorted(_OPS))})")
    axis = spec.config.get("axis")
    if axis is not None and not isinstance(axis, list):
        Values(spec.config, ctx).int("axis", lo=-8, hi=8)
    elif axis is not None:
        Values(spec.config, ctx).int_list("axis", lo=-8, hi=8)
    if spec.class_name == "ExpandDims" and axis is None:
        raise ctx.error("ExpandDims has no axis")
    if "dtype" in spec.config and spec.config["dtype"] is not None and not isinstance(spec.config["dtype"], (str, dict)):
        raise ctx.error(f"config dtype={str(spec.config['dtype'])[:40]!r}; expected a dtype name")
    constant = _op_constant(ctx)
    if constant is not None and (not isinstance(constant, (int, float)) or
                                 (isinstance(constant, float) and not math.isfinite(constant))):
        raise ctx.error(f"the constant operand {str(constant)[:40]!r} is not a finite number")
    return build(spec.config, ctx)


# ---------------------------------------------------------------------------------------------
# recurrent layers
# ---------------------------------------------------------------------------------------------
_RNN_CLASSES = {"LSTM": "lstm", "GRU": "gru", "SimpleRNN": "simple_rnn", "CuDNNLSTM": "lstm", "CuDNNGRU": "gru",
                "LSTMV1": "lstm", "GRUV1": "gru"}
_TRAINING_ONLY = ("kernel_initializer", "recurrent_initializer", "bias_initializer", "unit_forget_bias")


def _rnn_options(class_name: str, cfg: dict, ctx: BuildContext) -> dict:
    """Our constructor arguments from a Keras RNN config, with the producer's defaults."""
    cell = _RNN_CLASSES[class_name]
    cudnn = class_name.startswith("CuDNN")
    v = Values(cfg, ctx)
    opts = dict(
        return_sequences=v.bool("return_sequences", False),
        return_state=v.bool("return_state", False),
        go_backwards=v.bool("go_backwards", False),
        stateful=v.bool("stateful", False),
        zero_output_for_mask=v.bool("zero_output_for_mask", False),
    )
    if v.bool("time_major", False):
        raise ctx.error("time_major=True is not supported (the layers are batch-major)")
    if cudnn:  # fixed tanh / sigmoid, the cuDNN GRU form, no dropout, no masking
        opts.update(activation="tanh", use_bias=True)
        if cell != "simple_rnn":
            opts["recurrent_activation"] = "sigmoid"
        if cell == "gru":
            opts["reset_after"] = True
        return opts
    # Keras <= 2.2.4 defaulted to hard_sigmoid gates; Keras 2 GRU to reset_after=False.
    legacy_gates = ctx.keras_version is not None and ctx.keras_major < 3 and _version_tuple(ctx.keras_version) <= (2, 2, 4)
    opts["activation"] = activation_name(cfg.get("activation", "tanh"), ctx)
    opts["use_bias"] = v.bool("use_bias", True)
    opts["dropout"] = v.float("dropout", 0.0, 0.0, 1.0)
    opts["recurrent_dropout"] = v.float("recurrent_dropout", 0.0, 0.0, 1.0)
    if cell != "simple_rnn":
        default = "hard_sigmoid" if legacy_gates else "sigmoid"
        opts["recurrent_activation"] = activation_name(cfg.get("recurrent_activation", default), ctx)
    if cell == "gru":
        opts["reset_after"] = v.bool("reset_after", ctx.keras_major >= 3 and class_name == "GRU")
    return opts


def _version_tuple(version: str) -> tuple:
    parts = []
    for p in str(version).split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _rnn_weight_count(class_name: str, opts: dict) -> int:
    return 3 if (class_name.startswith("CuDNN") or opts.get("use_bias", True)) else 2


def _convert_cudnn_weights(cell: str, weights: List[np.ndarray], units: int, ctx) -> List[np.ndarray]:
    """Keras's own _convert_rnn_weights for CuDNNLSTM / CuDNNGRU -> LSTM / GRU(reset_after=True):
    each (I, u) block of the stored kernel holds cuDNN's row-major (u, I) matrix, so it is
    reshaped (Fortran order) rather than transposed; recurrent blocks are used as stored
    transposed per gate; the (8u,) / (6u,) bias is input biases then recurrent biases."""
    kernel, recurrent, bias = weights
    gates = 4 if cell == "lstm" else 3
    if bias.shape != (2 * gates * units,):
        raise ctx.error(f"CuDNN{cell.upper()} bias has shape {bias.shape}; expected ({2 * gates * units},)")
    k = np.concatenate([b.T.reshape(b.shape, order="F") for b in np.hsplit(kernel, gates)], axis=1)
    r = np.concatenate([b.T for b in np.hsplit(recurrent, gates)], axis=1)
    if cell == "lstm":
        b = bias[: 4 * units] + bias[4 * units :]
    else:
        b = bias.reshape(2, 3 * units)
    return [k, r, b]


def _build_rnn_layer(class_name: str, cfg: dict, ctx: BuildContext, weights: List[np.ndarray]) -> rnn_layers._RNNBase:
    cell = _RNN_CLASSES[class_name]
    opts = _rnn_options(class_name, cfg, ctx)
    units = Values(cfg, ctx).int("units", lo=1)
    if len(weights) < 2 or weights[0].ndim != 2:
        raise ctx.error(f"{class_name} weights are malformed: shapes {[w.shape for w in weights]}")
    if class_name.startswith("CuDNN") or (cell != "simple_rnn" and weights[-1].ndim == 1 and
                                         weights[-1].shape[0] == 2 * (4 if cell == "lstm" else 3) * units):
        weights = _convert_cudnn_weights(cell, weights, units, ctx)  # also CuDNN weights under a plain class
    input_size = weights[0].shape[0]
    if input_size < 1:
        raise ctx.error(f"{class_name} kernel has shape {weights[0].shape}; no input features")
    gates = {"lstm": 4, "gru": 3, "simple_rnn": 1}[cell]
    expect = [(input_size, gates * units), (units, gates * units)]
    if opts["use_bias"]:
        expect.append((2, gates * units) if cell == "gru" and opts["reset_after"] else (gates * units,))
    got = [tuple(w.shape) for w in weights]
    if got != expect:
        if cell == "gru" and opts.get("reset_after") is False and len(got) == 3 and got[2] == (2, gates * units):
            opts["reset_after"] = True  # the bias says reset_after (tf.keras 2 GRU default)
            expect[2] = got[2]
        if got != expect:
            raise ctx.error(f"{class_name}(units={units}) weights have shapes {got}; the config implies {expect}")
    cls = {"lstm": rnn_layers.LSTM, "gru": rnn_layers.GRU, "simple_rnn": rnn_layers.SimpleRNN}[cell]
    # zeros: the Keras initializers (an orthogonal QR among them) would only be overwritten
    layer = cls(input_size, units, dtype=ctx.dtype, kernel_initializer="zeros", recurrent_initializer="zeros", **opts)
    layer.kernel_initializer, layer.recurrent_initializer = "glorot_uniform", "orthogonal"
    with torch.no_grad():
        for param, array in zip(layer.layer_weights(0), weights):
            param.copy_(torch.as_tensor(array, dtype=ctx.dtype))
    return layer


@builder(*_RNN_CLASSES)
def build_rnn(cfg, ctx):
    cls = ctx.spec.class_name
    (w,) = ctx.weights.take([("cell" if not cls.startswith("CuDNN") else "", _rnn_weight_count(cls, _rnn_options(cls, cfg, ctx)))])
    return Recurrent(_build_rnn_layer(cls, cfg, ctx, w))


@builder("Bidirectional")
def build_bidirectional(cfg, ctx):
    try:
        fcls, fcfg = layer_config_of(cfg.get("layer"))
        bcls, bcfg = layer_config_of(cfg["backward_layer"]) if cfg.get("backward_layer") else (fcls, dict(fcfg))
        fcfg, bcfg = dict(fcfg), dict(bcfg)
    except ValueError as e:
        raise ctx.error(f"Bidirectional: {e}") from None
    for c in (fcls, bcls):
        if c not in _RNN_CLASSES:
            raise ctx.error(f"Bidirectional({c}) is not supported")
    if not cfg.get("backward_layer"):
        bcfg["go_backwards"] = not bcfg.get("go_backwards", False)
    sub = lambda c: "" if c.startswith("CuDNN") else "/cell"  # noqa: E731
    nf = _rnn_weight_count(fcls, _rnn_options(fcls, fcfg, ctx))
    nb = _rnn_weight_count(bcls, _rnn_options(bcls, bcfg, ctx))
    wf, wb = ctx.weights.take([("forward_layer" + sub(fcls), nf), ("backward_layer" + sub(bcls), nb)])
    forward = _build_rnn_layer(fcls, fcfg, ctx, wf)
    backward = _build_rnn_layer(bcls, bcfg, ctx, wb)
    merge = cfg.get("merge_mode", "concat")
    if merge not in ("concat", "sum", "mul", "ave", None):
        raise ctx.error(f"Bidirectional merge_mode={str(merge)[:40]!r}; expected concat, sum, mul, ave or null")
    return Recurrent(rnn_layers.Bidirectional(forward, merge_mode=merge, backward_layer=backward))
