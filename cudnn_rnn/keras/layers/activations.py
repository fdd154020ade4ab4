"""Activations: a Keras activation config value as a name (activation_name, which the recurrent
builders use too, with hard_sigmoid resolved by producer version), the torch function of every
name keras.activations has (_Activation), and the activation layers (Activation, ReLU, Softmax,
ELU, LeakyReLU, PReLU, and Keras 2's ThresholdedReLU)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...cells import ACTIVATION_ALIASES
from .base import _Single
from .registry import BuildContext, builder
from .values import Values, check_shapes


def activation_name(value, ctx: BuildContext) -> str:
    """A Keras activation config value as a name; hard_sigmoid resolved by producer version."""
    if value is None:
        return "linear"
    if isinstance(value, dict):
        value = value.get("config") if isinstance(value.get("config"), str) else value.get("class_name")
    if not isinstance(value, str):
        raise ctx.error(f"unsupported activation {str(value)[:60]!r}")
    value = ACTIVATION_ALIASES.get(value, value)
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
    "celu": F.celu,
    "squareplus": lambda x: (x + torch.sqrt(x * x + 4.0)) / 2,
    "soft_shrink": lambda x: F.softshrink(x, 0.5),
    "hard_shrink": lambda x: F.hardshrink(x, 0.5),
    "hard_tanh": F.hardtanh,
    "sparse_plus": lambda x: torch.where(x <= -1, torch.zeros_like(x), torch.where(x < 1, 0.25 * (x + 1) ** 2, x)),
    "sparse_sigmoid": lambda x: torch.clamp(0.5 * (x + 1), 0.0, 1.0),
    "glu": lambda x: F.glu(x, dim=-1),
    "sparsemax": lambda x: _sparsemax(x, -1),
}


def _sparsemax(x: Tensor, axis: int) -> Tensor:
    """keras.activations.sparsemax as every Keras 3 backend computes it: the support as in
    Martins & Astudillo, but the threshold from the sum of the cumulative sums over the support
    (the paper takes the cumulative sum at its end)."""
    z, _ = torch.sort(x, dim=axis, descending=True)
    shape = [1] * x.dim()
    shape[axis] = -1
    r = torch.arange(1, x.shape[axis] + 1, device=x.device, dtype=x.dtype).view(shape)
    cumulative = torch.cumsum(z, dim=axis)
    support = z - (cumulative - 1) / r > 0
    k = support.sum(dim=axis, keepdim=True)
    tau = (torch.where(support, cumulative, torch.zeros_like(cumulative)).sum(dim=axis, keepdim=True) - 1) / k
    return torch.clamp(x - tau, min=0)


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


def keras_relu(x: Tensor, negative_slope: float, max_value: Optional[float], threshold: float) -> Tensor:
    """keras.activations.relu with every option, as Keras 3 computes it."""
    negative = 1.0
    if negative_slope != 0.0:
        if max_value is None and threshold == 0:
            return F.leaky_relu(x, negative_slope)
        negative = F.relu(threshold - x) if threshold != 0 else F.relu(-x)
    if threshold != 0:
        y = torch.where(x > threshold, x, torch.zeros_like(x))
    else:
        y = F.relu(x)
    if max_value is not None:
        y = torch.clamp(y, 0.0, max_value)
    return y - negative_slope * negative if negative_slope != 0.0 else y


class ActivationLayer(_Single):
    def __init__(self, activation):
        super().__init__()
        self.activation = activation

    def apply(self, x):
        return self.activation(x)


class ReLU(_Single):
    def __init__(self, negative_slope: float, max_value: Optional[float], threshold: float):
        super().__init__()
        self.negative_slope, self.max_value, self.threshold = negative_slope, max_value, threshold

    def apply(self, x):
        return keras_relu(x, self.negative_slope, self.max_value, self.threshold)


class ELU(_Single):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def apply(self, x):
        return F.elu(x, self.alpha)


class ThresholdedReLU(_Single):
    def __init__(self, theta: float):
        super().__init__()
        self.theta = theta

    def apply(self, x):
        return torch.where(x > self.theta, x, torch.zeros_like(x))


class PReLU(_Single):
    """max(x, 0) - alpha * max(-x, 0); alpha has the input's shape without the batch axis, with
    1 on the shared axes."""

    def __init__(self, alpha: nn.Parameter):
        super().__init__()
        self.alpha = alpha

    def keras_groups(self):
        return [("", [self.alpha])]

    def apply(self, x):
        if x.dim() - 1 != self.alpha.dim():
            raise ValueError(f"PReLU alpha has shape {tuple(self.alpha.shape)}; the input {tuple(x.shape)} has "
                             f"{x.dim() - 1} axes after the batch")
        return F.relu(x) - self.alpha * F.relu(-x)


class Softmax(nn.Module):
    """keras.layers.Softmax: over one axis or several, the masked positions (a mask broadcast
    against the input from the right) set to a large negative number first; the mask passes."""

    def __init__(self, axes: Sequence[int]):
        super().__init__()
        self.axes = tuple(axes)

    def forward(self, inputs, masks):
        x, mask = inputs[0], masks[0]
        if mask is not None:
            large = -3e4 if x.dtype == torch.float16 else -1e9
            x = torch.where(mask.bool(), x, torch.as_tensor(large, dtype=x.dtype, device=x.device))
        if len(self.axes) == 1:
            y = F.softmax(x, dim=self.axes[0])
        else:
            y = torch.exp(x - torch.logsumexp(x, dim=self.axes, keepdim=True))
        return [y], [mask]


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------
@builder("Activation", weights=False)
def build_activation(cfg, ctx):
    return ActivationLayer(_Activation(activation_name(cfg.get("activation"), ctx), ctx))


@builder("ReLU", weights=False)
def build_relu(cfg, ctx):
    v = Values(cfg, ctx)
    max_value = v.float("max_value", None, 0.0)
    # (files of Keras 2.0 name the slope alpha, as its backend's relu(x, alpha, max_value) did)
    return ReLU(v.float("negative_slope", v.float("alpha", 0.0, 0.0), 0.0), max_value, v.float("threshold", 0.0))


@builder("ELU", weights=False)
def build_elu(cfg, ctx):
    return ELU(Values(cfg, ctx).float("alpha", 1.0))


@builder("LeakyReLU", weights=False)
def build_leaky_relu(cfg, ctx):
    v = Values(cfg, ctx)  # Keras 3 says negative_slope, Keras 2 / tf.keras alpha; both default to 0.3
    return ReLU(v.float("negative_slope", v.float("alpha", 0.3)), None, 0.0)


@builder("ThresholdedReLU", weights=False)
def build_thresholded_relu(cfg, ctx):
    return ThresholdedReLU(Values(cfg, ctx).float("theta", 1.0))


@builder("PReLU")
def build_prelu(cfg, ctx):
    (w,) = ctx.weights.take([("", 1)])
    if not 1 <= len(w[0].shape) <= 7:
        raise ctx.error(f"PReLU alpha has shape {tuple(w[0].shape)}; expected the input's shape without the batch axis")
    shared = cfg.get("shared_axes")
    if shared is not None:
        axes = shared if isinstance(shared, list) else [shared]
        axes = Values({"shared_axes": axes}, ctx).int_list("shared_axes", lo=1, hi=len(w[0].shape))
        check_shapes(ctx, "PReLU", w, [tuple(1 if d + 1 in axes else f"d{d}" for d in range(len(w[0].shape)))])
    return PReLU(ctx.tensor(w[0]))


@builder("Softmax", weights=False)
def build_softmax(cfg, ctx):
    return Softmax(Values(cfg, ctx).axes())
