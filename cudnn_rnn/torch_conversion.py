"""Conversions between the Keras-layout layers and torch.nn.LSTM / GRU / RNN.

torch.nn (like cuDNN) stores per layer and direction weight_ih [G*u, I], weight_hh [G*u, u],
bias_ih and bias_hh, with GRU gates in r, z, n order where Keras has z, r, h. A Keras kernel is
the transpose of weight_ih with its gate blocks permuted; the Keras LSTM/SimpleRNN bias is
bias_ih + bias_hh; the Keras GRU reset_after=True bias rows are bias_ih and bias_hh.

This module knows the layers only by what they hold (cell, units, layer_weights(), ...): the
layer classes (layers.py) call it for their to_torch / from_torch, not the other way round.
"""
from __future__ import annotations

import warnings
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

# TORCH_FROM_KERAS[cell][t] = the Keras gate block that torch's gate block t holds.
TORCH_FROM_KERAS = {"lstm": (0, 1, 2, 3), "gru": (1, 0, 2), "simple_rnn": (0,)}


def torch_incompatibilities(sides: List[nn.Module], merge_mode: Optional[str] = None, fused: bool = True) -> List[str]:
    """Why the layer made of `sides` (one layer, or a Bidirectional's forward and backward
    layers with its merge_mode and whether it runs fused) has no torch.nn equivalent; empty when
    it has one."""
    reasons = []
    if len(sides) == 2:
        if not fused:
            reasons.append("the two directions have different configurations")
        if merge_mode != "concat":
            reasons.append(f"merge_mode={merge_mode!r} (torch.nn concatenates the directions)")
    layer = sides[0]
    reasons += [f"{setting} (torch.nn: {standard})" for setting, standard in layer.nonstandard_settings()]
    if layer.go_backwards:
        reasons.append("go_backwards=True")
    return reasons


def _split(t: Tensor, gates: int, dim: int) -> List[Tensor]:
    return list(t.chunk(gates, dim=dim))


def _keras_to_torch_blocks(t: Tensor, cell: str, dim: int) -> Tensor:
    blocks = _split(t, len(TORCH_FROM_KERAS[cell]), dim)
    return torch.cat([blocks[k] for k in TORCH_FROM_KERAS[cell]], dim=dim)


def _torch_to_keras_blocks(t: Tensor, cell: str, dim: int) -> Tensor:
    order = TORCH_FROM_KERAS[cell]
    blocks = _split(t, len(order), dim)
    keras = [None] * len(order)
    for torch_gate, keras_gate in enumerate(order):
        keras[keras_gate] = blocks[torch_gate]
    return torch.cat(keras, dim=dim)


def _copy_direction_to_torch(layer: nn.Module, l: int, module: nn.Module, suffix: str) -> None:
    cell = layer.cell
    w = layer.layer_weights(l)
    getattr(module, f"weight_ih_l{l}{suffix}").copy_(_keras_to_torch_blocks(w[0], cell, 1).t())
    getattr(module, f"weight_hh_l{l}{suffix}").copy_(_keras_to_torch_blocks(w[1], cell, 1).t())
    if layer.use_bias:
        if cell == "gru":
            getattr(module, f"bias_ih_l{l}{suffix}").copy_(_keras_to_torch_blocks(w[2][0], cell, 0))
            getattr(module, f"bias_hh_l{l}{suffix}").copy_(_keras_to_torch_blocks(w[2][1], cell, 0))
        else:
            getattr(module, f"bias_ih_l{l}{suffix}").copy_(_keras_to_torch_blocks(w[2], cell, 0))
            getattr(module, f"bias_hh_l{l}{suffix}").zero_()


def to_torch(sides: List[nn.Module], reasons: List[str]) -> nn.Module:
    """torch.nn.LSTM / GRU / RNN with batch_first=True computing what the layer made of `sides`
    computes (as return_sequences=True output). Dropout settings are not carried over (they
    differ in kind). reasons: torch_incompatibilities of the layer."""
    if reasons:
        raise ValueError(f"{type(sides[0]).__name__ if len(sides) == 1 else 'Bidirectional'} has no torch.nn "
                         "equivalent: " + "; ".join(reasons))
    bidirectional = len(sides) == 2
    f = sides[0]
    ref = f.kernel
    kwargs = dict(num_layers=f.num_layers, bias=f.use_bias, batch_first=True, bidirectional=bidirectional,
                  device=ref.device, dtype=ref.dtype)
    if f.cell == "lstm":
        module = nn.LSTM(f.input_size, f.units, **kwargs)
    elif f.cell == "gru":
        module = nn.GRU(f.input_size, f.units, **kwargs)
    else:
        module = nn.RNN(f.input_size, f.units, nonlinearity=f.activation, **kwargs)
    with torch.no_grad():
        for l in range(f.num_layers):
            for side, suffix in zip(sides, ("", "_reverse")):
                _copy_direction_to_torch(side, l, module, suffix)
    return module


def keras_options(module: nn.Module) -> Tuple[str, dict]:
    """(cell, layer options) of the Keras-layout layer equivalent to a torch.nn.LSTM / GRU / RNN
    (return_sequences=True, as torch returns every step)."""
    if isinstance(module, nn.LSTM):
        cell, extra = "lstm", {}
        if module.proj_size:
            raise ValueError(f"torch.nn.LSTM with proj_size={module.proj_size} has no Keras equivalent")
    elif isinstance(module, nn.GRU):
        cell, extra = "gru", {"reset_after": True}
    elif isinstance(module, nn.RNN):
        cell, extra = "simple_rnn", {"activation": module.nonlinearity}
    else:
        raise TypeError(f"module must be a torch.nn.LSTM, GRU or RNN; got {type(module).__name__}")
    if not module.batch_first:
        raise ValueError(f"torch.nn.{type(module).__name__} has batch_first=False (time-major input, (time, batch, "
                         "features)); cudnn_rnn layers take batch-major input as Keras does. The weights are the "
                         "same: set module.batch_first = True before converting, and transpose your inputs "
                         "(x.transpose(0, 1)) when you call the converted layer")
    if module.dropout:
        warnings.warn(f"torch dropout={module.dropout} between layers is not carried over; set Keras-style "
                      "dropout / recurrent_dropout on the converted layer if you train it", stacklevel=3)
    ref = module.weight_ih_l0
    return cell, dict(return_sequences=True, use_bias=module.bias, num_layers=module.num_layers,
                      device=ref.device, dtype=ref.dtype, **extra)


def copy_from_torch(layer: nn.Module, module: nn.Module, suffix: str) -> None:
    """Copies one direction (suffix "" or "_reverse") of `module`'s weights into `layer`."""
    cell = layer.cell
    with torch.no_grad():
        for l in range(module.num_layers):
            w = layer.layer_weights(l)
            w[0].copy_(_torch_to_keras_blocks(getattr(module, f"weight_ih_l{l}{suffix}").t(), cell, 1))
            w[1].copy_(_torch_to_keras_blocks(getattr(module, f"weight_hh_l{l}{suffix}").t(), cell, 1))
            if module.bias:
                b_ih = _torch_to_keras_blocks(getattr(module, f"bias_ih_l{l}{suffix}"), cell, 0)
                b_hh = _torch_to_keras_blocks(getattr(module, f"bias_hh_l{l}{suffix}"), cell, 0)
                w[2].copy_(torch.stack([b_ih, b_hh]) if cell == "gru" else b_ih + b_hh)
