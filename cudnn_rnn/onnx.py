"""ONNX export: cudnn_rnn's recurrent op as ONNX's own LSTM / GRU / RNN operators.

    cudnn_rnn.onnx.export(model, (x,), "model.onnx")      # or: cudnn-rnn convert model.h5 model.onnx

`TRANSLATIONS` is the dynamo exporter's custom translation table (torch.onnx.export(...,
custom_translation_table=TRANSLATIONS)). The op maps onto one standard operator per layer of a
stack, both directions of a bidirectional layer in one: Keras's gate order is rearranged (LSTM
i f c o -> ONNX i o f c; GRU z r h is ONNX's), GRU's reset_after is ONNX's linear_before_reset,
Keras activations become ONNX's (Keras 2's hard_sigmoid HardSigmoid(0.2, 0.5), Keras 3's
HardSigmoid(1/6, 0.5)), `go_backwards` is direction="reverse" with the outputs put back in
processing order.

Masks: rows padded on the right (pad_sequences(padding="post")) or on the left (Keras's default
"pre") are ONNX's sequence_lens, a left-padded row run with time flipped and each direction
reversed (so its real steps come first), Keras's outputs at the padded steps rebuilt (the last
real output, or zeros); each layer runs both frames and takes each row's. A mask with holes
cannot be expressed by the standard operators: the exported graph then outputs NaN for the whole
batch, loudly, rather than numbers that differ from Keras.
Not exported (an error at export time, naming it): activations ONNX's recurrent operators lack
(silu, gelu, mish, selu, relu6, ...), dropout in training mode, a Bidirectional whose forward side
has go_backwards.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple, Union

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
    attrs = dict(direction=direction, activations=acts)  # (_run_layer sets a one-direction layer's)
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    if cell == "gru":
        attrs["linear_before_reset"] = 1 if reset_after else 0

    h = op.Transpose(x, perm=[1, 0, 2])  # [T, B, I]: onnxruntime runs layout 0 only
    frames = [False]
    lens = poison = left_rows = None
    if mask is not None:
        lens, poison, left_rows = _mask_frames(op, mask)
        frames = [False, True]
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
        init_h = op.Slice(h0, op.Constant(value_ints=[layer * D]), op.Constant(value_ints=[layer * D + D]),
                          op.Constant(value_ints=[0])) if h0 is not None else None
        init_c = op.Slice(c0, op.Constant(value_ints=[layer * D]), op.Constant(value_ints=[layer * D + D]),
                          op.Constant(value_ints=[0])) if c0 is not None and cell == "lstm" else None
        u = weights[layer * D * per + 1].shape[0]
        runs = [_run_layer(op, cell, h, Ws, Rs, Bs, lens, init_h, init_c, u, attrs, D, go_backwards, flipped)
                for flipped in frames]
        Y, Yh, Yc = runs[0]
        if len(runs) > 1:  # per row: the right-padded frame, or the flipped one for left-padded rows
            Y = op.Where(op.Unsqueeze(left_rows, op.Constant(value_ints=[0, 2])), runs[1][0], Y)
            Yh = op.Where(op.Unsqueeze(left_rows, op.Constant(value_ints=[0, 2])), runs[1][1], Yh)
            if cell == "lstm":
                Yc = op.Where(op.Unsqueeze(left_rows, op.Constant(value_ints=[0, 2])), runs[1][2], Yc)
        if mask is not None and init_h is not None:  # a row with no real step keeps its initial states
            empty = op.Unsqueeze(op.Equal(op.Cast(lens, to=7), op.Constant(value_int=0)), op.Constant(value_ints=[0, 2]))
            Yh = op.Where(empty, init_h, Yh)
            if cell == "lstm" and init_c is not None:
                Yc = op.Where(empty, init_c, Yc)
        h_ns.append(Yh)
        if cell == "lstm":
            c_ns.append(Yc)
        # Keras's outputs at masked steps, which the next layer of a go_backwards stack reads as
        # data (it sees them reversed); a Bidirectional's inner layers output zeros there (the op too)
        inner_bidirectional = D == 2 and layer < num_layers - 1
        if mask is not None and not zero_output_for_mask and not inner_bidirectional:
            Y = _keras_padded_outputs(op, Y, Yh, mask, D, go_backwards)
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


def _mask_frames(op, mask):
    """(lengths int32 [B], 1 or NaN, bool [B] rows to run in the flipped frame) of a [B, T] mask:
    right-padded rows run as they are (sequence_lens), left-padded ones with time flipped (then
    their real steps come first); a row that is neither poisons the batch with NaN."""
    real = op.Cast(mask, to=9)
    lens = op.ReduceSum(op.Cast(mask, to=6), op.Constant(value_ints=[1]), keepdims=0)  # int32 [B]
    t = op.Squeeze(op.Shape(mask, start=1, end=2))
    steps = op.Unsqueeze(op.Range(op.Constant(value_int=0), t, op.Constant(value_int=1)), op.Constant(value_ints=[0]))
    n = op.Unsqueeze(op.Cast(lens, to=7), op.Constant(value_ints=[1]))  # int64 [B, 1]
    as_right = op.Less(steps, n)
    as_left = op.GreaterOrEqual(steps, op.Sub(t, n))
    row_right = op.Cast(op.ReduceMin(op.Cast(op.Equal(as_right, real), to=6), op.Constant(value_ints=[1]),
                                     keepdims=0), to=9)
    row_left = op.Cast(op.ReduceMin(op.Cast(op.Equal(as_left, real), to=6), op.Constant(value_ints=[1]),
                                    keepdims=0), to=9)
    ok = op.ReduceMin(op.Cast(op.Or(row_right, row_left), to=1), keepdims=0)
    return lens, op.Div(ok, ok), op.And(row_left, op.Not(row_right))


def _swap_directions(op, t, axis: int):
    first, second = op.Split(t, num_outputs=2, axis=axis)
    return op.Concat(second, first, axis=axis)


def _run_layer(op, cell, h, Ws, Rs, Bs, lens, init_h, init_c, u, attrs, D, go_backwards, flipped):
    """One layer of the stack on h [T, B, I] (time order): (Y [T, B, D*u] in h's time order,
    Y_h [D, B, u], Y_c or None). flipped: the left-padded frame, time reversed so that a row's
    real steps come first, each direction then running the other way (its weights swapped into
    the other ONNX direction for a bidirectional layer)."""
    if flipped and D == 2:
        Ws, Rs, Bs = Ws[::-1], Rs[::-1], Bs[::-1]
    W, R = _stack(op, Ws), _stack(op, Rs)
    B = _stack(op, Bs) if Bs[0] is not None else None
    attrs = dict(attrs)
    if D == 1:
        forward = not go_backwards
        attrs["direction"] = "forward" if forward != flipped else "reverse"
    if flipped and D == 2:
        init_h = _swap_directions(op, init_h, 0) if init_h is not None else None
        init_c = _swap_directions(op, init_c, 0) if init_c is not None else None
    x = _flip_time(op, h, axis=0) if flipped else h
    Yc = None
    if cell == "lstm":
        Y, Yh, Yc = op.LSTM(x, W, R, B, lens, init_h, init_c, hidden_size=u, **attrs)
    elif cell == "gru":
        Y, Yh = op.GRU(x, W, R, B, lens, init_h, hidden_size=u, **attrs)
    else:
        Y, Yh = op.RNN(x, W, R, B, lens, init_h, hidden_size=u, **attrs)
    if flipped:
        Y = _flip_time(op, Y, axis=0)
        if D == 2:
            Y, Yh = _swap_directions(op, Y, 1), _swap_directions(op, Yh, 0)
            Yc = _swap_directions(op, Yc, 0) if Yc is not None else None
    # Y [T, D, B, u] -> [T, B, D*u]
    return op.Reshape(op.Transpose(Y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1])), Yh, Yc


def _flip_time(op, y, axis: int):
    return op.Slice(y, op.Constant(value_ints=[-1]), op.Constant(value_ints=[-(1 << 62)]),
                    op.Constant(value_ints=[axis]), op.Constant(value_ints=[-1]))


def _keras_padded_outputs(op, Y, Yh, mask, D: int, go_backwards: bool):
    """Keras outputs at a masked step the previous output (the last real one: each direction's
    Y_h for right- and left-padded rows), and zeros before a row's first real step; ONNX zeros
    them all. Y [T, B, D*u] in time order; direction d processes time forward unless it is a
    Bidirectional's second or the layer goes backwards."""
    real = op.Transpose(op.Cast(mask, to=9), perm=[1, 0])  # [T, B]
    counts = op.Cast(op.Transpose(mask, perm=[1, 0]), to=6)  # int32 [T, B]
    parts = op.Split(Y, num_outputs=D, axis=2) if D > 1 else [Y]
    finals = op.Split(Yh, num_outputs=D, axis=0) if D > 1 else [Yh]
    out = []
    for d in range(D):
        reverse = (d == 1) or go_backwards
        before = op.CumSum(counts, op.Constant(value_int=0), exclusive=1, reverse=1 if reverse else 0)
        carry = op.And(op.Not(real), op.Greater(op.Cast(before, to=7), op.Constant(value_int=0)))  # [T, B]
        last = op.Squeeze(finals[d], op.Constant(value_ints=[0]))  # [B, u]
        out.append(op.Where(op.Unsqueeze(carry, op.Constant(value_ints=[2])),
                            op.Unsqueeze(last, op.Constant(value_ints=[0])), parts[d]))
    return op.Concat(*out, axis=2) if D > 1 else out[0]


TRANSLATIONS = {torch.ops.cudnn_rnn.rnn_forward.default: rnn_forward_to_onnx}


def refusal(error: BaseException) -> Optional[OnnxExportError]:
    """Our OnnxExportError inside an error torch.onnx.export raised, if that is what it is."""
    while error is not None and not isinstance(error, OnnxExportError):
        error = error.__cause__ or error.__context__
    return error


def export(model: torch.nn.Module, args: tuple, path: Union[str, os.PathLike], dynamic_batch_and_time: bool = True,
           dynamic_shapes=None, **kwargs) -> torch.onnx.ONNXProgram:
    """torch.onnx.export (dynamo) of `model` with cudnn_rnn's translations; the batch dynamic,
    and dimension 1 of every sequence (3-D and up, or integer 2-D token ids) its own dynamic length;
    other inputs (2-D float states, masks given as bool... ) keep their batch only; `dynamic_shapes`
    (torch.export's form) chooses instead. A refusal of the translation is raised as
    OnnxExportError. Returns the ONNXProgram (also saved to `path`)."""
    model = model.eval()
    dynamic = dynamic_shapes
    if dynamic is None and dynamic_batch_and_time:  # time: dimension 1 of sequences (3-D and up) and token ids, each its own
        batch = torch.export.Dim("batch", min=1)
        dynamic = tuple({0: batch, 1: torch.export.Dim(f"time_{i}", min=2)}
                        if a.dim() >= 3 or (a.dim() == 2 and not a.is_floating_point()) else {0: batch}
                        for i, a in enumerate(args))
    try:
        return torch.onnx.export(model, args, str(path), dynamo=True, custom_translation_table=TRANSLATIONS,
                                 dynamic_shapes=dynamic, **kwargs)
    except Exception as e:  # noqa: BLE001 - torch wraps our refusal in its own error: surface it
        ours = refusal(e)
        if ours is not None:
            raise OnnxExportError(str(ours)) from None
        raise
