"""The layer registry: BUILDERS (Keras class name -> builder), @builder, the BuildContext a
builder is given, and the protocol every built module follows. The bottom of the builders: it
imports none of them.

Every built module has the same call protocol, which the graph executor (model.py) relies on:

    forward(inputs: List[Tensor], masks: List[Optional[Tensor]]) -> (outputs, output_masks)

masks follow Keras's propagation rules (Embedding mask_zero, Masking, RNN compute_mask, merge
layers AND their masks, most other layers pass the mask through or drop it). A module that holds
weights also has keras_groups(): its weights as Keras stores them (export.py writes them back).

Adding a layer is one function decorated with @builder("ClassName") that reads the config, takes
its weights from `ctx` and returns a module; it lives in the module of its concern
(basic_layers.py, sequence_layers.py, recurrent.py). BUILDERS is filled as those modules are
imported: take it from builders.py, which imports them all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np
import torch
from torch import nn

from .errors import ConversionError
from .graph import LayerSpec
from .weights import LayerWeights

BUILDERS: Dict[str, Callable] = {}


def builder(*class_names):
    def register(fn):
        for name in class_names:
            BUILDERS[name] = fn
        return fn

    return register


def keras_major(version: Optional[str]) -> int:
    """The producer's major version; files without one come from Keras 2 or older."""
    if not version:
        return 2
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 2


@dataclass
class BuildContext:
    path: str
    keras_version: Optional[str]
    spec: LayerSpec
    weights: LayerWeights
    dtype: torch.dtype = torch.float32

    @property
    def keras_major(self) -> int:
        return keras_major(self.keras_version)

    def error(self, message: str) -> ConversionError:
        return ConversionError(self.path, message, self.spec.name)

    def tensor(self, array: np.ndarray) -> nn.Parameter:
        # (np.array, not np.ascontiguousarray: that turns a 0-d weight, Attention's scale, into shape (1,))
        return nn.Parameter(torch.as_tensor(np.array(array, order="C"), dtype=self.dtype))


def layer_config_of(serialized) -> tuple:
    """(class_name, config) of a serialized inner layer ({"class_name", "config"})."""
    if not isinstance(serialized, dict) or not isinstance(serialized.get("class_name"), str) \
            or not isinstance(serialized.get("config") or {}, dict):
        raise ValueError(f"not a serialized layer: {str(serialized)[:200]}")
    return serialized["class_name"], serialized.get("config") or {}


def keras_groups(module: nn.Module):
    """The module's weights as Keras stores them: [(sub-path, [tensors in Keras order])]; the
    inverse of what its builder took."""
    fn = getattr(module, "keras_groups", None)
    return fn() if fn is not None else []
