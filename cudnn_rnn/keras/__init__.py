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
from .weights import LegacySource, RecordingSource, ReplaySource, WeightSource, weight_source

from .convert import load_converted, save_converted  # noqa: E402
from .export import save_keras  # noqa: E402

__all__ = ["load_keras", "save_keras", "rebuild", "load_converted", "save_converted", "ConversionError", "KerasModel", "BUILDERS"]


def _build(spec: ModelSpec, path: str, version, source: WeightSource, dtype, where: str, progress) -> KerasModel:
    modules = {}
    for i, layer in enumerate(spec.layers):
        if progress is not None:
            progress(i, len(spec.layers), f"{where}/{layer.name}")
        if layer.model is not None:
            child = source.for_layer(layer).child_source(layer.model)
            modules[layer.name] = NestedModel(_build(layer.model, path, version, child, dtype, f"{where}/{layer.name}", progress))
            continue
        ctx = BuildContext(path, version, layer, source.for_layer(layer), dtype)
        if layer.is_op:
            modules[layer.name] = build_op(layer, ctx)
            continue
        build = BUILDERS.get(layer.class_name)
        if build is None:
            raise ConversionError(path, f"layer class {layer.class_name} is not supported (at {where}/{layer.name}; "
                                        f"supported: {', '.join(sorted(BUILDERS))})", layer.name)
        try:
            modules[layer.name] = build(layer.config, ctx)
        except ConversionError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ConversionError(path, f"{layer.class_name} config cannot be converted ({type(e).__name__}: {e})",
                                  layer.name) from None
    input_specs = []
    for ref in spec.inputs:
        cfg = next((l.config for l in spec.layers if l.name == ref.layer), {})
        dtype_cfg = cfg.get("dtype") or "float32"
        if isinstance(dtype_cfg, dict):  # a DTypePolicy
            dtype_cfg = (dtype_cfg.get("config") or {}).get("name", "float32")
        shape = cfg.get("batch_shape") or cfg.get("batch_input_shape") or [None]
        input_specs.append((str(dtype_cfg), tuple(shape)))
    return KerasModel(spec, modules, path, input_specs)


def load_keras(path, architecture: Optional[Union[str, dict]] = None, dtype: torch.dtype = torch.float32,
               progress: Optional[callable] = None) -> KerasModel:
    """A torch module computing what the Keras model in `path` computes.

    `path`: a `.keras` archive, a full-model legacy `.h5`, or a weights-only file
    (`.weights.h5`, legacy weights `.h5`) together with `architecture`: a `.keras` / full `.h5`
    file or a model config dict (`model.get_config()` wrapped as {"class_name", "config"}, or a
    JSON string of it). Nothing from TensorFlow or Keras is needed, and nothing is unpickled.
    `progress(i, n, layer_name)` is called as layers are converted.

    The returned model keeps `keras_config` and `keras_version` (what save_keras and the CLI
    use) and `keras_weights` (the arrays as read, by layer, in Keras order)."""
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
        records: dict = {}
        model = _build(spec, kf.path, kf.keras_version, RecordingSource(source, records), dtype, spec.name, progress)
        model.keras_config, model.keras_version, model.keras_weights = config, kf.keras_version, records
        return model.eval()
    finally:
        kf.close()


def rebuild(config: dict, keras_version: Optional[str], keras_weights: dict, dtype=torch.float32,
            where: str = "<converted>") -> KerasModel:
    """The model load_keras built, from what it recorded (config, version, weights)."""
    spec = parse_model(config, where)
    model = _build(spec, where, keras_version, ReplaySource(keras_weights, where), dtype, spec.name, None)
    model.keras_config, model.keras_version, model.keras_weights = config, keras_version, keras_weights
    return model.eval()


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
        arch = open_keras_file(architecture, config_only=True)
        if arch.config is None:
            raise ConversionError(architecture, "has no model config to take the architecture from")
        return arch.config, arch.keras_version
    raise TypeError(f"architecture must be a path, a config dict or a JSON string; got {type(architecture).__name__}")


def _weighted_layers(spec: ModelSpec, source: LegacySource):
    """Names of the layers that hold weights, in model order (how Keras 2 matched weights-only files)."""
    no_weights = {"InputLayer", "Dropout", "SpatialDropout1D", "Activation", "Flatten", "Reshape", "Permute",
                  "RepeatVector", "Masking", "GlobalAveragePooling1D", "GlobalMaxPooling1D", "MaxPooling1D",
                  "AveragePooling1D", "Concatenate", "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum",
                  "ReLU", "Softmax", "GaussianNoise", "GaussianDropout", "AlphaDropout", "ActivityRegularization"}
    return [l.name for l in spec.layers if l.class_name not in no_weights]
