"""Keras checkpoints (.keras, .weights.h5, legacy .h5) into torch modules, with only h5py."""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from .builders import BUILDERS, BuildContext, build_op
from .containers import KerasFile, open_keras_file
from .errors import ConversionError
from .graph import ModelSpec, parse_model
from .model import KerasModel, NestedModel
from .weights import LegacySource, WeightSource, weight_source

__all__ = ["load_keras", "ConversionError", "KerasModel", "BUILDERS"]


def _build(spec: ModelSpec, kf: KerasFile, source: WeightSource, dtype, where: str) -> KerasModel:
    modules = {}
    for layer in spec.layers:
        if layer.model is not None:
            child = source.for_layer(layer).child_source(layer.model)
            modules[layer.name] = NestedModel(_build(layer.model, kf, child, dtype, f"{where}/{layer.name}"))
            continue
        if layer.is_op:
            ctx = BuildContext(kf.path, kf.keras_version, layer, source.for_layer(layer), dtype)
            modules[layer.name] = build_op(layer, ctx)
            continue
        build = BUILDERS.get(layer.class_name)
        if build is None:
            raise ConversionError(kf.path, f"layer class {layer.class_name} is not supported (at {where}/{layer.name}; "
                                           f"supported: {', '.join(sorted(BUILDERS))})", layer.name)
        ctx = BuildContext(kf.path, kf.keras_version, layer, source.for_layer(layer), dtype)
        try:
            modules[layer.name] = build(layer.config, ctx)
        except ConversionError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ConversionError(kf.path, f"{layer.class_name} config cannot be converted ({type(e).__name__}: {e})",
                                  layer.name) from None
    input_dtypes = []
    for ref in spec.inputs:
        layer = next((l for l in spec.layers if l.name == ref.layer), None)
        input_dtypes.append(str((layer.config if layer else {}).get("dtype") or "float32"))
    return KerasModel(spec, modules, kf.path, input_dtypes)


def load_keras(path, architecture: Optional[Union[str, dict]] = None, dtype: torch.dtype = torch.float32) -> KerasModel:
    """A torch module computing what the Keras model in `path` computes.

    `path`: a `.keras` archive, a full-model legacy `.h5`, or a weights-only file
    (`.weights.h5`, legacy weights `.h5`) together with `architecture`: a `.keras` / full `.h5`
    file or a model config dict (`model.get_config()` wrapped as {"class_name", "config"}, or a
    JSON string of it). Nothing from TensorFlow or Keras is needed, and nothing is unpickled."""
    kf = open_keras_file(path)
    try:
        config = kf.config
        if architecture is not None:
            config, arch_version = _architecture_config(architecture, path)
            kf.keras_version = kf.keras_version or arch_version
        if config is None:
            raise ConversionError(path, "holds weights only; pass architecture= (a .keras / .h5 model file or a config)")
        if "class_name" not in config and "config" not in config and "layers" in config:
            config = {"class_name": "Functional" if "input_layers" in config else "Sequential", "config": config}
        spec = parse_model(config, path)
        source = weight_source(kf, spec)
        if isinstance(source, LegacySource) and kf.config is None:
            source.match_by_order(_weighted_layers(spec, source))
        model = _build(spec, kf, source, dtype, spec.name)
        return model.eval()
    finally:
        kf.close()


def _architecture_config(architecture, path):
    import json
    import os

    """(config, keras_version or None) from a config dict, a JSON string or a model file."""
    if isinstance(architecture, dict):
        return architecture, architecture.get("keras_version")
    if isinstance(architecture, str) and architecture.lstrip().startswith("{"):
        try:
            config = json.loads(architecture)
        except json.JSONDecodeError as e:
            raise ConversionError(path, f"the architecture JSON is invalid: {e}") from None
        return config, config.get("keras_version")
    if isinstance(architecture, (str, os.PathLike)):
        arch = open_keras_file(architecture)
        try:
            if arch.config is None:
                raise ConversionError(architecture, "has no model config to take the architecture from")
            return arch.config, arch.keras_version
        finally:
            arch.close()
    raise TypeError(f"architecture must be a path, a config dict or a JSON string; got {type(architecture).__name__}")


def _weighted_layers(spec: ModelSpec, source: LegacySource):
    """Names of the layers that hold weights, in model order (how Keras 2 matched weights-only files)."""
    no_weights = {"InputLayer", "Dropout", "SpatialDropout1D", "Activation", "Flatten", "Reshape", "Permute",
                  "RepeatVector", "Masking", "GlobalAveragePooling1D", "GlobalMaxPooling1D", "MaxPooling1D",
                  "AveragePooling1D", "Concatenate", "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum",
                  "ReLU", "Softmax", "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization"}
    return [l.name for l in spec.layers if l.class_name not in no_weights]
