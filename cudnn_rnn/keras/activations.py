"""Activations of the non-recurrent layers (Dense, Conv1D, Activation, ReLU, Softmax): a Keras
activation config value as a name (activation_name, which the recurrent builders use too, with
hard_sigmoid resolved by producer version) and the torch function of each name (_Activation)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..cells import ACTIVATION_ALIASES
from .registry import BuildContext


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

