"""ConvLSTM1D / ConvLSTM2D / ConvLSTM3D (Keras 3 and tf.keras 2) become cudnn_rnn.ConvLSTM*D
layers wrapped in ConvRecurrent: the options read from the config with the producer's defaults,
the weights (kernel [*k, C, 4F], recurrent_kernel [*k, F, 4F], bias [4F]) taken as stored."""
from __future__ import annotations

import torch
from torch import nn

from .. import conv_lstm
from .activations import activation_name
from .errors import ConversionError
from .recurrent import keras3_call_of, mask_run
from .registry import builder
from .values import Values, check_shapes

_RANKS = {"ConvLSTM1D": 1, "ConvLSTM2D": 2, "ConvLSTM3D": 3}


class ConvRecurrent(nn.Module):
    """A ConvLSTM layer in the graph: inputs[0] the sequence, inputs[1:] the initial [h, c];
    outputs [output, *states] as Keras; the output mask is the input mask when return_sequences."""

    def __init__(self, layer: conv_lstm._ConvLSTM, keras3_call: bool):
        super().__init__()
        self.layer, self.keras3_call = layer, keras3_call

    def keras_groups(self):
        return [("cell", [p for p in (self.layer.kernel, self.layer.recurrent_kernel, self.layer.bias)
                          if p is not None])]

    def forward(self, inputs, masks):
        initial = list(inputs[1:]) or None
        out = self.layer(inputs[0], mask=mask_run(inputs, masks, self.keras3_call), initial_state=initial)
        outs = out if isinstance(out, list) else [out]
        return outs, [masks[0] if self.layer.return_sequences else None] + [None] * (len(outs) - 1)


def _tuple(v: Values, key: str, rank: int, default):
    value = v.cfg.get(key, default)
    if value is None:
        value = default
    if isinstance(value, list) and len(value) == rank:
        return tuple(Values({key: e}, v.ctx).int(key, lo=1, hi=1 << 16) for e in value)
    return (Values({key: value}, v.ctx).int(key, lo=1, hi=1 << 16),) * rank


@builder(*_RANKS)
def build_conv_lstm(cfg, ctx):
    rank = _RANKS[ctx.spec.class_name]
    v = Values(cfg, ctx)
    filters = v.int("filters", lo=1)
    kernel_size = _tuple(v, "kernel_size", rank, None)
    strides, dilation = _tuple(v, "strides", rank, 1), _tuple(v, "dilation_rate", rank, 1)
    padding = v.str("padding", "valid", ("valid", "same")).lower()
    data_format = v.str("data_format", "channels_last", ("channels_last", "channels_first"))
    use_bias = v.bool("use_bias", True)
    if v.bool("time_major", False):
        raise ctx.error("time_major=True is not supported (the layers are batch-major)")
    (w,) = ctx.weights.take([("cell", 3 if use_bias else 2)])
    check_shapes(ctx, ctx.spec.class_name, w, [(*kernel_size, "in", 4 * filters), (*kernel_size, filters, 4 * filters),
                                               (4 * filters,)][: len(w)])
    # tf.keras 2's ConvLSTM2D defaulted to hard_sigmoid gates (its Keras 2 definition)
    default_gate = "hard_sigmoid" if ctx.keras_major < 3 else "sigmoid"
    try:
        layer = getattr(conv_lstm, ctx.spec.class_name)(
            int(w[0].shape[-2]), filters, kernel_size, strides=strides, padding=padding, data_format=data_format,
            dilation_rate=dilation, activation=activation_name(cfg.get("activation", "tanh"), ctx),
            recurrent_activation=activation_name(cfg.get("recurrent_activation", default_gate), ctx),
            use_bias=use_bias, unit_forget_bias=v.bool("unit_forget_bias", True),
            dropout=v.float("dropout", 0.0, 0.0, 1.0), recurrent_dropout=v.float("recurrent_dropout", 0.0, 0.0, 1.0),
            return_sequences=v.bool("return_sequences", False), return_state=v.bool("return_state", False),
            go_backwards=v.bool("go_backwards", False), stateful=v.bool("stateful", False),
            zero_output_for_mask=v.bool("zero_output_for_mask", False), dtype=ctx.dtype,
            kernel_initializer="zeros", recurrent_initializer="zeros")
    except ConversionError:
        raise
    except ValueError as e:
        raise ctx.error(str(e)) from None
    with torch.no_grad():
        for param, array in zip((layer.kernel, layer.recurrent_kernel, layer.bias), w):
            param.copy_(torch.as_tensor(array, dtype=ctx.dtype))
    return ConvRecurrent(layer, keras3_call_of(ctx))
