"""The layer registry: BUILDERS (Keras class name -> builder), @builder, the BuildContext a
builder is given, and the protocol every built module follows. The bottom of the builders: it
imports none of them.

Every built module has the same call protocol, which the graph executor (model.py) relies on:

    forward(inputs: List[Tensor], masks: List[Optional[Tensor]]) -> (outputs, output_masks)

masks follow Keras's propagation rules (Embedding mask_zero, Masking, RNN compute_mask, merge
layers AND their masks, most other layers pass the mask through or drop it). A module whose
layer's calls differ by their keyword arguments (ReversibleEmbedding's reverse=) sets
`takes_call = True` and is also given `call=`, the index of the layer's call it runs (None from a
wrapper). A module that holds
weights also has keras_groups(): its weights as Keras stores them (export.py writes them back).

Adding a layer is one function decorated with @builder("ClassName") that reads the config, takes
its weights from `ctx` and returns a module; it lives in the file of its family (pooling.py,
convolution.py, ...: the list is in this package's __init__). BUILDERS is filled as those files
are imported: take it from the package (cudnn_rnn.keras.layers), which imports them all.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Union

import numpy as np
import torch
from torch import nn

from ..errors import ConversionError
from ..graph.spec import LayerSpec
from ..files.weights import LayerWeights

BUILDERS: Dict[str, Callable] = {}
HOLDS_WEIGHTS: Dict[str, Union[bool, Callable[[dict], bool]]] = {}


def builder(*class_names, weights: Union[bool, Callable[[dict], bool]] = True):
    """Registers the decorated function as the builder of `class_names`. `weights` says whether
    a layer of the class holds weights: True, False, or a function of its config (Attention holds
    a scale only with use_scale). Keras 2's weights-only files list their weight groups by the
    order of the layers that hold weights, so the loader needs to know before it builds."""
    def register(fn):
        for name in class_names:
            BUILDERS[name] = fn
            HOLDS_WEIGHTS[name] = weights
        return fn

    return register


# The keras.layers classes that are not converted, and why; a loader error names the reason.
REFUSED: Dict[str, str] = {
    "Lambda": "it stores Python code (bytecode), which is never run here",
    "TFSMLayer": "it wraps a TensorFlow SavedModel",
    "JaxLayer": "it wraps JAX code", "FlaxLayer": "it wraps a Flax module",
    "TorchModuleWrapper": "it stores a pickled torch module, and nothing here unpickles",
    "Layer": "the base class of custom layers", "Wrapper": "the base class of custom wrappers",
}
# Cells have no graph node of their own: they are converted inside RNN and Bidirectional.
INSIDE_RNN = ("LSTMCell", "GRUCell", "SimpleRNNCell", "StackedRNNCells")


def holds_weights(class_name: str, config: dict) -> bool:
    """Whether a layer of this class and config holds weights (a class not registered here, a
    custom layer or a nested model, is taken to hold some)."""
    rule = HOLDS_WEIGHTS.get(class_name, True)
    return bool(rule(config)) if callable(rule) else rule


def dtype_name(value) -> Optional[str]:
    """A config's dtype as a name: a string as it is, a DTypePolicy dict's config name (a
    quantized policy's: the float dtype it computes in, source_name), else None."""
    if isinstance(value, dict):  # a DTypePolicy
        inner = value.get("config")
        value = (inner.get("name") or inner.get("source_name")) if isinstance(inner, dict) else None
    return value if isinstance(value, str) else None


def keras_major(version: Optional[str]) -> int:
    """The producer's major version; files without one come from Keras 2 or older."""
    if not version:
        return 2
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return 2


def keras_at_least(version: Optional[str], major: int, minor: int) -> bool:
    """Whether the producer is Keras major.minor or later; a Keras 3 file that names no minor
    version (weights-only files) counts as the newest."""
    if keras_major(version) != major:
        return keras_major(version) > major
    parts = str(version).split(".")
    try:
        return len(parts) < 2 or int(parts[1]) >= minor
    except ValueError:
        return True


@dataclass
class BuildContext:
    path: str
    keras_version: Optional[str]
    spec: LayerSpec
    weights: LayerWeights
    dtype: torch.dtype = torch.float32
    # Builds a model a wrapper holds: (its serialized config {"class_name", "config"}, its
    # weights: a LayerWeights whose child_source finds them) -> a module of the graph call
    # protocol (load.py gives it; None where no model may be nested).
    nested: Optional[Callable[[dict, object], nn.Module]] = None
    # The backend of the Keras that wrote the file, where the file says ("tensorflow", "jax",
    # "torch"): where Keras's backends compute differently (bicubic resizes, Sobel's borders),
    # its numbers.
    backend: Optional[str] = None

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
