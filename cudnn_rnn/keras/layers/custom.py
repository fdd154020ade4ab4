"""Layers of the user's own classes: load_keras(..., custom_layers={"ClassName": builder}).

A builder is called as builder(config, weights) with the layer's Keras config (a dict, the
user's own copy) and every weight the file holds for the layer (numpy arrays, in the order
LayerWeights.take_all gives), and returns a torch.nn.Module. That module is called with the
layer's input tensors positionally (and `mask=`, the input mask or a list of them, when its
forward takes a `mask` argument) and returns a tensor or a list / tuple of tensors; its outputs
carry no mask. The custom classes take part in the same registry lookup as the built-in ones
(a custom builder wins over a built-in one of the same class name).
"""
from __future__ import annotations

import copy
import inspect
from typing import Callable, Dict, Mapping, Optional

from torch import Tensor, nn

from .registry import BuildContext


class CustomLayer(nn.Module):
    """The graph's call protocol around a module a custom_layers builder returned."""

    def __init__(self, module: nn.Module, class_name: str, layer_name: str):
        super().__init__()
        self.module = module
        self.class_name, self.layer_name = class_name, layer_name
        try:
            self.takes_mask = "mask" in inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            self.takes_mask = False

    def keras_groups(self):
        raise ValueError(f"layer '{self.layer_name}' ({self.class_name}) was built by a custom_layers builder: "
                         "save_keras cannot write its weights back")

    def forward(self, inputs, masks):
        kwargs = {"mask": masks[0] if len(masks) == 1 else list(masks)} if self.takes_mask else {}
        out = self.module(*inputs, **kwargs)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if not outs or not all(isinstance(t, Tensor) for t in outs):
            raise TypeError(f"the custom module of layer '{self.layer_name}' ({self.class_name}) must return a tensor "
                            f"or a list of tensors; got {type(out).__name__}")
        return outs, [None] * len(outs)

    def extra_repr(self):
        return f"{self.class_name}, custom"


def custom_builder(class_name: str, user_builder: Callable) -> Callable:
    """A registry builder (cfg, ctx) -> module around the user's builder(config, weights)."""

    def build(cfg: dict, ctx: BuildContext) -> nn.Module:
        weights = [w.copy() for w in ctx.weights.take_all()]
        try:
            module = user_builder(copy.deepcopy(cfg), weights)
        except Exception as e:  # noqa: BLE001 - the user's code: say whose it is
            raise ctx.error(f"the custom_layers builder for {class_name} failed ({type(e).__name__}: "
                            f"{str(e)[:300]})") from e
        if not isinstance(module, nn.Module):
            raise ctx.error(f"the custom_layers builder for {class_name} returned {type(module).__name__}; "
                            "expected a torch.nn.Module")
        return CustomLayer(module, class_name, ctx.spec.name)

    return build


def short_name(class_name: str) -> str:
    """A registered class's name without its package ("Custom>AttentionLayer" -> "AttentionLayer"),
    as legacy .h5 configs write classes registered with register_keras_serializable."""
    return class_name.rsplit(">", 1)[-1]


def find_builder(class_name: str, builtins: Mapping[str, Callable], custom: Mapping[str, Callable]):
    """The builder of a layer class: the user's (by class name, or by the name without its
    package), else the built-in one; None when there is neither."""
    return custom.get(class_name) or custom.get(short_name(class_name)) or builtins.get(class_name)


def custom_builders(custom_layers: Optional[Mapping[str, Callable]]) -> Dict[str, Callable]:
    """The registry builders of a custom_layers mapping, checked."""
    if custom_layers is None:
        return {}
    if not isinstance(custom_layers, Mapping):
        raise TypeError(f"custom_layers must map class names to builders; got {type(custom_layers).__name__}")
    out = {}
    for name, fn in custom_layers.items():
        if not isinstance(name, str) or not callable(fn):
            raise TypeError(f"custom_layers must map class names (str) to callables; got {name!r}: "
                            f"{type(fn).__name__}")
        out[name] = custom_builder(name, fn)
        out.setdefault(short_name(name), out[name])  # "pkg>Class" also finds .keras files' "Class"
    return out
