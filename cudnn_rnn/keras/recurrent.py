"""The recurrent layers: LSTM, GRU, SimpleRNN (and Keras 2's CuDNNLSTM / CuDNNGRU, LSTMV1 /
GRUV1) and Bidirectional become cudnn_rnn layers wrapped in Recurrent; the options read from a
Keras config with the producer's defaults, CuDNN weights converted as Keras converts them, and
recurrent_layer, the public way to find the cudnn_rnn layer in a converted model."""
from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch
from torch import nn

from .. import layers as rnn_layers
from ..cells import GATES
from .activations import activation_name
from .registry import BuildContext, builder, layer_config_of
from .values import Values


class Recurrent(nn.Module):
    """A cudnn_rnn layer (or Bidirectional) in the graph: inputs[0] is the sequence, inputs[1:]
    the initial states; outputs [output, *states] as Keras; the output mask is the input mask
    when return_sequences (Keras RNN.compute_mask)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def keras_groups(self):
        if isinstance(self.layer, rnn_layers.Bidirectional):
            return [("forward_layer/cell", self.layer.forward_layer.layer_weights(0)),
                    ("backward_layer/cell", self.layer.backward_layer.layer_weights(0))]
        return [("cell", self.layer.layer_weights(0))]

    def forward(self, inputs, masks):
        initial = list(inputs[1:]) or None
        out = self.layer(inputs[0], mask=masks[0], initial_state=initial)
        outs = out if isinstance(out, list) else [out]
        seq_mask = masks[0] if self.layer.return_sequences else None
        n_outputs = 2 if isinstance(self.layer, rnn_layers.Bidirectional) and self.layer.merge_mode is None else 1
        return outs, [seq_mask] * n_outputs + [None] * (len(outs) - n_outputs)


def recurrent_layer(module: nn.Module) -> Optional[nn.Module]:
    """The cudnn_rnn layer (LSTM, GRU, SimpleRNN or Bidirectional) that a converted model's
    module runs, or None when the module is not a recurrent layer."""
    return module.layer if isinstance(module, Recurrent) else None


_RNN_CLASSES = {"LSTM": "lstm", "GRU": "gru", "SimpleRNN": "simple_rnn", "CuDNNLSTM": "lstm", "CuDNNGRU": "gru",
                "LSTMV1": "lstm", "GRUV1": "gru"}


def _rnn_options(class_name: str, cfg: dict, ctx: BuildContext) -> dict:
    """Our constructor arguments from a Keras RNN config, with the producer's defaults."""
    cell = _RNN_CLASSES[class_name]
    cudnn = class_name.startswith("CuDNN")
    v = Values(cfg, ctx)
    opts = dict(
        return_sequences=v.bool("return_sequences", False),
        return_state=v.bool("return_state", False),
        go_backwards=v.bool("go_backwards", False),
        stateful=v.bool("stateful", False),
        zero_output_for_mask=v.bool("zero_output_for_mask", False),
    )
    if v.bool("time_major", False):
        raise ctx.error("time_major=True is not supported (the layers are batch-major)")
    if cudnn:  # fixed tanh / sigmoid, the cuDNN GRU form, no dropout, no masking
        opts.update(activation="tanh", use_bias=True)
        if cell != "simple_rnn":
            opts["recurrent_activation"] = "sigmoid"
        if cell == "gru":
            opts["reset_after"] = True
        return opts
    # Keras <= 2.2.4 defaulted to hard_sigmoid gates; Keras 2 GRU to reset_after=False.
    legacy_gates = ctx.keras_version is not None and ctx.keras_major < 3 and _version_tuple(ctx.keras_version) <= (2, 2, 4)
    opts["activation"] = activation_name(cfg.get("activation", "tanh"), ctx)
    opts["use_bias"] = v.bool("use_bias", True)
    opts["dropout"] = v.float("dropout", 0.0, 0.0, 1.0)
    opts["recurrent_dropout"] = v.float("recurrent_dropout", 0.0, 0.0, 1.0)
    if cell != "simple_rnn":
        default = "hard_sigmoid" if legacy_gates else "sigmoid"
        opts["recurrent_activation"] = activation_name(cfg.get("recurrent_activation", default), ctx)
    if cell == "gru":
        opts["reset_after"] = v.bool("reset_after", ctx.keras_major >= 3 and class_name == "GRU")
    return opts


def _version_tuple(version: str) -> tuple:
    parts = []
    for p in str(version).split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _rnn_weight_count(class_name: str, opts: dict) -> int:
    return 3 if (class_name.startswith("CuDNN") or opts.get("use_bias", True)) else 2


def _convert_cudnn_weights(cell: str, weights: List[np.ndarray], units: int, ctx) -> List[np.ndarray]:
    """Keras's own _convert_rnn_weights for CuDNNLSTM / CuDNNGRU -> LSTM / GRU(reset_after=True):
    each (I, u) block of the stored kernel holds cuDNN's row-major (u, I) matrix, so it is
    reshaped (Fortran order) rather than transposed; recurrent blocks are used as stored
    transposed per gate; the (8u,) / (6u,) bias is input biases then recurrent biases."""
    kernel, recurrent, bias = weights
    gates = GATES[cell]
    if bias.shape != (2 * gates * units,):
        raise ctx.error(f"CuDNN{cell.upper()} bias has shape {bias.shape}; expected ({2 * gates * units},)")
    k = np.concatenate([b.T.reshape(b.shape, order="F") for b in np.hsplit(kernel, gates)], axis=1)
    r = np.concatenate([b.T for b in np.hsplit(recurrent, gates)], axis=1)
    if cell == "lstm":
        b = bias[: gates * units] + bias[gates * units :]
    else:
        b = bias.reshape(2, gates * units)
    return [k, r, b]


def _build_rnn_layer(class_name: str, cfg: dict, ctx: BuildContext, weights: List[np.ndarray]) -> rnn_layers._RNNBase:
    cell = _RNN_CLASSES[class_name]
    opts = _rnn_options(class_name, cfg, ctx)
    units = Values(cfg, ctx).int("units", lo=1)
    gates = GATES[cell]
    if len(weights) < 2 or weights[0].ndim != 2:
        raise ctx.error(f"{class_name} weights are malformed: shapes {[w.shape for w in weights]}")
    if class_name.startswith("CuDNN") or (cell != "simple_rnn" and weights[-1].ndim == 1 and
                                         weights[-1].shape[0] == 2 * gates * units):
        weights = _convert_cudnn_weights(cell, weights, units, ctx)  # also CuDNN weights under a plain class
    input_size = weights[0].shape[0]
    if input_size < 1:
        raise ctx.error(f"{class_name} kernel has shape {weights[0].shape}; no input features")
    expect = [(input_size, gates * units), (units, gates * units)]
    if opts["use_bias"]:
        expect.append((2, gates * units) if cell == "gru" and opts["reset_after"] else (gates * units,))
    got = [tuple(w.shape) for w in weights]
    if got != expect:
        if cell == "gru" and opts.get("reset_after") is False and len(got) == 3 and got[2] == (2, gates * units):
            opts["reset_after"] = True  # the bias says reset_after (tf.keras 2 GRU default)
            expect[2] = got[2]
        if got != expect:
            raise ctx.error(f"{class_name}(units={units}) weights have shapes {got}; the config implies {expect}")
    cls = {"lstm": rnn_layers.LSTM, "gru": rnn_layers.GRU, "simple_rnn": rnn_layers.SimpleRNN}[cell]
    # zeros: the Keras initializers (an orthogonal QR among them) would only be overwritten
    layer = cls(input_size, units, dtype=ctx.dtype, kernel_initializer="zeros", recurrent_initializer="zeros", **opts)
    layer.kernel_initializer, layer.recurrent_initializer = "glorot_uniform", "orthogonal"
    with torch.no_grad():
        for param, array in zip(layer.layer_weights(0), weights):
            param.copy_(torch.as_tensor(array, dtype=ctx.dtype))
    return layer


@builder(*_RNN_CLASSES)
def build_rnn(cfg, ctx):
    cls = ctx.spec.class_name
    (w,) = ctx.weights.take([("cell" if not cls.startswith("CuDNN") else "", _rnn_weight_count(cls, _rnn_options(cls, cfg, ctx)))])
    return Recurrent(_build_rnn_layer(cls, cfg, ctx, w))


@builder("Bidirectional")
def build_bidirectional(cfg, ctx):
    try:
        fcls, fcfg = layer_config_of(cfg.get("layer"))
        bcls, bcfg = layer_config_of(cfg["backward_layer"]) if cfg.get("backward_layer") else (fcls, dict(fcfg))
        fcfg, bcfg = dict(fcfg), dict(bcfg)
    except ValueError as e:
        raise ctx.error(f"Bidirectional: {e}") from None
    for c in (fcls, bcls):
        if c not in _RNN_CLASSES:
            raise ctx.error(f"Bidirectional({c}) is not supported")
    if not cfg.get("backward_layer"):
        bcfg["go_backwards"] = not bcfg.get("go_backwards", False)
    sub = lambda c: "" if c.startswith("CuDNN") else "/cell"  # noqa: E731
    nf = _rnn_weight_count(fcls, _rnn_options(fcls, fcfg, ctx))
    nb = _rnn_weight_count(bcls, _rnn_options(bcls, bcfg, ctx))
    wf, wb = ctx.weights.take([("forward_layer" + sub(fcls), nf), ("backward_layer" + sub(bcls), nb)])
    forward = _build_rnn_layer(fcls, fcfg, ctx, wf)
    backward = _build_rnn_layer(bcls, bcfg, ctx, wb)
    merge = cfg.get("merge_mode", "concat")
    if merge not in ("concat", "sum", "mul", "ave", None):
        raise ctx.error(f"Bidirectional merge_mode={str(merge)[:40]!r}; expected concat, sum, mul, ave or null")
    return Recurrent(rnn_layers.Bidirectional(forward, merge_mode=merge, backward_layer=backward))
