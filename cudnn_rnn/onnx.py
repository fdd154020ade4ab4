"""ONNX export: cudnn_rnn's recurrent op as ONNX's own LSTM / GRU / RNN operators, or an exact
Loop for the activations those lack.

    cudnn_rnn.onnx.export(model, (x,), "model.onnx")      # or: cudnn-rnn convert model.h5 model.onnx

`TRANSLATIONS` is the dynamo exporter's custom translation table (torch.onnx.export(...,
custom_translation_table=TRANSLATIONS)). The op maps onto one standard operator per layer of a
stack, both directions of a bidirectional layer in one: Keras's gate order is rearranged (LSTM
i f c o -> ONNX i o f c; GRU z r h is ONNX's), GRU's reset_after is ONNX's linear_before_reset,
Keras activations become ONNX's (Keras 2's hard_sigmoid HardSigmoid(0.2, 0.5), Keras 3's
HardSigmoid(1/6, 0.5)); `go_backwards` reads the input and the mask reversed and outputs in
processing order, as Keras does.

Masks, any pattern (padded on either side, holes): a masked step leaves Keras's states alone, so
each row's real steps are gathered to the front (a permutation made from the mask), run with
ONNX's sequence_lens, and the outputs put back at their steps, with Keras's output at a masked
step (the previous one in processing order, zeros before the first; or zeros with
zero_output_for_mask and inside a Bidirectional's stack). A row with no real step keeps its
initial states.

Activations ONNX's recurrent operators lack (silu, gelu, mish, selu, relu6, hard_silu, ...):
the layer becomes an ONNX Loop over time running Keras's cell from elementwise operators, the
input projection of all steps in one MatMul before it, masks applied per step.

ConvLSTM1D/2D/3D (conv_lstm_forward_to_onnx): every step's input convolution as one ONNX Conv,
then a Loop over time running the recurrent convolution and the cell.

Not exported (an error at export time, naming it): layers not in float32, dropout in training
mode.
"""
from __future__ import annotations

import contextlib
import itertools
import inspect
import logging
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ._export_shapes import error_chain, export_from_length, is_sequence

# Keras activation -> (ONNX name, alpha, beta); None: the operator's own default / none taken
_ACTIVATIONS: Dict[str, Tuple[str, Optional[float], Optional[float]]] = {
    "tanh": ("Tanh", None, None),
    "sigmoid": ("Sigmoid", None, None),
    "relu": ("Relu", None, None),
    "linear": ("Affine", 1.0, 0.0),
    "hard_sigmoid": ("HardSigmoid", 1.0 / 6.0, 0.5),
    "hard_sigmoid_keras2": ("HardSigmoid", 0.2, 0.5),
    "softsign": ("Softsign", None, None),
    # (softplus: onnxruntime's recurrent operators overflow to inf above ~88 where Keras gives x;
    # it runs in the Loop, whose elementwise Softplus does not)
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


def _gru_biases(op, bias):
    """A reset_after GRU's bias [2, 3u] as (input bias, recurrent bias)."""
    wb, rb = op.Split(bias, num_outputs=2, axis=0)
    return op.Squeeze(wb, op.Constant(value_ints=[0])), op.Squeeze(rb, op.Constant(value_ints=[0]))


def _direction_weights(op, cell: str, kernel, recurrent, bias, reset_after: bool):
    """W [G*u, I], R [G*u, u], B [2*G*u] of one direction, in ONNX's layout."""
    W = op.Transpose(kernel, perm=[1, 0])
    R = op.Transpose(recurrent, perm=[1, 0])
    if cell == "lstm":
        W, R = _reorder_lstm(op, W, 0), _reorder_lstm(op, R, 0)
    if bias is None:
        return W, R, None
    if cell == "gru" and reset_after:
        wb, rb = _gru_biases(op, bias)
    else:
        wb = _reorder_lstm(op, bias, 0) if cell == "lstm" else bias
        rb = op.Mul(wb, op.CastLike(op.Constant(value_float=0.0), wb))
    return W, R, op.Concat(wb, rb, axis=0)


def _stack(op, tensors: List):
    zero = op.Constant(value_ints=[0])
    return op.Concat(*[op.Unsqueeze(t, zero) for t in tensors], axis=0) if len(tensors) > 1 else op.Unsqueeze(
        tensors[0], zero)


def _require_float32(x, what: str) -> None:
    import onnx_ir as ir

    if x.dtype is not None and x.dtype != ir.DataType.FLOAT:
        raise OnnxExportError(f"{what} runs in {x.dtype.name.lower()}: ONNX export takes float32 layers "
                              "(model.float()); onnxruntime's recurrent kernels are float32 only")


def rnn_forward_to_onnx(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell, activation,
                        recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards,
                        zero_output_for_mask, need_grad=True):
    """The translation of cudnn_rnn::rnn_forward (schema in csrc/core/ops.cpp)."""
    import onnx_ir as ir
    from onnxscript import opset18 as op

    if dropout_masks or recurrent_dropout_masks:
        raise OnnxExportError("dropout masks in the exported call: export the model in eval mode (model.eval())")
    _require_float32(x, "a recurrent layer")
    D = 2 if bidirectional else 1
    per = 3 if use_bias else 2
    names = {"lstm": [recurrent_activation, activation, activation], "gru": [recurrent_activation, activation],
             "simple_rnn": [activation]}[cell]
    unknown = sorted({n for n in names if n not in _ACTIVATIONS and n not in _LOOP_ACTIVATIONS})
    if unknown:
        raise OnnxExportError(f"activation '{unknown[0]}' has no ONNX translation; this layer cannot be exported")
    standard = all(n in _ACTIVATIONS for n in names)
    layer_run = _standard_layer if standard else _loop_layer

    h = op.Transpose(x, perm=[1, 0, 2])  # [T, B, I]: onnxruntime runs layout 0 only
    h_ns, c_ns = [], []
    for layer in range(num_layers):
        ws = [tuple(weights[(layer * D + d) * per + k] for k in range(2)) + (
            weights[(layer * D + d) * per + 2] if use_bias else None,) for d in range(D)]
        init_h = op.Slice(h0, op.Constant(value_ints=[layer * D]), op.Constant(value_ints=[layer * D + D]),
                          op.Constant(value_ints=[0])) if h0 is not None else None
        init_c = op.Slice(c0, op.Constant(value_ints=[layer * D]), op.Constant(value_ints=[layer * D + D]),
                          op.Constant(value_ints=[0])) if c0 is not None and cell == "lstm" else None
        u = weights[layer * D * per + 1].shape[0]
        # a Bidirectional's inner layers output zeros at masked steps (the op does too); the last
        # layer Keras's previous output unless zero_output_for_mask
        zero_out = zero_output_for_mask or (D == 2 and layer < num_layers - 1)
        # go_backwards: the layer reads its input and the mask reversed and outputs in processing
        # order, which the next layer of the stack reads reversed again, as Keras stacks them
        xin, m = (_flip_time(op, h, 0), _flip_time(op, mask, 1) if mask is not None else None) if go_backwards \
            else (h, mask)
        h, Yh, Yc = layer_run(op, cell, names, xin, ws, m, init_h, init_c, u, reset_after, zero_out)
        h_ns.append(Yh)
        if cell == "lstm":
            c_ns.append(Yc)
    y = op.Transpose(h, perm=[1, 0, 2])  # [B, T, D*u]
    h_n = op.Concat(*h_ns, axis=0) if len(h_ns) > 1 else h_ns[0]
    c_n = (op.Concat(*c_ns, axis=0) if len(c_ns) > 1 else c_ns[0]) if cell == "lstm" else op.CastLike(
        op.Constant(value=ir.tensor(np.zeros(0, np.float32))), x)
    reserve = op.Constant(value=ir.tensor(np.zeros(0, np.uint8)))  # empty: nothing for a backward here
    return y, h_n, c_n, reserve


class _Compaction:
    """A [B, T] mask as a permutation of each row's steps: its real steps first, in order. Masked
    steps leave a Keras cell's states alone, so running the real steps alone (ONNX's
    sequence_lens) computes the same states; `spread` puts the outputs back at their steps."""

    def __init__(self, op, m):
        self.op = op
        mi = op.Cast(m, to=7)  # int64 [B, T]
        self.real = op.Transpose(m, perm=[1, 0])  # bool [T, B]
        self.lens = op.ReduceSum(mi, op.Constant(value_ints=[1]), keepdims=0)  # [B]
        incl = op.CumSum(mi, op.Constant(value_int=1))
        excl = op.Sub(incl, mi)  # real steps before each step
        t = op.Shape(m, start=1, end=2)
        steps = op.Unsqueeze(op.Range(op.Constant(value_int=0), op.Squeeze(t), op.Constant(value_int=1)),
                             op.Constant(value_ints=[0]))  # [1, T]
        n = op.Unsqueeze(self.lens, op.Constant(value_ints=[1]))
        # where each step goes: a real one to its rank among real steps, a masked one after all of them
        target = op.Where(m, excl, op.Sub(op.Add(n, steps), excl))
        source = op.ScatterElements(op.Mul(mi, op.Constant(value_int=0)), target,
                                    op.Expand(steps, op.Shape(mi)), axis=1)
        self.source = op.Transpose(source, perm=[1, 0])  # [T, B]: the step compacted position j reads
        # the compacted position of the last real step at or before each step (forward direction)
        # and of the first at or after it (a Bidirectional's backward direction)
        self.last = op.Transpose(op.Sub(incl, op.Constant(value_int=1)), perm=[1, 0])
        self.next = op.Transpose(excl, perm=[1, 0])
        self.has_last = op.GreaterOrEqual(self.last, op.Constant(value_int=0))
        self.has_next = op.Less(self.next, op.Transpose(n, perm=[1, 0]))

    def _gather(self, y, index):
        op = self.op
        idx = op.Expand(op.Unsqueeze(index, op.Constant(value_ints=[2])), op.Shape(y))
        return op.GatherElements(y, idx, axis=0)

    def gather(self, x):
        """x [T, B, I] with each row's real steps first."""
        return self._gather(x, self.source)

    def spread(self, y, backward: bool, zero_out: bool):
        """One direction's compacted outputs y [T, B, u] back at their steps: a masked step gets the
        output before it in processing order (zeros before the first), or zeros if zero_out."""
        op = self.op
        index, present = (self.next, self.has_next) if backward else (
            op.Max(self.last, op.Constant(value_int=0)), self.has_last)
        keep = op.And(present, self.real) if zero_out else present
        out = self._gather(y, index)
        return op.Where(op.Unsqueeze(keep, op.Constant(value_ints=[2])), out, op.CastLike(op.Constant(value_float=0.0),
                                                                                         out))


def _standard_layer(op, cell, names, xin, ws, m, init_h, init_c, u, reset_after, zero_out):
    """One layer of the stack as ONNX's LSTM / GRU / RNN operator: (Y [T, B, D*u] in processing
    order, Y_h [D, B, u], Y_c or None)."""
    D = len(ws)
    acts, alphas, betas = _activation_attrs(names * D)
    attrs = dict(direction="bidirectional" if D == 2 else "forward", activations=acts, hidden_size=u)
    if alphas:
        attrs["activation_alpha"] = alphas
    if betas:
        attrs["activation_beta"] = betas
    if cell == "gru":
        attrs["linear_before_reset"] = 1 if reset_after else 0
    parts = [_direction_weights(op, cell, k, r, b, reset_after) for k, r, b in ws]
    W, R = _stack(op, [p[0] for p in parts]), _stack(op, [p[1] for p in parts])
    B = _stack(op, [p[2] for p in parts]) if parts[0][2] is not None else None
    comp = _Compaction(op, m) if m is not None else None
    x = comp.gather(xin) if comp else xin
    lens = op.Cast(comp.lens, to=6) if comp else None
    Yc = None
    if cell == "lstm":
        Y, Yh, Yc = op.LSTM(x, W, R, B, lens, init_h, init_c, **attrs)
    elif cell == "gru":
        Y, Yh = op.GRU(x, W, R, B, lens, init_h, **attrs)
    else:
        Y, Yh = op.RNN(x, W, R, B, lens, init_h, **attrs)
    if comp is None:  # Y [T, D, B, u] -> [T, B, D*u]
        return op.Reshape(op.Transpose(Y, perm=[0, 2, 1, 3]), op.Constant(value_ints=[0, 0, -1])), Yh, Yc
    ys = op.Split(Y, num_outputs=D, axis=1) if D > 1 else [Y]
    ys = [comp.spread(op.Squeeze(y, op.Constant(value_ints=[1])), d == 1, zero_out) for d, y in enumerate(ys)]
    if init_h is not None:  # a row with no real step keeps its initial states
        empty = op.Unsqueeze(op.Equal(comp.lens, op.Constant(value_int=0)), op.Constant(value_ints=[0, 2]))
        Yh = op.Where(empty, init_h, Yh)
        if Yc is not None and init_c is not None:
            Yc = op.Where(empty, init_c, Yc)
    return (op.Concat(*ys, axis=2) if D > 1 else ys[0]), Yh, Yc


_LOOPS = itertools.count()


class _Body:
    """A Loop body built node by node (onnx_ir): the dynamo exporter's op recorder writes only to
    the main graph. Values of the main graph (weights, constants) are read from the outer scope.
    Every value the body makes is named here, under a prefix no other loop and no model input
    has (ONNX names are one namespace across a graph and its subgraphs)."""

    def __init__(self):
        self.prefix = f"cudnn_rnn_loop{next(_LOOPS)}"
        self.nodes = []

    def value(self, name: str, type_):
        import onnx_ir as ir

        return ir.Value(name=f"{self.prefix}_{name}", type=type_, shape=ir.Shape([]) if name in ("step", "cond")
                        else None)

    def __getattr__(self, op_type: str):
        def node(*inputs, _outputs: int = 1, **attrs):
            import onnx_ir as ir

            n = ir.Node("", op_type, inputs, attributes=ir.convenience.convert_attributes(attrs), num_outputs=_outputs)
            for i, v in enumerate(n.outputs):
                v.name = f"{self.prefix}_{len(self.nodes)}_{i}"
            self.nodes.append(n)
            return n.outputs[0] if _outputs == 1 else list(n.outputs)
        return node


# Keras activation -> its Loop-body form f(b, x, k), b the body builder, k outer-scope constants
# of x's dtype (_constants)
_LOOP_ACTIVATIONS = {
    "linear": lambda b, x, k: x,
    "tanh": lambda b, x, k: b.Tanh(x),
    "sigmoid": lambda b, x, k: b.Sigmoid(x),
    "relu": lambda b, x, k: b.Relu(x),
    "softsign": lambda b, x, k: b.Softsign(x),
    "softplus": lambda b, x, k: b.Softplus(x),
    "exponential": lambda b, x, k: b.Exp(x),
    "hard_sigmoid": lambda b, x, k: b.HardSigmoid(x, alpha=1.0 / 6.0, beta=0.5),
    "hard_sigmoid_keras2": lambda b, x, k: b.HardSigmoid(x, alpha=0.2, beta=0.5),
    "elu": lambda b, x, k: b.Elu(x, alpha=1.0),
    "selu": lambda b, x, k: b.Selu(x, alpha=1.6732632423543772848170429916717, gamma=1.0507009873554804934193349852946),
    "relu6": lambda b, x, k: b.Min(b.Relu(x), k["six"]),
    "silu": lambda b, x, k: b.Mul(x, b.Sigmoid(x)),
    # Keras's default gelu, exact: x/2 (1 + erf(x / sqrt 2))
    "gelu": lambda b, x, k: b.Mul(b.Mul(x, k["half"]), b.Add(k["one"], b.Erf(b.Mul(x, k["inv_sqrt2"])))),
    "mish": lambda b, x, k: b.Mul(x, b.Tanh(b.Softplus(x))),
    "hard_silu": lambda b, x, k: b.Mul(x, b.HardSigmoid(x, alpha=1.0 / 6.0, beta=0.5)),
    "log_sigmoid": lambda b, x, k: b.Neg(b.Softplus(b.Neg(x))),
    "tanh_shrink": lambda b, x, k: b.Sub(x, b.Tanh(x)),
    "celu": lambda b, x, k: b.Celu(x, alpha=1.0),
    "hard_shrink": lambda b, x, k: b.Shrink(x, bias=0.0, lambd=0.5),
    "hard_tanh": lambda b, x, k: b.Max(b.Min(x, k["one"]), b.Neg(k["one"])),
    "leaky_relu": lambda b, x, k: b.LeakyRelu(x, alpha=0.2),
    "soft_shrink": lambda b, x, k: b.Shrink(x, bias=0.5, lambd=0.5),
    # relu(x + 1)^2 / 4 below 1 (zero from -1 down), x from 1 up
    "sparse_plus": lambda b, x, k: b.Where(b.GreaterOrEqual(x, k["one"]), x,
                                           b.Mul(b.Mul(k["half"], k["half"]),
                                                 b.Mul(b.Relu(b.Add(x, k["one"])), b.Relu(b.Add(x, k["one"]))))),
    "sparse_sigmoid": lambda b, x, k: b.Min(b.Relu(b.Mul(b.Add(x, k["one"]), k["half"])), k["one"]),
    "squareplus": lambda b, x, k: b.Mul(b.Add(x, b.Sqrt(b.Add(b.Mul(x, x), k["four"]))), k["half"]),
}


def _activate(b: _Body, name: str, x, k):
    """Keras activation `name` of x in a Loop body (names checked against _LOOP_ACTIVATIONS at entry)."""
    return _LOOP_ACTIVATIONS[name](b, x, k)


def _constants(op, like) -> dict:
    """The constants _activate and the Loop bodies read, in like's dtype, from the outer scope."""
    return {name: op.CastLike(op.Constant(value_float=v), like)
            for name, v in (("zero", 0.0), ("one", 1.0), ("half", 0.5), ("four", 4.0), ("six", 6.0),
                            ("inv_sqrt2", 0.7071067811865476))}


def _loop_layer(op, cell, names, xin, ws, m, init_h, init_c, u, reset_after, zero_out):
    """One layer of the stack as an ONNX Loop over time, for activations ONNX's recurrent operators
    lack: Keras's cell step by step (the input projection of every step in one MatMul before the
    loop), a masked step keeping the states and giving the previous output (zeros before the
    first real step) or zeros. Returns what _standard_layer returns."""
    import onnx_ir as ir

    k = _constants(op, xin)
    batch_u = op.Concat(op.Shape(xin, start=1, end=2), op.Constant(value_ints=[u]), axis=0)
    zeros = op.Expand(k["zero"], batch_u)  # [B, u]
    steps = op.Shape(xin, start=0, end=1)
    ys, hs, cs = [], [], []
    for d, (kernel, recurrent, bias) in enumerate(ws):
        x_d, m_d = (_flip_time(op, xin, 0), _flip_time(op, m, 1) if m is not None else None) if d == 1 else (xin, m)
        proj = op.MatMul(x_d, kernel)  # [T, B, G*u]
        rec_bias = None
        if bias is not None:
            if cell == "gru" and reset_after:
                in_bias, rec_bias = _gru_biases(op, bias)
                proj = op.Add(proj, in_bias)
            else:
                proj = op.Add(proj, bias)
        real = op.Transpose(m_d, perm=[1, 0]) if m_d is not None else None  # [T, B]
        pick = lambda s: op.Squeeze(op.Slice(s, op.Constant(value_ints=[d]), op.Constant(value_ints=[d + 1]),  # noqa: E731
                                             op.Constant(value_ints=[0])), op.Constant(value_ints=[0]))
        h_init = pick(init_h) if init_h is not None else zeros
        c_init = (pick(init_c) if init_c is not None else zeros) if cell == "lstm" else None

        b = _Body()
        dtype = ir.TensorType(kernel.dtype)  # (values made in the translation have no type yet)
        i_in, cond_in = b.value("step", ir.TensorType(ir.DataType.INT64)), b.value("cond", ir.TensorType(ir.DataType.BOOL))
        h = b.value("h", dtype)
        c = b.value("c", dtype) if cell == "lstm" else None
        y_prev = b.value("y_prev", dtype)
        xt = b.Gather(proj, i_in, axis=0)  # [B, G*u]
        hr = b.MatMul(h, recurrent)
        if cell == "lstm":
            gi, gf, gc, go = b.Split(b.Add(xt, hr), axis=1, num_outputs=4, _outputs=4)
            ra, act = names[0], names[1]
            c_new = b.Add(b.Mul(_activate(b, ra, gf, k), c), b.Mul(_activate(b, ra, gi, k), _activate(b, act, gc, k)))
            h_new = b.Mul(_activate(b, ra, go, k), _activate(b, act, c_new, k))
        elif cell == "gru":
            ra, act = names
            xz, xr, xh = b.Split(xt, axis=1, num_outputs=3, _outputs=3)
            if reset_after:
                if rec_bias is not None:
                    hr = b.Add(hr, rec_bias)
                rz, rr, rh = b.Split(hr, axis=1, num_outputs=3, _outputs=3)
                z, r = _activate(b, ra, b.Add(xz, rz), k), _activate(b, ra, b.Add(xr, rr), k)
                hh = _activate(b, act, b.Add(xh, b.Mul(r, rh)), k)
            else:
                r_zr = op.Slice(recurrent, op.Constant(value_ints=[0]), op.Constant(value_ints=[2 * u]),
                                op.Constant(value_ints=[1]))
                r_h = op.Slice(recurrent, op.Constant(value_ints=[2 * u]), op.Constant(value_ints=[3 * u]),
                               op.Constant(value_ints=[1]))
                rz, rr = b.Split(b.MatMul(h, r_zr), axis=1, num_outputs=2, _outputs=2)
                z, r = _activate(b, ra, b.Add(xz, rz), k), _activate(b, ra, b.Add(xr, rr), k)
                hh = _activate(b, act, b.Add(xh, b.MatMul(b.Mul(r, h), r_h)), k)
            h_new = b.Add(b.Mul(z, h), b.Mul(b.Sub(k["one"], z), hh))
            c_new = None
        else:
            h_new, c_new = _activate(b, names[0], b.Add(xt, hr), k), None
        if real is not None:
            mt = b.Unsqueeze(b.Gather(real, i_in, axis=0), op.Constant(value_ints=[1]))  # [B, 1]
            y_new = b.Where(mt, h_new, k["zero"] if zero_out else y_prev)
            h_new = b.Where(mt, h_new, h)
            c_new = b.Where(mt, c_new, c) if c is not None else None
        else:
            y_new = h_new
        carried_in = [h] + ([c] if c is not None else []) + [y_prev]
        carried_out = [h_new] + ([c_new] if c is not None else []) + [y_new]
        outputs = [b.Identity(cond_in)] + [b.Identity(v) for v in carried_out] + [b.Identity(y_new)]
        body = ir.Graph([i_in, cond_in] + carried_in, outputs, nodes=b.nodes, name=f"{b.prefix}_{cell}_step")
        initial = [h_init] + ([c_init] if c is not None else []) + [zeros]
        results = _loop(op, op.Squeeze(steps), initial, body)
        y_d = results[-1]  # [T, B, u] in processing order
        ys.append(_flip_time(op, y_d, 0) if d == 1 else y_d)
        hs.append(op.Unsqueeze(results[0], op.Constant(value_ints=[0])))
        if c is not None:
            cs.append(op.Unsqueeze(results[1], op.Constant(value_ints=[0])))
    cat = lambda t, axis: op.Concat(*t, axis=axis) if len(t) > 1 else t[0]  # noqa: E731
    return cat(ys, 2), cat(hs, 0), (cat(cs, 0) if cs else None)


def _loop(op, trip_count, initial: list, body):
    """An ONNX Loop node (trip_count steps, no condition) in the graph being traced: onnxscript's
    op.Loop gives a variadic-output operator one output, so the node is made here and handed to
    the exporter's op recorder (torch.onnx's dynamo exporter: onnxscript's current evaluator)."""
    import onnx_ir as ir
    from onnxscript import evaluator

    recorder = evaluator.default()
    try:
        from torch.onnx._internal.exporter._tensors import SymbolicTensor
    except ImportError:
        SymbolicTensor = None
    if SymbolicTensor is None or not isinstance(getattr(recorder, "nodes", None), list):
        raise OnnxExportError(f"this torch ({torch.__version__}) records ONNX graphs in a way cudnn_rnn does not know: "
                              "the Loop that activations outside ONNX's LSTM / GRU / RNN need cannot be made")

    outputs = [SymbolicTensor(recorder.opset) for _ in range(len(body.outputs) - 1)]
    node = ir.Node("", "Loop", [trip_count, op.Constant(value=ir.tensor(True))] + list(initial),
                   attributes=ir.convenience.convert_attributes({"body": body}), outputs=outputs)
    recorder.nodes.append(node)
    return outputs


def _flip_time(op, y, axis: int):
    return op.Slice(y, op.Constant(value_ints=[-1]), op.Constant(value_ints=[-(1 << 62)]),
                    op.Constant(value_ints=[axis]), op.Constant(value_ints=[-1]))


def conv_lstm_forward_to_onnx(x, kernel, recurrent_kernel, bias, mask, h0, c0, dropout_mask, recurrent_dropout_mask,
                              stride, pad_before, pad_after, dilation, activation, recurrent_activation, go_backwards):
    """The translation of cudnn_rnn::conv_lstm_forward (schema in csrc/core/ops.cpp; channels last):
    every step's input convolution as one ONNX Conv over [B*T, C, *S] before an ONNX Loop over
    time whose body runs the recurrent 'same' convolution (stride 1, Keras's asymmetric padding
    for even kernels) and Keras's cell; masked steps (or, with a mask per output position, masked
    positions) keep the states and give the previous output (zeros before the first), as the op
    does (zero_output_for_mask is the module's, after it)."""
    import onnx_ir as ir
    from onnxscript import opset18 as op

    if dropout_mask is not None or recurrent_dropout_mask is not None:
        raise OnnxExportError("dropout masks in the exported call: export the model in eval mode (model.eval())")
    _require_float32(x, "a ConvLSTM layer")
    for name in (activation, recurrent_activation):
        if name not in _LOOP_ACTIVATIONS:
            raise OnnxExportError(f"activation '{name}' has no ONNX translation; this layer cannot be exported")
    rank = len(stride)
    F, ks = kernel.shape[0] // 4, [int(kk) for kk in recurrent_kernel.shape[2:]]
    # x [B, T, *S, C] -> [B*T, C, *S] -> Conv -> [B*T, 4F, *S'] -> [T, B, 4F, *S'] (processing order)
    flat = op.Concat(op.Constant(value_ints=[-1]), op.Shape(x, start=2), axis=0)
    xc = op.Transpose(op.Reshape(x, flat), perm=[0, rank + 1] + list(range(1, rank + 1)))
    proj = op.Conv(xc, kernel, bias, strides=list(stride), dilations=list(dilation),
                   pads=list(pad_before) + list(pad_after))
    bt = op.Shape(x, start=0, end=2)
    proj = op.Reshape(proj, op.Concat(bt, op.Shape(proj, start=1), axis=0))  # [B, T, 4F, *S']
    proj = op.Transpose(proj, perm=[1, 0] + list(range(2, rank + 3)))  # [T, B, 4F, *S']
    # [T, B], or [T, B, *S'] per output position (Keras's Masking before the layer)
    real = op.Transpose(mask, perm=[1, 0] + list(range(2, len(mask.shape)))) if mask is not None else None
    if go_backwards:
        proj = _flip_time(op, proj, 0)
        real = _flip_time(op, real, 0) if real is not None else None
    k = _constants(op, proj)
    to_first = [0, rank + 1] + list(range(1, rank + 1))  # [B, *S', F] -> [B, F, *S']
    state_shape = op.Concat(op.Shape(x, start=0, end=1), op.Constant(value_ints=[F]), op.Shape(proj, start=3), axis=0)
    zeros = op.Expand(k["zero"], state_shape)
    h_init = op.Transpose(h0, perm=to_first) if h0 is not None else zeros
    c_init = op.Transpose(c0, perm=to_first) if c0 is not None else zeros
    rec_before = [(kk - 1) // 2 for kk in ks]
    rec_after = [kk - 1 - p for kk, p in zip(ks, rec_before)]

    b = _Body()
    i_in, cond_in = b.value("step", ir.TensorType(ir.DataType.INT64)), b.value("cond", ir.TensorType(ir.DataType.BOOL))
    dtype = ir.TensorType(kernel.dtype)
    h, c, y_prev = b.value("h", dtype), b.value("c", dtype), b.value("y_prev", dtype)
    z = b.Add(b.Gather(proj, i_in, axis=0), b.Conv(h, recurrent_kernel, pads=rec_before + rec_after))
    gi, gf, gc, go = b.Split(z, axis=1, num_outputs=4, _outputs=4)
    c_new = b.Add(b.Mul(_activate(b, recurrent_activation, gf, k), c),
                  b.Mul(_activate(b, recurrent_activation, gi, k), _activate(b, activation, gc, k)))
    h_new = b.Mul(_activate(b, recurrent_activation, go, k), _activate(b, activation, c_new, k))
    y_new = h_new
    if real is not None:
        mt = b.Gather(real, i_in, axis=0)
        if len(mask.shape) == 2:  # [B] -> [B, 1, 1, ...]
            mt = b.Reshape(mt, op.Constant(value_ints=[-1] + [1] * (rank + 1)))
        else:  # [B, *S'] -> [B, 1, *S']: a masked position keeps its states and its previous output
            mt = b.Unsqueeze(mt, op.Constant(value_ints=[1]))
        y_new = b.Where(mt, h_new, y_prev)
        h_new, c_new = b.Where(mt, h_new, h), b.Where(mt, c_new, c)
    outputs = [b.Identity(cond_in), b.Identity(h_new), b.Identity(c_new), b.Identity(y_new), b.Identity(y_new)]
    body = ir.Graph([i_in, cond_in, h, c, y_prev], outputs, nodes=b.nodes, name=f"{b.prefix}_conv_lstm_step")
    h_n, c_n, _, ys = _loop(op, op.Squeeze(op.Shape(proj, start=0, end=1)), [h_init, c_init, zeros], body)
    to_last = [0] + list(range(2, rank + 2)) + [1]  # [B, F, *S'] -> [B, *S', F]
    y = op.Transpose(ys, perm=[1, 0] + [d + 1 for d in to_last[1:]])  # [T, B, F, *S'] -> [B, T, *S', F]
    empty = [op.Constant(value=ir.tensor(np.zeros(0, np.float32))) for _ in range(3)]  # what backward reads
    return y, op.Transpose(h_n, perm=to_last), op.Transpose(c_n, perm=to_last), *empty


def _count_below(sorted_sequence, values, inclusive: bool, out_int32: bool):
    """torch.searchsorted of values in a 1-D sorted sequence, which ONNX has no operator for: how
    many of its elements lie below each value (at or below: inclusive), from one [..., V]
    comparison (a lookup layer's vocabulary, a Discretization's boundaries); NaN after every
    element, as torch places it."""
    from onnxscript import opset18 as op

    if sorted_sequence.shape is None or len(sorted_sequence.shape) != 1:
        raise OnnxExportError("searchsorted / bucketize in a batch of sorted sequences has no ONNX translation")
    v = op.Unsqueeze(op.CastLike(values, sorted_sequence), op.Constant(value_ints=[-1]))
    below = op.LessOrEqual(sorted_sequence, v) if inclusive else op.Less(sorted_sequence, v)
    count = op.ReduceSum(op.Cast(below, to=7), op.Constant(value_ints=[-1]), keepdims=0)
    if sorted_sequence.dtype is not None and sorted_sequence.dtype.is_floating_point():
        count = op.Where(op.IsNaN(op.Squeeze(v, op.Constant(value_ints=[-1]))), op.Size(sorted_sequence), count)
    return op.Cast(count, to=6) if out_int32 else count


def searchsorted_to_onnx(sorted_sequence, self, out_int32=False, right=False, side=None, sorter=None):
    """aten::searchsorted.Tensor: side "left" counts the elements below each value, "right" those
    at or below it."""
    if sorter is not None:
        raise OnnxExportError("searchsorted with a sorter has no ONNX translation")
    return _count_below(sorted_sequence, self, bool(right) or side == "right", out_int32)


def bucketize_to_onnx(self, boundaries, out_int32=False, right=False):
    """aten::bucketize.Tensor: right=False counts the boundaries below each value
    (boundaries[i - 1] < x <= boundaries[i]), right=True those at or below it."""
    return _count_below(boundaries, self, bool(right), out_int32)


TRANSLATIONS = {torch.ops.cudnn_rnn.rnn_forward.default: rnn_forward_to_onnx,
                torch.ops.cudnn_rnn.conv_lstm_forward.default: conv_lstm_forward_to_onnx,
                torch.ops.aten.searchsorted.Tensor: searchsorted_to_onnx,
                torch.ops.aten.bucketize.Tensor: bucketize_to_onnx}


def refusal(error: BaseException) -> Optional[OnnxExportError]:
    """Our OnnxExportError inside an error torch.onnx.export raised, if that is what it is; or
    one naming the torch operator that torch's exporter has no ONNX translation for (a matrix
    inverse, a stable sort: what some Keras operations compute with)."""
    ours = next((e for e in error_chain(error) if isinstance(e, OnnxExportError)), None)
    if ours is not None:
        return ours
    for e in error_chain(error):
        found = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", str(e))
        if found:
            return OnnxExportError(f"torch's ONNX exporter has no translation for {found.group(1)}, which the model "
                                   "computes (its .pt2 export can run it)")
    return None


def _takes_varargs_only(model: torch.nn.Module) -> bool:
    """Whether model.forward's one parameter is *inputs (torch.export then wants the dynamic
    shapes of all the arguments as one tuple)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    return len(params) == 1 and params[0].kind is inspect.Parameter.VAR_POSITIONAL


@contextlib.contextmanager
def _quiet_optimizer(verbose):
    """Warnings that say nothing about the model, shown only when verbose: onnxscript's
    constant folding logs one for every multi-output Split it leaves (the recurrent
    translations' gate splits), torch's exporter one for each torchvision op it cannot register
    where torchvision is not installed."""
    loggers = [logging.getLogger(name) for name in ("onnxscript.optimizer._constant_folding",
                                                    "torch.onnx._internal.exporter._registration")]
    levels = [logger.level for logger in loggers]
    if not verbose:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _require_exporter() -> None:
    """torch's ONNX exporter runs on the onnx and onnxscript packages, which torch does not
    install: one ImportError naming the missing ones and the command, not onnxscript's traceback."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"ONNX export needs the package{'s' if len(missing) > 1 else ''} {' and '.join(missing)}, "
                          f"which {'are' if len(missing) > 1 else 'is'} not installed: pip install onnx onnxscript "
                          "onnxruntime (cudnn_rnn's [onnx] extra)")


def _name_io(graph, inputs: Sequence[str], outputs: Optional[Sequence[str]]) -> None:
    """Names the graph's inputs and outputs (an ONNX IR graph: values are objects, names only
    labels). A value inside that already has one of the names (torch names values after the ops
    and modules computing them: a layer called "conv1d") is renamed first, so that every name stays
    one value's; an output that is an input, or a value returned twice, keeps its name."""
    import onnx_ir as ir

    targets: Dict[object, str] = {}
    named = ([] if len(graph.inputs) != len(inputs) else list(zip(graph.inputs, inputs))) + \
        ([] if outputs is None or len(graph.outputs) != len(outputs) else list(zip(graph.outputs, outputs)))
    for value, name in named:  # (only where the counts agree: names are never given to the wrong values)
        if value not in targets and name not in targets.values():
            targets[value] = name
    values = list(graph.inputs) + list(graph.initializers.values())
    for node in ir.traversal.RecursiveGraphIterator(graph):
        values.extend(node.outputs)
        for attr in node.attributes.values():  # a Loop / If / Scan body's own inputs
            for sub in (attr.value if isinstance(attr.value, list) else [attr.value]):
                if isinstance(sub, ir.Graph):
                    values.extend(sub.inputs)
    used = {v.name for v in values if v.name}
    wanted = set(targets.values())
    for value in values:
        if value.name in wanted and targets.get(value) != value.name and value not in targets:
            n, k = value.name, 0
            while n in used or n in wanted:
                k += 1
                n = f"{value.name}__{k}"
            _rename(graph, value, n)
            used.add(n)
    for value, name in targets.items():
        _rename(graph, value, name)


def _rename(graph, value, name: str) -> None:
    if graph.initializers.get(value.name) is value:  # (the initializers are keyed by name)
        graph.initializers.pop(value.name)
        value.name = name
        graph.initializers[name] = value
    else:
        value.name = name


def _fixed_dimensions(program, dynamic) -> List[str]:
    """The input dimensions asked to be dynamic that the exported graph holds constant: where
    torch.export cannot prove the shapes over the range, torch.onnx falls back to a draft export,
    which specialises them without a word."""
    def specs(value):
        if isinstance(value, (tuple, list)):
            for v in value:
                yield from specs(v)
        else:
            yield value

    fixed = []
    for graph_input, spec in zip(program.model.graph.inputs, specs(dynamic)):
        for dim in (spec or {}):
            size = graph_input.shape[dim] if graph_input.shape is not None else None
            if isinstance(size, int):
                fixed.append(f"dimension {dim} of {graph_input.name} ({size})")
    return fixed


def export(model: torch.nn.Module, args: tuple, path: Union[str, os.PathLike], dynamic_batch_and_time: bool = True,
           dynamic_shapes=None, **kwargs) -> torch.onnx.ONNXProgram:
    """``torch.onnx.export`` (dynamo) of a model with cudnn_rnn's layers translated to ONNX.

    LSTM / GRU / RNN operators where ONNX has the cell, a ``Loop`` otherwise (other activations,
    ConvLSTM). float32 and inference only: ``model`` is put in eval mode.

    Args:
        model (torch.nn.Module): the model (a converted Keras model takes ``forward(*inputs)``).
        args (tuple): example inputs.
        path (str or os.PathLike): the ``.onnx`` file to write.
        dynamic_batch_and_time (bool): make the batch dynamic, and dimension 1 of every sequence
            input (3-D and up, or integer 2-D token ids) its own dynamic length, from 2 steps or
            the fewest over which torch can prove the model's shapes (at most the example's
            length: give a long enough example to a model that pools over time); 2-D float
            inputs (initial states, a mask given as 0/1 floats) keep their batch only, so pass a
            mask as bool. A dimension torch cannot prove the model's shapes over (a ConvLSTM
            state's first spatial one) keeps the example's size. Default: ``True``.
        dynamic_shapes (optional): torch.export's form, instead of the above; every dimension it
            makes dynamic must stay so, or the export is refused. Default: ``None``.
        **kwargs (Any): passed to ``torch.onnx.export`` (``verbose=True`` shows its progress;
            the weights go inside the ``.onnx`` file unless they pass 1.5 GB or
            ``external_data=True``). A converted Keras model's inputs are named by its
            ``input_keys`` and its outputs as Keras names them (a dict's keys, "key/0" inside a
            nested list, else the output layers' names: ``KerasModel.io_names()``), unless
            ``input_names`` / ``output_names`` are given.

    Returns:
        torch.onnx.ONNXProgram: the program, also saved to ``path``.

    Raises:
        OnnxExportError: naming what has no ONNX translation.
        ImportError: the onnx or onnxscript package is not installed.

    Example:
        >>> import cudnn_rnn.onnx
        >>> model = cudnn_rnn.load_keras("examples/sentiment.h5")
        >>> program = cudnn_rnn.onnx.export(model, (torch.randint(1, 50, (2, 20)),), "sentiment.onnx")
    """
    _require_exporter()
    strings = model.string_inputs() if hasattr(model, "string_inputs") else []  # (a converted Keras model)
    if strings:
        raise OnnxExportError(f"the model takes strings (input {strings[0]}: a string layer reads it), which an "
                              "exported program cannot; export the model after those layers")
    model = model.eval()
    kwargs.setdefault("verbose", False)  # torch's step-by-step progress lines
    # One self-contained file (torch writes the weights to a `.onnx.data` file beside it by
    # default) wherever protobuf's 2 GiB limit allows.
    weight_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    kwargs.setdefault("external_data", weight_bytes > 1_500_000_000)

    def run(dynamic, _minimum=None):
        with _quiet_optimizer(kwargs["verbose"]):
            program = torch.onnx.export(model, args, str(path), dynamo=True, custom_translation_table=TRANSLATIONS,
                                        dynamic_shapes=dynamic, **kwargs)
        fixed = _fixed_dimensions(program, dynamic) if dynamic_shapes is not None else []
        if fixed:  # (worded as torch.export's own refusal: export_from_length tries a longer minimum)
            raise ValueError(f"Constraints violated: the ONNX exporter made {', '.join(fixed)} a constant")
        return program

    names = model.io_names() if hasattr(model, "io_names") and not {"input_names", "output_names"} & set(kwargs) \
        else None
    if names is not None:  # (named after the export: torch's own value names could collide)
        export_once = run

        def run(dynamic, _minimum=None):
            program = export_once(dynamic, _minimum)
            _name_io(program.model.graph, *names)
            program.save(str(path), external_data=kwargs["external_data"])
            return program

    try:
        if dynamic_shapes is not None or not dynamic_batch_and_time:
            return run(dynamic_shapes)
        # time: dimension 1 of sequences (3-D and up) and token ids, each its own, from the
        # fewest steps whose range torch can prove the model's shapes over (a pooled length must
        # not be 1: the minimum doubles up to the example's own length)
        timed = [i for i, a in enumerate(args) if is_sequence(a.dim(), a.is_floating_point())]
        batch = torch.export.Dim("batch", min=1)

        def shapes_from(minimum):
            dynamic = tuple({0: batch, 1: torch.export.Dim(f"time_{i}", min=minimum)} if i in timed else {0: batch}
                            for i in range(len(args)))
            return (dynamic,) if _takes_varargs_only(model) else dynamic  # a converted Keras model: forward(*inputs)

        return export_from_length(run, shapes_from, 2, min((args[i].shape[1] for i in timed), default=2))[0]
    except Exception as e:  # noqa: BLE001 - torch wraps our refusal in its own error: surface it
        ours = refusal(e)
        if ours is not None:
            raise OnnxExportError(str(ours)) from None
        raise
