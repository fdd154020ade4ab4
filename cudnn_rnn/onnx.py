"""ONNX export: cudnn_rnn's recurrent op as ONNX's own LSTM / GRU / RNN operators.

    cudnn_rnn.onnx.export(model, (x,), "model.onnx")      # or: cudnn-rnn convert model.h5 model.onnx

`TRANSLATIONS` is the dynamo exporter's custom translation table (torch.onnx.export(...,
custom_translation_table=TRANSLATIONS)). The op maps onto one standard operator per layer of a
stack, both directions of a bidirectional layer in one: Keras's gate order is rearranged (LSTM
i f c o -> ONNX i o f c; GRU z r h is ONNX's), GRU's reset_after is ONNX's linear_before_reset,
Keras activations become ONNX's (Keras 2's hard_sigmoid HardSigmoid(0.2, 0.5), Keras 3's
HardSigmoid(1/6, 0.5)), `go_backwards` is direction="reverse" with the outputs put back in
processing order.

Masks: a right-padded mask is ONNX's sequence_lens, with Keras's outputs at the padded steps
rebuilt (the last real output, or zeros with zero_output_for_mask). A mask that is not
right-padded (left padding, holes) cannot be expressed by the standard operators: the exported
graph then outputs NaN for the whole batch, loudly, rather than numbers that differ from Keras.
Not exported (an error at export time, naming it): activations ONNX's recurrent operators lack
(silu, gelu, mish, selu, relu6, ...), dropout in training mode, a Bidirectional whose forward side
has go_backwards.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

_GATES = {"lstm": 4, "gru": 3, "simple_rnn": 1}
# Keras activation -> (ONNX name, alpha, beta); None: the operator's own default / none taken
_ACTIVATIONS: Dict[str, Tuple[str, Optional[float], Optional[float]]] = {
    "tanh": ("Tanh", None, None),
    "sigmoid": ("Sigmoid", None, None),
    "relu": ("Relu", None, None),
    "linear": ("Affine", 1.0, 0.0),
    "hard_sigmoid": ("HardSigmoid", 1.0 / 6.0, 0.5),
    "hard_sigmoid_keras2": ("HardSigmoid", 0.2, 0.5),
    "softsign": ("Softsign", None, None),
    "softplus": ("Softplus", None, None),
    "elu": ("Elu", 1.0, None),
}


class OnnxExportError(ValueError):
    """A call the ONNX translation cannot express exactly."""


def _activation_attrs(names: Sequence[str]):
    """ONNX's activations / activation_alpha / activation_beta attributes: alphas and betas are
    consumed in order by the activations that take them."""
    acts, alphas, betas = [], [], []
    for name in names:
        if name not in _ACTIVATIONS:
            raise OnnxExportError(f"activation '{name}' has no ONNX recurrent-operator equivalent (ONNX's LSTM / "
                                  f"GRU / RNN take {', '.join(sorted(_ACTIVATIONS))}); this layer cannot be exported")
        onnx_name, alpha, beta = _ACTIVATIONS[name]
        acts.append(onnx_name)
        if alpha is not None:
            alphas.append(alpha)
        if beta is not None:
            betas.append(beta)
    return acts, alphas, betas


def _reorder_lstm(op, t, axis: int):
    """Keras i f c o -> ONNX i o f c along `axis`."""
    i, f, c, o = op.Split(t, num_outputs=4, axis=axis)
    return op.Concat(i, o, f, c, axis=axis)


def _direction_weights(op, cell: str, kernel, recurrent, bias, reset_after: bool, use_bias: bool):
    """W [G*u, I], R [G*u, u], B [2*G*u] of one direction, in ONNX's layout."""
    W = op.Transpose(kernel, perm=[1, 0])
    R = op.Transpose(recurrent, perm=[1, 0])
    if cell == "lstm":
        W, R = _reorder_lstm(op, W, 0), _reorder_lstm(op, R, 0)
    if not use_bias:
        return W, R, None
    if cell == "gru" and reset_after:  # [2, 3u]: input bias, recurrent bias
        wb, rb = op.Split(bias, num_outputs=2, axis=0)
        wb, rb = op.Squeeze(wb, op.Constant(value_ints=[0])), op.Squeeze(rb, op.Constant(value_ints=[0]))
    else:
        wb = _reorder_lstm(op, bias, 0) if cell == "lstm" else bias
        rb = op.Mul(wb, op.Constant(value_float=0.0))
    return W, R, op.Concat(wb, rb, axis=0)


def _stack(op, tensors: List):
    zero = op.Constant(value_ints=[0])
    return op.Concat(*[op.Unsqueeze(t, zero) for t in tensors], axis=0) if len(tensors) > 1 else op.Unsqueeze(
        tensors[0], zero)


def rnn_forward_to_onnx(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell, activation,
                        recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards,
                        zero_output_for_mask, need_grad=True):
    """The translation of cudnn_rnn::rnn_forward (schema in csrc/core/ops.cpp)."""
    from onnxscript import opset18 as op

    if dropout_masks or recurrent_dropout_masks:
        raise OnnxExportError("dropout masks in the exported call: export the model in eval mode (model.eval())")
    if bidirectional and go_backwards:
        raise OnnxExportError("a Bidirectional whose forward layer has go_backwards=True cannot be exported")
    D = 2 if bidirectional else 1
    per = 3 if use_bias else 2
    if cell == "lstm":
        names = [recurrent_activation, activation, activation]
    elif cell == "gru":
        names = [recurrent_activation, activation]
    else:
        names = [activation]
    acts, alphas, betas = _activation_attrs(names * D)
    direction = "bidirectional" if bidirectional else ("reverse" if go_backwards else "forward")
    attrs = dict(direction=direction, activations=acts)
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    if cell == "gru":
        attrs["linear_before_reset"] = 1 if reset_after else 0

    h = op.Transpose(x, perm=[1, 0, 2])  # [T, B, I]: onnxruntime runs layout 0 only
    lens = poison = None
    if mask is not None:
        m = op.Cast(mask, to=6)  # int32 [B, T]
        lens = op.ReduceSum(m, op.Constant(value_ints=[1]), keepdims=0)  # int32 [B]
        steps = op.Range(op.Constant(value_int=0), op.Squeeze(op.Shape(mask, start=1, end=2)),
                         op.Constant(value_int=1))  # int64 [T]
        right = op.Less(op.Unsqueeze(steps, op.Constant(value_ints=[0])),
                        op.Unsqueeze(op.Cast(lens, to=7), op.Constant(value_ints=[1])))
        ok = op.ReduceMin(op.Cast(op.Equal(right, op.Cast(mask, to=9)), to=1), keepdims=0)  # 1.0 when right-padded
        poison = op.Div(ok, ok)  # 1, or 0/0 = NaN: a mask the standard operators cannot express
    h_ns, c_ns = [], []
    for layer in range(num_layers):
        Ws, Rs, Bs = [], [], []
        for d in range(D):
            base = (layer * D + d) * per
            W, R, B = _direction_weights(op, cell, weights[base], weights[base + 1],
                                         weights[base + 2] if use_bias else None, reset_after, use_bias)
            Ws.append(W)
            Rs.append(R)
            Bs.append(B)
        W, R = _stack(op, Ws), _stack(op, Rs)
        B = _stack(op, Bs) if use_bias else None
        init_h = op.Slice(h0, op.Constant(value_ints=[layer * D]), op.Constant(value_ints=[layer * D + D]),
                          op.Constant(value_ints=[0])) if h0 is not None else None
        init_c = op.Slice(c0, op.Constant(value_ints=[layer * D]), op.Constant(value_ints=[layer * D + D]),
                          op.Constant(value_ints=[0])) if c0 is not None and cell == "lstm" else None
        u = weights[layer * D * per + 1].shape[0]
        if cell == "lstm":
            Y, Yh, Yc = op.LSTM(h, W, R, B, lens, init_h, init_c, hidden_size=u, **attrs)
            c_ns.append(Yc)
        elif cell == "gru":
            Y, Yh = op.GRU(h, W, R, B, lens, init_h, hidden_size=u, **attrs)
        else:
            Y, Yh = op.RNN(h, W, R, B, lens, init_h, hidden_size=u, **attrs)
        h_ns.append(Yh)
        # Y [T, D, B, u] in time order -> [T, B, D*u]
        Y = op.Reshape(op.Transpose(Y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1]))
        last = layer == num_layers - 1
        if mask is not None and not zero_output_for_mask and last:
            Y = _keras_padded_outputs(op, Y, Yh, mask, lens, D, go_backwards)
        # go_backwards: a layer's outputs in processing order, which is also what the next layer
        # of the stack reads (and reverses again), as Keras stacks go_backwards layers
        h = _flip_time(op, Y, axis=0) if go_backwards else Y
    y = op.Transpose(h, perm=[1, 0, 2])  # [B, T, D*u]
    h_n = op.Concat(*h_ns, axis=0) if len(h_ns) > 1 else h_ns[0]
    c_n = (op.Concat(*c_ns, axis=0) if len(c_ns) > 1 else c_ns[0]) if cell == "lstm" else op.Constant(
        value_floats=[])
    if poison is not None:
        y, h_n = op.Mul(y, op.CastLike(poison, y)), op.Mul(h_n, op.CastLike(poison, h_n))
        if cell == "lstm":
            c_n = op.Mul(c_n, op.CastLike(poison, c_n))
    reserve = op.Cast(op.Constant(value_ints=[]), to=2)  # uint8, empty: nothing for a backward here
    return y, h_n, c_n, reserve


def _flip_time(op, y, axis: int):
    return op.Slice(y, op.Constant(value_ints=[-1]), op.Constant(value_ints=[-(1 << 62)]),
                    op.Constant(value_ints=[axis]), op.Constant(value_ints=[-1]))


def _keras_padded_outputs(op, Y, Yh, mask, lens, D: int, go_backwards: bool):
    """Keras outputs at masked steps the previous output (the last real one: ONNX's Y_h), and zeros
    before a row's first real step; ONNX zeros them all. Y [T, B, D*u] in time order. Only the
    forward-running direction has padded steps after real ones (a reverse direction meets the
    right padding first, where Keras outputs zeros too)."""
    if go_backwards:
        return Y
    u_parts = op.Split(Y, num_outputs=D, axis=2) if D > 1 else [Y]
    fwd = u_parts[0]
    last = op.Squeeze(op.Slice(Yh, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]),
                               op.Constant(value_ints=[0])), op.Constant(value_ints=[0]))  # [B, u]
    seen = op.Cast(op.Greater(op.Cast(lens, to=7), op.Constant(value_int=0)), to=1)  # [B]
    carry = op.Mul(last, op.CastLike(op.Unsqueeze(seen, op.Constant(value_ints=[1])), last))
    real = op.Unsqueeze(op.Transpose(op.Cast(mask, to=9), perm=[1, 0]), op.Constant(value_ints=[2]))  # [T, B, 1]
    fwd = op.Where(real, fwd, op.Unsqueeze(carry, op.Constant(value_ints=[0])))
    return op.Concat(fwd, *u_parts[1:], axis=2) if D > 1 else fwd


TRANSLATIONS = {torch.ops.cudnn_rnn.rnn_forward.default: rnn_forward_to_onnx}


def export(model: torch.nn.Module, args: tuple, path, dynamic_batch_and_time: bool = True, **kwargs):
    """torch.onnx.export (dynamo) of `model` with cudnn_rnn's translations; batch and time
    dynamic for every 2-D or higher input. Returns the ONNXProgram (also saved to `path`)."""
    model = model.eval()
    dynamic = None
    if dynamic_batch_and_time:
        batch, time = torch.export.Dim("batch", min=1), torch.export.Dim("time", min=2)
        dynamic = tuple({0: batch, 1: time} if a.dim() >= 2 else {0: batch} for a in args)
    try:
        return torch.onnx.export(model, args, str(path), dynamo=True, custom_translation_table=TRANSLATIONS,
                                 dynamic_shapes=dynamic, **kwargs)
    except Exception as e:  # noqa: BLE001 - torch wraps our refusal in its own error: surface it
        cause = e
        while cause is not None and not isinstance(cause, OnnxExportError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise OnnxExportError(str(cause)) from None
        raise
