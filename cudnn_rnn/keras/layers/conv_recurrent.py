"""ConvLSTM1D / ConvLSTM2D / ConvLSTM3D (Keras 3 and tf.keras 2) become cudnn_rnn.ConvLSTM*D
layers wrapped in ConvRecurrent: the options read from the config with the producer's defaults,
the weights (kernel [*k, C, 4F], recurrent_kernel [*k, F, 4F], bias [4F]) taken as stored."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ... import conv_lstm
from .activations import activation_name
from ..errors import ConversionError
from ... import layers as rnn_layers
from .recurrent import BIDIRECTIONAL_LAYERS, graph_outputs, keras3_call_of, mask_run, restore_states
from .registry import builder, layer_config_of
from .values import Values, check_shapes, int_tuple

_RANKS = {"ConvLSTM1D": 1, "ConvLSTM2D": 2, "ConvLSTM3D": 3}


class ConvRecurrent(nn.Module):
    """A ConvLSTM layer in the graph: inputs[0] the sequence, inputs[1:] the initial [h, c];
    outputs [output, *states] as Keras; the output mask is the input mask when return_sequences."""

    def __init__(self, layer: conv_lstm._ConvLSTM, keras3_call: bool):
        super().__init__()
        self.layer, self.keras3_call = layer, keras3_call

    def keras_groups(self):
        return [("cell", self.layer.layer_weights())]

    def load_keras_states(self, states: dict, batch: Optional[int] = None) -> None:
        """The states a tf.keras SavedModel kept for a stateful layer (recurrent.restore_states)."""
        restore_states(states, [("", self.layer)], batch)

    def forward(self, inputs, masks):
        initial = list(inputs[1:]) or None
        out = self.layer(inputs[0], mask=_conv_mask(self.layer, mask_run(inputs, masks, self.keras3_call)),
                         initial_state=initial)
        outs = out if isinstance(out, list) else [out]
        return graph_outputs(outs[:1], outs[1:], masks[0] if self.layer.return_sequences else None)


def _conv_mask(layer: conv_lstm._ConvLSTM, mask):
    """The mask a ConvLSTM runs with. A mask beyond (batch, time) is Keras's Masking's, reduced over
    the input's last axis: positions for channels_last input; for channels_first input it spans
    (channels, rows), which Keras's backend.rnn lines up with the state's (filters, rows) and masks
    filter-row pairs across every column. That one is refused."""
    if mask is not None and mask.dim() > 2 and layer.data_format == "channels_first":
        raise ValueError("a Masking mask reaches a channels_first ConvLSTM: Keras reduces it over the input's last "
                         "(spatial) axis and applies it to (filter, row) pairs of the state, which is not converted")
    return mask


def _weight_count(cfg: dict, ctx) -> int:
    return 3 if Values(cfg, ctx).bool("use_bias", True) else 2


def _conv_lstm_layer(class_name: str, cfg: dict, ctx, w, **overrides) -> conv_lstm._ConvLSTM:
    """A ConvLSTM layer from its config and its weights (as taken: kernel, recurrent kernel, bias)."""
    rank = _RANKS[class_name]
    v = Values(cfg, ctx)
    filters = v.int("filters", lo=1)
    kernel_size = int_tuple(v, "kernel_size", rank, None)
    strides, dilation = int_tuple(v, "strides", rank, 1), int_tuple(v, "dilation_rate", rank, 1)
    padding = v.str("padding", "valid", ("valid", "same")).lower()
    data_format = v.str("data_format", "channels_last", ("channels_last", "channels_first"))
    use_bias = v.bool("use_bias", True)
    if v.bool("time_major", False):
        raise ctx.error("time_major=True is not supported (the layers are batch-major)")
    check_shapes(ctx, class_name, w, [(*kernel_size, "in", 4 * filters), (*kernel_size, filters, 4 * filters),
                                      (4 * filters,)][: len(w)])
    # tf.keras 2's ConvLSTM2D defaulted to hard_sigmoid gates (its Keras 2 definition)
    default_gate = "hard_sigmoid" if ctx.keras_major < 3 else "sigmoid"
    options = dict(
        strides=strides, padding=padding, data_format=data_format, dilation_rate=dilation,
        activation=activation_name(cfg.get("activation", "tanh"), ctx),
        recurrent_activation=activation_name(cfg.get("recurrent_activation", default_gate), ctx),
        use_bias=use_bias, unit_forget_bias=v.bool("unit_forget_bias", True),
        dropout=v.float("dropout", 0.0, 0.0, 1.0), recurrent_dropout=v.float("recurrent_dropout", 0.0, 0.0, 1.0),
        return_sequences=v.bool("return_sequences", False), return_state=v.bool("return_state", False),
        go_backwards=v.bool("go_backwards", False), stateful=v.bool("stateful", False),
        # tf.keras 2's ConvRNN never passes zero_output_for_mask to its loop: masked steps repeat
        # the previous output, whatever the attribute says
        zero_output_for_mask=ctx.keras_major >= 3 and v.bool("zero_output_for_mask", False))
    options.update(overrides)
    try:
        layer = getattr(conv_lstm, class_name)(int(w[0].shape[-2]), filters, kernel_size, dtype=ctx.dtype,
                                               kernel_initializer="zeros", recurrent_initializer="zeros", **options)
    except ConversionError:
        raise
    except ValueError as e:
        raise ctx.error(str(e)) from None
    with torch.no_grad():
        for param, array in zip(layer.layer_weights(), w):
            param.copy_(torch.as_tensor(array, dtype=ctx.dtype))
    return layer


@builder(*_RANKS)
def build_conv_lstm(cfg, ctx):
    (w,) = ctx.weights.take([("cell", _weight_count(cfg, ctx))])
    return ConvRecurrent(_conv_lstm_layer(ctx.spec.class_name, cfg, ctx, w), keras3_call_of(ctx))


class ConvBidirectional(nn.Module):
    """Keras Bidirectional(ConvLSTM*D): both sides over the sequence, the backward one's outputs
    put back in time order, merged on the last axis as Keras merges (for channels_first layers
    too); outputs [merged (or both), *forward states, *backward states]."""

    def __init__(self, forward_layer, backward_layer, merge_mode, keras3_call: bool):
        super().__init__()
        self.forward_layer, self.backward_layer = forward_layer, backward_layer
        self.merge_mode, self.keras3_call = merge_mode, keras3_call

    def keras_groups(self):
        return [("forward_layer/cell", self.forward_layer.layer_weights()),
                ("backward_layer/cell", self.backward_layer.layer_weights())]

    def load_keras_states(self, states: dict, batch: Optional[int] = None) -> None:
        restore_states(states, [("forward_layer/", self.forward_layer), ("backward_layer/", self.backward_layer)],
                       batch)

    def forward(self, inputs, masks):
        initial = list(inputs[1:])
        mask = _conv_mask(self.forward_layer, mask_run(inputs, masks, self.keras3_call))
        outs_f = self.forward_layer(inputs[0], mask=mask, initial_state=initial[:2] or None)
        outs_b = self.backward_layer(inputs[0], mask=mask, initial_state=initial[2:] or None)
        outs_f = outs_f if isinstance(outs_f, list) else [outs_f]
        outs_b = outs_b if isinstance(outs_b, list) else [outs_b]
        sequences = self.forward_layer.return_sequences
        y_b = outs_b[0].flip(1) if sequences else outs_b[0]
        merged = rnn_layers.merge_directions(outs_f[0], y_b, self.merge_mode)
        merged = merged if isinstance(merged, list) else [merged]
        return graph_outputs(merged, outs_f[1:] + outs_b[1:], masks[0] if sequences else None)


def build_conv_bidirectional(cfg, ctx, fcls: str, fcfg: dict, merge) -> ConvBidirectional:
    """Bidirectional(ConvLSTM*D): the backward side a copy of the forward one with go_backwards
    flipped, or its own backward_layer; in Keras 3 both output zeros at masked steps when they
    return sequences (Keras's Bidirectional sets zero_output_for_mask so; tf.keras 2's ConvRNN
    ignores it)."""
    if cfg.get("backward_layer"):
        try:
            bcls, bcfg = layer_config_of(cfg["backward_layer"])
        except ValueError as e:
            raise ctx.error(f"Bidirectional: {e}") from None
        if bcls != fcls:
            raise ctx.error(f"Bidirectional({fcls}) with a {str(bcls)[:60]} backward layer is not supported")
    else:
        bcfg = dict(fcfg)
        bcfg["go_backwards"] = not Values(fcfg, ctx).bool("go_backwards", False)
    zero = ctx.keras_major >= 3 and Values(fcfg, ctx).bool("return_sequences", False)
    wf, wb = ctx.weights.take([("forward_layer/cell", _weight_count(fcfg, ctx)),
                                ("backward_layer/cell", _weight_count(bcfg, ctx))])  # one take: legacy files split it
    forward = _conv_lstm_layer(fcls, fcfg, ctx, wf, zero_output_for_mask=zero)
    backward = _conv_lstm_layer(fcls, bcfg, ctx, wb, zero_output_for_mask=zero)
    return ConvBidirectional(forward, backward, merge, keras3_call_of(ctx))


for _name in _RANKS:
    BIDIRECTIONAL_LAYERS[_name] = build_conv_bidirectional
