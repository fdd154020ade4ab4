"""The layers keras.applications defines outside keras.layers, which its saved models name by
class: ConvNeXt's LayerScale (x * gamma) and StochasticDepth (the identity at inference; in
training a residual branch is dropped per sample), and InceptionResNetV2's CustomScaleLayer
(inputs[0] + inputs[1] * scale). Keras and tf.keras load them by their module, so a saved
application converts with nothing registered by the user.

The class names are generic: a user's own class of the same name is converted here only when it
is the application's class, that is when the file records an applications module or (legacy .h5
files, which record no module) when its config holds exactly the application class's keys and
its weights their shapes. Anything else is refused with the class named, so that the user's
custom_layers builder decides."""
from __future__ import annotations

import re

from torch import nn

from .base import _Single
from .custom import short_name
from .registry import BuildContext, builder
from .regularization import drop
from .values import Values, check_shapes

# The modules Keras 3 and tf.keras record for their applications' classes in .keras files.
_APPLICATIONS_MODULE = re.compile(r"(keras|tf_keras|tensorflow\.keras|tensorflow\.python\.keras)(\.src)?"
                                  r"\.applications\.[a-z0-9_]+")
_BASE_KEYS = {"name", "trainable", "dtype", "batch_input_shape", "batch_shape"}  # every Layer's


def _check_is_application_class(cfg: dict, ctx: BuildContext, keys: set) -> None:
    module, name = ctx.spec.module, short_name(ctx.spec.class_name)
    if module and not _APPLICATIONS_MODULE.fullmatch(module):
        raise ctx.error(f"layer class {name} of module {module[:80]!r} is not supported (the class of "
                        "that name converted here is keras.applications'); a model's own classes can be given "
                        f"builders: load_keras(..., custom_layers={{{name!r}: builder}})")
    unknown = sorted(k for k in cfg if k not in _BASE_KEYS | keys)
    missing = sorted(k for k in keys if k not in cfg)
    if unknown or missing:
        what = f"keys {unknown} that keras.applications' {name} has not" if unknown else \
            f"no {missing}"
        raise ctx.error(f"config has {what}; a model's own class of that name can be given a builder: "
                        f"load_keras(..., custom_layers={{{name!r}: builder}})")


class LayerScale(_Single):
    """x * gamma over the last axis (gamma: projection_dim numbers); no mask passes."""

    keeps_mask = False

    def __init__(self, gamma: nn.Parameter):
        super().__init__()
        self.gamma = gamma

    def keras_groups(self):
        return [("", [self.gamma])]

    def apply(self, x):
        if x.shape[-1] != self.gamma.shape[0]:
            raise ValueError(f"LayerScale has projection_dim {self.gamma.shape[0]}; the input {tuple(x.shape)} has "
                             f"{x.shape[-1]} channels last")
        return x * self.gamma


class StochasticDepth(_Single):
    """The identity at inference; in training each sample's input is kept with probability
    1 - rate (scaled by 1 / (1 - rate)) or zeroed: Keras's floor(1 - rate + U) draws the same
    decision as a dropout with one noise value per sample. No mask passes."""

    keeps_mask = False

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def apply(self, x):
        if not self.training or self.rate <= 0.0:
            return x
        return drop(x, self.rate, (x.shape[0],) + (1,) * (x.dim() - 1))


class ScaledSum(nn.Module):
    """inputs[0] + inputs[1] * scale, as InceptionResNetV2's CustomScaleLayer; no output mask."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, inputs, masks):
        if len(inputs) != 2:
            raise ValueError(f"CustomScaleLayer takes 2 inputs; got {len(inputs)}")
        return [inputs[0] + inputs[1] * self.scale], [None]


@builder("LayerScale")
def build_layer_scale(cfg, ctx):
    _check_is_application_class(cfg, ctx, {"init_values", "projection_dim"})
    dim = Values(cfg, ctx).int("projection_dim", lo=1)
    (w,) = ctx.weights.take([("", 1)])
    check_shapes(ctx, "LayerScale", w, [(dim,)])
    return LayerScale(ctx.tensor(w[0]))


@builder("StochasticDepth", weights=False)
def build_stochastic_depth(cfg, ctx):
    _check_is_application_class(cfg, ctx, {"drop_path_rate"})
    return StochasticDepth(Values(cfg, ctx).float("drop_path_rate", lo=0.0, hi=1.0))


@builder("CustomScaleLayer", "Custom>CustomScaleLayer", weights=False)
def build_custom_scale(cfg, ctx):
    _check_is_application_class(cfg, ctx, {"scale"})
    return ScaledSum(Values(cfg, ctx).float("scale"))
