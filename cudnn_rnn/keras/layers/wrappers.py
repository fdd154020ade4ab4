"""The wrappers: TimeDistributed of any layer the registry builds (its weights addressed below
the wrapper with _SubWeights), SpectralNormalization (its stored kernel, at inference) and
Pipeline (weightless layers in sequence); their modules and their builders."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from torch import nn

from ..errors import ConversionError
from ..files.weights import LayerWeights
from ..graph.spec import MODEL_CLASSES, LayerSpec
from .registry import BUILDERS, builder, holds_weights, keras_groups, layer_config_of


class TimeDistributed(nn.Module):
    """Applies the inner module to every timestep at once, the time axis folded into the batch:
    (B, T, ...) -> (B*T, ...) -> (B, T, ...). The inner module is given the mask folded alike (Keras
    gives each step's call its slice of the mask) and its first output is kept; the output mask
    is the input's."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.layer = inner

    def keras_groups(self):
        return [("/".join(p for p in ("layer", sub) if p), ws) for sub, ws in keras_groups(self.layer)]

    def forward(self, inputs, masks):
        x = inputs[0]
        b, t = x.shape[0], x.shape[1]
        mask = masks[0]
        folded = None if mask is None else mask.reshape((b * t,) + tuple(mask.shape[2:]))
        outputs, _ = self.layer([x.reshape((b * t,) + tuple(x.shape[2:]))], [folded])
        y = outputs[0]
        return [y.reshape((b, t) + tuple(y.shape[1:]))], [mask]


class _SubWeights:
    """The weights of a wrapped layer (or model), addressed below the wrapper (Keras 3 sub-path)."""

    def __init__(self, outer: LayerWeights, sub: str):
        self.outer, self.sub = outer, sub

    def take(self, groups, shapes=None, order=None):
        return self.outer.take([("/".join(p for p in (self.sub, s) if p), n) for s, n in groups], shapes, order)

    def child_source(self, spec, sub=""):
        return self.outer.child_source(spec, "/".join(p for p in (self.sub, sub) if p))


def _inner(cfg, ctx, wrapper: str, models: bool = False):
    """(class, config, spec) of the wrapped layer; models: a Sequential or Functional model may be
    wrapped (built by ctx.nested)."""
    try:
        cls, inner_cfg = layer_config_of(cfg.get("layer"))
    except ValueError as e:
        raise ctx.error(f"{wrapper}: {e}") from None
    if cls not in BUILDERS and not (models and cls in MODEL_CLASSES):
        raise ctx.error(f"{wrapper}({cls[:100]}): the layer class {cls[:100]!r} is not supported")
    if not isinstance(inner_cfg, dict):
        raise ctx.error(f"{wrapper}: the wrapped layer's config is not a JSON object")
    spec = LayerSpec(f"{ctx.spec.name}/{str(inner_cfg.get('name', cls))[:100]}", cls, inner_cfg, [])
    return cls, inner_cfg, spec


def _inner_holds_weights(cfg) -> bool:
    try:
        return holds_weights(*layer_config_of(cfg.get("layer")))
    except ValueError:
        return True  # the builder refuses it


@builder("TimeDistributed", weights=_inner_holds_weights)
def build_time_distributed(cfg, ctx):
    cls, inner_cfg, inner_spec = _inner(cfg, ctx, "TimeDistributed", models=True)
    if cls in MODEL_CLASSES:  # a per-frame CNN as a model of its own: built as a nested model
        if ctx.nested is None:
            raise ctx.error(f"TimeDistributed({cls}): a wrapped model is not supported here")
        return TimeDistributed(ctx.nested({"class_name": cls, "config": inner_cfg}, _SubWeights(ctx.weights, "layer")))
    inner_ctx = replace(ctx, spec=inner_spec, weights=_SubWeights(ctx.weights, "layer"))
    inner = BUILDERS[cls](inner_cfg, inner_ctx)
    if hasattr(inner, "float_call"):  # a quantized layer: Keras runs its float call (layers/quantized.py)
        inner.float_call = True
    return TimeDistributed(inner)


class _WithOwn(_SubWeights):
    """The wrapped layer's weights below the wrapper, taken in one request with the wrapper's own
    after them. SpectralNormalization's own are (kernel, vector_u) in a .keras file (the kernel
    once more: it is the wrapped layer's) and vector_u alone, last, in a legacy .h5 file: `own`
    lists the counts to try, and the vector is the last of them."""

    def __init__(self, outer: LayerWeights, sub: str, own=(2, 1)):
        super().__init__(outer, sub)
        self.counts, self.own = own, None

    def take(self, groups, shapes=None, order=None):
        inner = [("/".join(p for p in (self.sub, s) if p), n) for s, n in groups]
        for i, count in enumerate(self.counts):
            try:
                got = self.outer.take(inner + [("", count)], None if shapes is None else list(shapes) + [[None] * count],
                                      order)
            except ConversionError:
                if i == len(self.counts) - 1:
                    raise
                continue
            self.own = got[-1]
            return got[:-1]


class SpectralNormalization(nn.Module):
    """At inference the wrapped layer with its stored kernel (Keras keeps the normalised kernel
    there after each training step); vector_u is kept for export only."""

    def __init__(self, inner: nn.Module, vector_u):
        super().__init__()
        self.layer = inner
        self.register_buffer("vector_u", vector_u)

    def keras_groups(self):
        inner = [("/".join(p for p in ("layer", sub) if p), ws) for sub, ws in keras_groups(self.layer)]
        return inner + [("", [inner[0][1][0], self.vector_u])]  # own: the wrapped kernel, vector_u

    def forward(self, inputs, masks):
        if self.training:
            raise RuntimeError("SpectralNormalization in training mode (a power iteration per step that updates the "
                               "kernel) is not supported; call model.eval()")
        outputs, _ = self.layer(inputs, masks)
        return [outputs[0]], [None]


@builder("SpectralNormalization")
def build_spectral_normalization(cfg, ctx):
    cls, inner_cfg, spec = _inner(cfg, ctx, "SpectralNormalization")
    weights = _WithOwn(ctx.weights, "layer")
    inner = BUILDERS[cls](inner_cfg, replace(ctx, spec=spec, weights=weights))
    if weights.own is None or np.ndim(weights.own[-1]) != 2 or np.shape(weights.own[-1])[0] != 1:
        raise ctx.error("SpectralNormalization: expected its vector_u (1, units) beside the wrapped layer's weights")
    return SpectralNormalization(inner, torch.as_tensor(np.array(weights.own[-1]), dtype=ctx.dtype))


class _NoWeights(LayerWeights):
    """What a Pipeline's layers are given: they hold none (a preprocessing pipeline)."""

    def __init__(self, ctx):
        self.ctx = ctx

    def take(self, groups, shapes=None, order=None):
        if sum(n for _, n in groups):
            raise self.ctx.error("a Pipeline of layers that hold weights is not supported")
        return [[] for _ in groups]

    def child_source(self, spec, sub=""):
        raise self.ctx.error("a Pipeline holding a model is not supported")

    def take_all(self):
        return []


class Pipeline(nn.Module):
    """keras.layers.Pipeline: its layers one after the other, each given the mask the previous
    one made."""

    def __init__(self, stages):
        super().__init__()
        self.stages = nn.ModuleList(stages)

    def forward(self, inputs, masks):
        for stage in self.stages:
            outputs, out_masks = stage(inputs[:1], masks[:1])
            inputs, masks = outputs[:1], out_masks[:1]
        return inputs, masks


@builder("Pipeline", weights=False)
def build_pipeline(cfg, ctx):
    serialized = cfg.get("layers")
    if not isinstance(serialized, list) or not 1 <= len(serialized) <= 64:
        raise ctx.error("Pipeline config has no list of layers")
    stages = []
    for i, entry in enumerate(serialized):
        cls, inner_cfg, spec = _inner({"layer": entry}, ctx, "Pipeline")
        if holds_weights(cls, inner_cfg):
            raise ctx.error(f"Pipeline layer {i} ({cls[:60]}) holds weights: not supported in a Pipeline")
        stages.append(BUILDERS[cls](inner_cfg, replace(ctx, spec=spec, weights=_NoWeights(ctx), nested=None)))
    return Pipeline(stages)
