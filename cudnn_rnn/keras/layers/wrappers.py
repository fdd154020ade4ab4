"""TimeDistributed of any layer the registry builds (its weights addressed below the wrapper
with _SubWeights); its module and its builder."""
from __future__ import annotations

from torch import nn

from ..files.weights import LayerWeights
from ..graph.spec import LayerSpec
from .registry import BUILDERS, BuildContext, builder, holds_weights, keras_groups, layer_config_of


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
    """The weights of a wrapped layer, addressed below the wrapper (Keras 3 sub-path)."""

    def __init__(self, outer: LayerWeights, sub: str):
        self.outer, self.sub = outer, sub

    def take(self, groups, shapes=None):
        return self.outer.take([("/".join(p for p in (self.sub, s) if p), n) for s, n in groups], shapes)


def _inner_holds_weights(cfg) -> bool:
    try:
        return holds_weights(*layer_config_of(cfg.get("layer")))
    except ValueError:
        return True  # the builder refuses it


@builder("TimeDistributed", weights=_inner_holds_weights)
def build_time_distributed(cfg, ctx):
    try:
        cls, inner_cfg = layer_config_of(cfg.get("layer"))
    except ValueError as e:
        raise ctx.error(f"TimeDistributed: {e}") from None
    if cls not in BUILDERS:
        raise ctx.error(f"TimeDistributed({cls[:100]}): the layer class {cls[:100]!r} is not supported")
    if not isinstance(inner_cfg, dict):
        raise ctx.error("TimeDistributed: the wrapped layer's config is not a JSON object")
    inner_spec = LayerSpec(f"{ctx.spec.name}/{str(inner_cfg.get('name', cls))[:100]}", cls, inner_cfg, [])
    inner_ctx = BuildContext(ctx.path, ctx.keras_version, inner_spec, _SubWeights(ctx.weights, "layer"), ctx.dtype)
    return TimeDistributed(BUILDERS[cls](inner_cfg, inner_ctx))
