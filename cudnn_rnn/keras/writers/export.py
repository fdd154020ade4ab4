"""Writing modules back as Keras 3 files (.keras, .weights.h5) that keras.saving.load_model
reads: a model loaded with load_keras (from a Keras 3 file), or cudnn_rnn layers (LSTM, GRU,
SimpleRNN, Bidirectional; a num_layers stack becomes that many Keras layers)."""
from __future__ import annotations

import datetime
import os
import io
import json
import zipfile
from typing import List, Tuple, Union

import numpy as np
import torch
from torch import nn

from ... import layers as rnn_layers
from ..errors import ConversionError
from ..graph.spec import ModelSpec, snake_case
from ..graph.model import KerasModel, NestedModel
from ..layers.registry import keras_groups
from ..layers.wrappers import TimeDistributed

KERAS_VERSION = "3.15.1"  # the format written (Keras 3 saving_lib layout)


def _layer_entry(class_name: str, config: dict) -> dict:
    return {"module": "keras.layers", "class_name": class_name, "config": config, "registered_name": None}


def _rnn_config(layer: rnn_layers._RNNBase, name: str, return_sequences: bool, return_state: bool,
                go_backwards: bool, path) -> dict:
    for act in (layer.activation, layer.recurrent_activation):
        if act == "hard_sigmoid_keras2":
            raise ConversionError(path, "activation 'hard_sigmoid_keras2' (Keras 2's hard_sigmoid) has no Keras 3 name", name)
    return dict(layer.keras_config(), name=name, return_sequences=return_sequences, return_state=return_state,
                go_backwards=go_backwards, unroll=False)


# Where Keras 3 finds its model classes (registered_name as its .keras files record it). Its
# legacy .h5 configs omit "module", which keras.saving.load_model needs to read a .keras archive.
_MODEL_MODULES = {"Sequential": ("keras", None), "Functional": ("keras.src.models.functional", "Functional")}


def _with_model_modules(entry):
    """A copy of a config in which every model (the whole one, nested ones) names its module."""
    if isinstance(entry, list):
        return [_with_model_modules(e) for e in entry]
    if not isinstance(entry, dict):
        return entry
    out = {k: _with_model_modules(v) for k, v in entry.items()}
    known = _MODEL_MODULES.get(entry.get("class_name"))
    if known is not None and "module" not in entry and isinstance(entry.get("config"), dict):
        out["module"], out["registered_name"] = known
    return out


_CLASS = {"lstm": "LSTM", "gru": "GRU", "simple_rnn": "SimpleRNN"}


def _layers_model(module: nn.Module, path) -> Tuple[dict, List[Tuple[str, list]]]:
    """(Sequential config, [(weights group path, tensors)]) for a cudnn_rnn layer."""
    bidirectional = isinstance(module, rnn_layers.Bidirectional)
    sides = [module.forward_layer, module.backward_layer] if bidirectional else [module]
    first = sides[0]
    entries = [_layer_entry("InputLayer", {"name": "input_layer", "batch_shape": [None, None, first.input_size],
                                           "dtype": str(first.kernel.dtype).replace("torch.", "")})]
    groups, used = [], {}
    for l in range(first.num_layers):
        final = l == first.num_layers - 1
        cfgs = [_rnn_config(s, f"{_CLASS[s.cell].lower()}_{l}_{d}", s.return_sequences if final else True,
                            s.return_state if final else False, s.go_backwards, path) for d, s in enumerate(sides)]
        if bidirectional:
            entry = _layer_entry("Bidirectional", {
                "name": f"bidirectional_{l}", "merge_mode": module.merge_mode if final else "concat",
                "layer": _layer_entry(_CLASS[sides[0].cell], cfgs[0]),
                "backward_layer": _layer_entry(_CLASS[sides[1].cell], cfgs[1])})
            subs = [("forward_layer/cell", sides[0].layer_weights(l)), ("backward_layer/cell", sides[1].layer_weights(l))]
        else:
            entry = _layer_entry(_CLASS[first.cell], cfgs[0])
            subs = [("cell", first.layer_weights(l))]
        base = snake_case(entry["class_name"])
        n = used.get(base, 0)
        used[base] = n + 1
        prefix = f"layers/{base if n == 0 else f'{base}_{n}'}"
        groups += [(f"{prefix}/{sub}", ws) for sub, ws in subs]
        entries.append(entry)
    config = {"module": "keras", "class_name": "Sequential", "registered_name": None,
              "config": {"name": "sequential", "trainable": True, "layers": entries}}
    return config, groups


def _leaf_layers(model: KerasModel, spec: ModelSpec, prefix: str = ""):
    """(Keras save path, module) of every layer that is not a model, nested models followed:
    the paths Keras 3 names a layer's weights group and its assets by (layers/lstm, layers/lstm_1,
    layers/functional/layers/dense, ...)."""
    used = {}
    layers = spec.layers[1:] if spec.class_name == "Sequential" else spec.layers
    for layer in layers:
        if layer.is_op:
            continue
        base = snake_case(layer.class_name)
        n = used.get(base, 0)
        used[base] = n + 1
        path = "/".join(p for p in (prefix, "layers", base if n == 0 else f"{base}_{n}") if p)
        module = model.layer(layer.name)
        if isinstance(module, NestedModel):
            yield from _leaf_layers(module.model, layer.model, path)
        elif isinstance(module, TimeDistributed) and isinstance(module.layer, NestedModel):
            yield from _leaf_layers(module.layer.model, module.layer.model.spec, f"{path}/layer")
        else:
            yield path, module


def _model_groups(model: KerasModel, spec: ModelSpec) -> List[Tuple[str, list]]:
    return [("/".join(p for p in (path, sub) if p), ws) for path, module in _leaf_layers(model, spec)
            for sub, ws in keras_groups(module)]


def _model_assets(model: KerasModel, spec: ModelSpec) -> List[Tuple[str, str]]:
    """(archive member, text) of the lookup layers' vocabularies, as Keras writes them: the
    special tokens, then the vocabulary, a line each (Keras reads them back on load; without
    them an adapted layer would come back empty)."""
    out = []
    for path, module in _leaf_layers(model, spec):
        lines = module.asset_lines() if hasattr(module, "asset_lines") else None
        if lines is not None:
            for sub in getattr(module, "asset_dirs", ("",)):
                out.append(("/".join(p for p in ("assets", path, sub, "vocabulary.txt") if p), "\n".join(lines)))
    return out


def _write_weights(groups, target) -> None:
    import h5py

    with h5py.File(target, "w") as f:
        for path, tensors in groups:
            vars_ = f.require_group(f"{path}/vars")
            for i, t in enumerate(tensors):
                key, t = t if isinstance(t, tuple) else (str(i), t)  # (a weight Keras stores by name)
                vars_.create_dataset(key, data=np.asarray(t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else t))


def save_keras(module: nn.Module, path: Union[str, os.PathLike]) -> None:
    """Writes a converted model as Keras 3 would, with its current (e.g. fine-tuned) weights.

    Args:
        module (torch.nn.Module): a model :func:`load_keras` made from a Keras 3 file, or an
            LSTM, GRU, SimpleRNN or Bidirectional layer (saved as a one-layer Keras model).
        path (str or os.PathLike): a ``.keras`` archive (config and weights) or a
            ``.weights.h5`` file (weights only).

    Raises:
        ConversionError: for a model converted from a Keras 2 / tf.keras file.
        TypeError: for any other module.

    Example:
        >>> cudnn_rnn.save_keras(cudnn_rnn.LSTM(8, 16), "lstm.keras")
    """
    path = str(path)
    if isinstance(module, KerasModel):
        if not module.keras_version or not str(module.keras_version).startswith("3"):
            raise ConversionError(path, f"the model came from Keras {module.keras_version or '?'}; only models loaded "
                                        "from Keras 3 files (or cudnn_rnn layers) can be written back")
        for where, leaf in _leaf_layers(module, module.spec):
            layer = leaf.layer if isinstance(leaf, TimeDistributed) else leaf
            if getattr(getattr(layer, "q", None), "row_packed", False):
                raise ConversionError(path, f"{where} holds an int4 layer as Keras 3.11-3.13 packed it, which the Keras "
                                            f"written here ({KERAS_VERSION}) does not read; save_converted keeps it")
        config, groups = _with_model_modules(module.keras_config), _model_groups(module, module.spec)
        assets = _model_assets(module, module.spec)
    elif isinstance(module, (rnn_layers._RNNBase, rnn_layers.Bidirectional)):
        (config, groups), assets = _layers_model(module, path), []
    else:
        raise TypeError(f"save_keras takes a model from load_keras or a cudnn_rnn layer; got {type(module).__name__}")
    if path.endswith(".weights.h5"):
        _write_weights(groups, path)
        return
    if not path.endswith(".keras"):
        raise ValueError(f"path must end in .keras or .weights.h5; got {path}")
    buffer = io.BytesIO()
    _write_weights(groups, buffer)
    metadata = {"keras_version": KERAS_VERSION, "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("metadata.json", json.dumps(metadata))
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", buffer.getvalue())
        for name, text in assets:
            z.writestr(name, text)
