"""Keras checkpoints (.keras, .weights.h5, legacy .h5, tf.keras 2's SavedModel directories and
TensorFlow weights checkpoints) into torch modules, with only h5py.

The public face: load_keras / rebuild (load.py), save_keras (export.py), load_converted /
save_converted (convert.py), ConversionError, KerasModel, the layer registry BUILDERS
(layers/registry.py) and recurrent_layer (the cudnn_rnn layer a converted model's module runs, or None)."""
from __future__ import annotations

from .layers import BUILDERS
from .convert import load_converted, save_converted
from .errors import ConversionError
from .writers.export import save_keras
from .load import load_keras, rebuild
from .graph.model import KerasModel
from .layers.recurrent import recurrent_layer, recurrent_layers

__all__ = ["load_keras", "save_keras", "rebuild", "load_converted", "save_converted", "ConversionError", "KerasModel",
           "BUILDERS", "recurrent_layer", "recurrent_layers"]
