"""The recurrent layers: LSTM, GRU, SimpleRNN (and Keras 2's CuDNNLSTM / CuDNNGRU, LSTMV1 /
GRUV1), the generic RNN over an LSTMCell / GRUCell / SimpleRNNCell, and Bidirectional become
cudnn_rnn layers wrapped in Recurrent; RNN over StackedRNNCells becomes a CellStack (the cells'
layers one after the other, cells that agree as one num_layers stack). The options are read from
a Keras config with the producer's defaults, CuDNN weights converted as Keras converts them, and
recurrent_layer / recurrent_layers are the public way to find the cudnn_rnn layers in a
converted model."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np
import torch
from torch import nn

from ... import layers as rnn_layers
from ...cells import GATES
from .activations import activation_name
from ..graph.spec import snake_case
from .registry import BuildContext, builder, layer_config_of
from .values import Values


class Recurrent(nn.Module):
    """A cudnn_rnn layer (or Bidirectional) in the graph: inputs[0] is the sequence, inputs[1:]
    the initial states; outputs [output, *states] as Keras; the output mask is the input mask
    when return_sequences (Keras RNN.compute_mask)."""

    def __init__(self, layer: nn.Module, keras3_call: bool, time_major: bool = False):
        super().__init__()
        self.layer = layer
        self.keras3_call = keras3_call
        # Keras 2's time_major=True: the sequence and its mask come [time, batch, ...], and so does
        # a returned sequence (the states are [batch, units])
        self.time_major = time_major

    def keras_groups(self):
        if isinstance(self.layer, rnn_layers.Bidirectional):
            return [("forward_layer/cell", self.layer.forward_layer.layer_weights(0)),
                    ("backward_layer/cell", self.layer.backward_layer.layer_weights(0))]
        return [("cell", self.layer.layer_weights(0))]

    def load_keras_states(self, states: dict, batch: Optional[int] = None) -> None:
        """The states a tf.keras SavedModel kept for the layer ("states/0", ...; a Bidirectional's
        "forward_layer/states/0", ...) as its stateful layers' next initial states."""
        if isinstance(self.layer, rnn_layers.Bidirectional):
            restore_states(states, [("forward_layer/", self.layer.forward_layer),
                                    ("backward_layer/", self.layer.backward_layer)], batch)
        else:
            restore_states(states, [("", self.layer)], batch)

    def forward(self, inputs, masks):
        initial = list(inputs[1:]) or None
        x, mask = inputs[0], mask_run(inputs, masks, self.keras3_call)
        if self.time_major:
            x, mask = x.transpose(0, 1), mask.transpose(0, 1) if mask is not None else None
        out = self.layer(x, mask=mask, initial_state=initial)
        outs = out if isinstance(out, list) else [out]
        n_outputs = 2 if isinstance(self.layer, rnn_layers.Bidirectional) and self.layer.merge_mode is None else 1
        if self.time_major and self.layer.return_sequences:
            outs = [y.transpose(0, 1) for y in outs[:n_outputs]] + outs[n_outputs:]
        return graph_outputs(outs[:n_outputs], outs[n_outputs:], masks[0] if self.layer.return_sequences else None)


def _cell_state(states: dict, path: str, k: int, count: int):
    """A stacked cell's state k from those a SavedModel kept: f"{path}/{k}", or the cell's one
    state kept at f"{path}" itself (a cell of one state); None where neither is."""
    return states.get(f"{path}/{k}", states.get(path) if count == 1 else None)


def restore_states(states: dict, sides, batch: Optional[int] = None) -> None:
    """Sets stateful layers' states from those a tf.keras SavedModel kept (path -> tensor):
    sides [(path prefix, layer)], each layer's f"{prefix}states/{k}" for k below its state count
    (h, then an LSTM's c: [batch, units], a ConvLSTM's [batch, *spatial, filters] in its
    data_format; `batch`: the one the model's inputs declare, where they do). A layer that is
    not stateful keeps none; a missing or misshapen state raises ValueError."""
    from ... import conv_lstm

    for prefix, layer in sides:
        if not getattr(layer, "stateful", False):
            continue
        convolutional = isinstance(layer, conv_lstm._ConvLSTM)
        count = 2 if convolutional else layer.state_count
        arrays = [states.get(f"{prefix}states/{k}") for k in range(count)]
        if any(a is None for a in arrays):
            raise ValueError(f"the layer is stateful with {count} state(s) ({prefix}states/0..{count - 1}); the "
                             f"SavedModel keeps {', '.join(sorted(states)[:6]) or 'none'}")
        shape = tuple(arrays[0].shape)
        if convolutional:
            channel = 1 if layer.data_format == "channels_first" else -1
            fits = len(shape) == len(layer.kernel_size) + 2 and shape[channel] == layer.filters
        else:  # (a num_layers stack's: [num_layers, batch, units])
            fits = shape[-1:] == (layer.units,) and (len(shape) == 2 and layer.num_layers == 1 or
                                                     len(shape) == 3 and shape[0] == layer.num_layers)
        held = shape[1] if len(shape) == 3 and not convolutional else shape[0]
        if not fits or 0 in shape or any(tuple(a.shape) != shape for a in arrays) or batch not in (None, held):
            raise ValueError(f"its saved states have shapes {[tuple(a.shape) for a in arrays]}; expected "
                             f"[{batch or 'batch'}, {'*spatial, filters' if convolutional else 'units'}] each")
        dtype = next(p.dtype for p in layer.parameters())
        layer.reset_states([a.to(dtype) for a in arrays])


def keras3_call_of(ctx) -> bool:
    """Whether Keras 3's call convention applies to the layer's calls: a Keras 3 file whose calls
    pass no explicit mask (Keras 3 records the masks it fills in, and one the user passes, as the
    call's `mask`; an RNN called with initial_state gets none filled in)."""
    return ctx.keras_major >= 3 and not any(call.kwargs.get("mask") is not None for call in ctx.spec.calls)


def graph_outputs(head: list, states: list, seq_mask):
    """A recurrent layer's graph outputs [*head, *states] and their masks: the output (or both
    unmerged directions) carry the sequence mask when it returns sequences (seq_mask None
    otherwise), the states none."""
    return head + states, [seq_mask] * len(head) + [None] * len(states)


def mask_run(inputs, masks, keras3_call: bool):
    """The mask a recurrent layer's computation sees. Keras 3 fills a call's `mask` only when the
    call has one tensor argument (keras/src/layers/layer.py, Layer.__call__), so an RNN called
    with initial_state tensors and no explicit mask runs unmasked (its output still carries the
    input's mask on, from the first argument); tf.keras 2 masked it."""
    return None if keras3_call and len(inputs) > 1 else masks[0]


class CellStack(nn.Module):
    """Keras RNN(StackedRNNCells([...])), and a Bidirectional of one: at every step each cell
    reads the output of the cell below, which is the same as running the cells' layers one after
    the other over the whole sequence (each one fused op call; consecutive cells that agree in
    everything but their input width are one num_layers layer). The RNN-level options apply to
    the stack: go_backwards reverses the input and the mask once (the outputs stay in processing
    order, as Keras returns them), return_sequences / zero_output_for_mask concern the last cell,
    and an unrolled stack running backwards with zero_output_for_mask zeroes its outputs where the
    mask in time order is False, as Keras's unrolled loop does (_RNNBase.unrolled_zeros).
    tf.keras 2's time_major=True reads the sequence and its mask [time, batch, ...] and returns a
    sequence so (Recurrent.time_major).
    Outputs [output, *states of cell 0, *states of cell 1, ...] as Keras flattens them; a
    Bidirectional's are [merged output (or both), *forward states, *backward states]."""

    def __init__(self, parts: List[rnn_layers._RNNBase], return_sequences: bool, return_state: bool,
                 go_backwards: bool, groups: List[str], backward: Optional["CellStack"] = None,
                 merge_mode: Optional[str] = "concat", *, keras3_call: bool, unrolled_zeros: bool = False,
                 time_major: bool = False):
        super().__init__()
        self.keras3_call = keras3_call
        self.time_major = time_major
        self.unrolled_zeros = unrolled_zeros and go_backwards and return_sequences
        if self.unrolled_zeros:
            parts[-1].zero_output_for_mask = False  # the previous outputs, zeroed in run()
        self.parts = nn.ModuleList(parts)
        self.return_sequences, self.return_state, self.go_backwards = return_sequences, return_state, go_backwards
        self.groups = groups  # the weights group of each cell, in cell order
        self.backward = backward
        self.merge_mode = merge_mode

    @property
    def state_count(self) -> int:
        return sum(p.num_layers * p.state_count for p in self.parts)

    def keras_groups(self):
        cells = [w for p in self.parts for l in range(p.num_layers) for w in [p.layer_weights(l)]]
        own = list(zip(self.groups, cells))
        return own + (self.backward.keras_groups() if self.backward is not None else [])

    def load_keras_states(self, states: dict, batch: Optional[int] = None, prefix: str = "") -> None:
        """The states a tf.keras SavedModel kept for the stack (cell k's "states/k", or an LSTM
        cell's "states/k/0" and "states/k/1"; a Bidirectional's under "forward_layer/" and
        "backward_layer/") as its stateful layers' next initial states, stacked per part."""
        if self.backward is not None and not prefix:
            self.load_keras_states(states, batch, "forward_layer/")
            self.backward.load_keras_states(states, batch, "backward_layer/")
            return
        cell = 0
        for part in self.parts:
            cells = range(cell, cell + part.num_layers)
            cell += part.num_layers
            held = [[_cell_state(states, f"{prefix}states/{c}", k, part.state_count) for c in cells]
                    for k in range(part.state_count)]
            if not part.stateful:
                continue
            if any(a is None or tuple(a.shape) != tuple(row[0].shape) for row in held for a in row):
                kept = ", ".join(sorted(states)[:6]) or "no states"
                raise ValueError(f"the stack's cells {cells.start}-{cells.stop - 1} are stateful; the SavedModel keeps "
                                 f"{kept} under {prefix}states/, not their states of one shape each")
            restore_states({f"states/{k}": torch.stack(row) for k, row in enumerate(held)}, [("", part)], batch)

    def run(self, x, mask, initial):
        """(output sequence in processing order, flat final states) of the stack."""
        time_mask = mask
        if self.go_backwards:
            x = x.flip(1)
            mask = mask.flip(1) if mask is not None else None
        states = []
        for part in self.parts:
            n = part.num_layers * part.state_count
            init, initial = (initial[:n] or None), initial[n:]
            x, h_n, c_n = part.run(x, mask, init)
            for l in range(part.num_layers):
                states += [h_n[l]] + ([c_n[l]] if part.cell == "lstm" else [])
        if self.unrolled_zeros and time_mask is not None:
            x = rnn_layers.keep_where(x, time_mask)
        return x, states

    def forward(self, inputs, masks):
        initial = list(inputs[1:])
        mask = mask_run(inputs, masks, self.keras3_call)
        if initial and len(initial) != self.state_count + (self.backward.state_count if self.backward else 0):
            raise ValueError(f"initial_state must be a list of {self.state_count} tensors (every cell's states, "
                             f"in order); got {len(initial)}")
        x = inputs[0]
        if self.time_major:
            x, mask = x.transpose(0, 1), mask.transpose(0, 1) if mask is not None else None
        y, states = self.run(x, mask, initial[: self.state_count])
        if self.backward is None:
            outputs = [y if self.return_sequences else y[:, -1]]
        else:
            y_b, states_b = self.backward.run(x, mask, initial[self.state_count:])
            if self.return_sequences:
                y_b = y_b.flip(1)  # Keras's Bidirectional puts the backward outputs back in time order
            else:
                y, y_b = y[:, -1], y_b[:, -1]
            merged = rnn_layers.merge_directions(y, y_b, self.merge_mode)
            outputs, states = (merged if isinstance(merged, list) else [merged]), states + states_b
        if self.time_major and self.return_sequences:
            outputs = [o.transpose(0, 1) for o in outputs]
        return graph_outputs(outputs, states if self.return_state else [], masks[0] if self.return_sequences else None)


def recurrent_layer(module: nn.Module) -> Optional[nn.Module]:
    """The cudnn_rnn layer (LSTM, GRU, SimpleRNN or Bidirectional) that a converted model's
    module runs, or None when the module is not one recurrent layer (see recurrent_layers)."""
    return module.layer if isinstance(module, Recurrent) else None


def recurrent_layers(module: nn.Module) -> List[nn.Module]:
    """Every cudnn_rnn layer a converted model (or one of its modules) runs, in the model's order.

    Args:
        module (torch.nn.Module): a model :func:`load_keras` made, or any module in it (a
            recurrent layer, a cell stack, a nested model, a TimeDistributed).

    Returns:
        list: the LSTM, GRU, SimpleRNN and Bidirectional layers (empty where there are none).

    Example:
        >>> model = cudnn_rnn.load_keras("examples/sentiment.h5")
        >>> " + ".join(type(l).__name__ for l in cudnn_rnn.keras.recurrent_layers(model))
        'Bidirectional + GRU'
    """
    if isinstance(module, Recurrent):
        return [module.layer]
    if isinstance(module, CellStack):
        return list(module.parts) + (list(module.backward.parts) if module.backward is not None else [])
    return [layer for child in module.children() for layer in recurrent_layers(child)]


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
    if not cudnn:
        opts["unroll"] = v.bool("unroll", False)
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
    return Recurrent(_build_rnn_layer(cls, cfg, ctx, w), keras3_call_of(ctx), Values(cfg, ctx).bool("time_major", False))


_CELL_CLASSES = {"LSTMCell": "LSTM", "GRUCell": "GRU", "SimpleRNNCell": "SimpleRNN"}
_RNN_LEVEL_KEYS = ("return_sequences", "return_state", "go_backwards", "stateful", "zero_output_for_mask",
                   "time_major", "unroll")


def _cell_of(cfg: dict, ctx: BuildContext):
    """(cell class, cell config) of an RNN config; a list of cells is a StackedRNNCells."""
    cell = cfg.get("cell")
    if isinstance(cell, list):
        cell = {"class_name": "StackedRNNCells", "config": {"cells": cell}}
    try:
        return layer_config_of(cell)
    except ValueError as e:
        raise ctx.error(f"RNN cell: {e}") from None


def _single_cell(cls: str, cell_cfg: dict, rnn_cfg: dict, ctx: BuildContext, where: str):
    """(layer class name, merged config) for an RNN over one cell: the cell's own options with
    the RNN's sequence options."""
    if cls not in _CELL_CLASSES:
        raise ctx.error(f"RNN over a {str(cls)[:60]} cell is not supported ({where}; supported cells: "
                        f"{', '.join(_CELL_CLASSES)}, StackedRNNCells of them)")
    merged = dict(cell_cfg)
    for key in _RNN_LEVEL_KEYS:
        merged.pop(key, None)
        if key in rnn_cfg:
            merged[key] = rnn_cfg[key]
    return _CELL_CLASSES[cls], merged


def _stacked_cells(cell_cfg: dict, ctx: BuildContext) -> List[tuple]:
    """[(cell class, cell config, weights group under cell/cells)] of a StackedRNNCells config."""
    cells = cell_cfg.get("cells")
    if not isinstance(cells, list) or not 1 <= len(cells) <= 64:
        raise ctx.error(f"StackedRNNCells config cells={str(cells)[:60]!r}; expected a list of 1 to 64 cells")
    out, used = [], {}
    for i, entry in enumerate(cells):
        try:
            cls, cfg = layer_config_of(entry)
        except ValueError as e:
            raise ctx.error(f"StackedRNNCells cell {i}: {e}") from None
        base = snake_case(cls)  # .keras files name a list's members by class occurrence
        n = used.get(base, 0)
        used[base] = n + 1
        out.append((cls, cfg, f"cell/cells/{base}" + (f"_{n}" if n else "")))
    return out


def _agree(a: rnn_layers._RNNBase, b: rnn_layers._RNNBase) -> bool:
    """Whether cell b can run as the next layer of a's num_layers stack."""
    return (type(a) is type(b) and b.input_size == a.units and a.units == b.units
            and a.op_spec(num_layers=1) == b.op_spec()
            and (a.dropout, a.recurrent_dropout, a.stateful) == (b.dropout, b.recurrent_dropout, b.stateful))


def _stack_specs(cfg: dict, cell_cfg: dict, ctx: BuildContext, prefix: str) -> List[tuple]:
    """[(layer class name, merged config, weights group, weight count)] of the cells of an
    RNN(StackedRNNCells) config; the groups under `prefix`."""
    specs = []
    for i, (cls, ccfg, group) in enumerate(_stacked_cells(cell_cfg, ctx)):
        # (zero_output_for_mask of an inner cell changes nothing: the next cell skips masked steps)
        kind, merged = _single_cell(cls, ccfg, {**cfg, "go_backwards": False, "return_sequences": True,
                                                "return_state": False}, ctx, f"StackedRNNCells cell {i}")
        specs.append((kind, merged, f"{prefix}{group}", _rnn_weight_count(kind, _rnn_options(kind, merged, ctx))))
    return specs


def _cell_stack(cfg: dict, specs: List[tuple], weights: List[List[np.ndarray]], ctx: BuildContext, **wrap) -> CellStack:
    """The CellStack of an RNN(StackedRNNCells) config from its specs (_stack_specs) and weights."""
    parts: List[rnn_layers._RNNBase] = []
    for (kind, merged, _, _), w in zip(specs, weights):
        layer = _build_rnn_layer(kind, merged, ctx, w)
        if parts and _agree(parts[-1], layer):
            parts[-1] = _append_layer(parts[-1], layer)
        else:
            parts.append(layer)
    v = Values(cfg, ctx)
    return CellStack(parts, v.bool("return_sequences", False), v.bool("return_state", False),
                     v.bool("go_backwards", False), [spec[2] for spec in specs], keras3_call=keras3_call_of(ctx),
                     unrolled_zeros=v.bool("unroll", False) and v.bool("zero_output_for_mask", False), **wrap)


def _append_layer(stack: rnn_layers._RNNBase, layer: rnn_layers._RNNBase) -> rnn_layers._RNNBase:
    """stack with layer's weights as one more layer of its num_layers stack."""
    grown = rnn_layers._clone_config(stack, num_layers=stack.num_layers + 1, kernel_initializer="zeros",
                                     recurrent_initializer="zeros")
    grown.kernel_initializer, grown.recurrent_initializer = stack.kernel_initializer, stack.recurrent_initializer
    with torch.no_grad():
        for l in range(stack.num_layers):
            for dst, src in zip(grown.layer_weights(l), stack.layer_weights(l)):
                dst.copy_(src)
        for dst, src in zip(grown.layer_weights(stack.num_layers), layer.layer_weights(0)):
            dst.copy_(src)
    return grown


@builder("RNN")
def build_generic_rnn(cfg, ctx):
    cls, cell_cfg = _cell_of(cfg, ctx)
    time_major = Values(cfg, ctx).bool("time_major", False)
    if cls == "StackedRNNCells":
        specs = _stack_specs(cfg, cell_cfg, ctx, "")
        return _cell_stack(cfg, specs, ctx.weights.take([(g, n) for _, _, g, n in specs]), ctx, time_major=time_major)
    kind, merged = _single_cell(cls, cell_cfg, cfg, ctx, "RNN")
    (w,) = ctx.weights.take([("cell", _rnn_weight_count(kind, _rnn_options(kind, merged, ctx)))])
    return Recurrent(_build_rnn_layer(kind, merged, ctx, w), keras3_call_of(ctx), time_major)


def _bidirectional_side(serialized, ctx: BuildContext):
    """(layer class name, config, weights sub-path under the side) of one Bidirectional side;
    class "StackedRNNCells" with the RNN config for a stack of cells."""
    try:
        cls, cfg = layer_config_of(serialized)
    except ValueError as e:
        raise ctx.error(f"Bidirectional: {e}") from None
    cfg = dict(cfg)
    if cls == "RNN":
        cell_cls, cell_cfg = _cell_of(cfg, ctx)
        if cell_cls == "StackedRNNCells":
            return "StackedRNNCells", cfg, cell_cfg
        cls, cfg = _single_cell(cell_cls, cell_cfg, cfg, ctx, "Bidirectional(RNN)")
        return cls, cfg, "/cell"
    if cls not in _RNN_CLASSES:
        raise ctx.error(f"Bidirectional({cls}) is not supported")
    return cls, cfg, "" if cls.startswith("CuDNN") else "/cell"


# Bidirectional over layers of other modules (class name -> builder(cfg, ctx, class, layer config,
# merge_mode)): conv_recurrent.py adds ConvLSTM*D, a module above this one.
BIDIRECTIONAL_LAYERS: Dict[str, Callable] = {}


@builder("Bidirectional")
def build_bidirectional(cfg, ctx):
    try:
        inner_cls, inner_cfg = layer_config_of(cfg.get("layer"))
    except ValueError as e:
        raise ctx.error(f"Bidirectional: {e}") from None
    merge = cfg.get("merge_mode", "concat")
    if merge not in ("concat", "sum", "mul", "ave", None):
        raise ctx.error(f"Bidirectional merge_mode={str(merge)[:40]!r}; expected concat, sum, mul, ave or null")
    if inner_cls in BIDIRECTIONAL_LAYERS:
        return BIDIRECTIONAL_LAYERS[inner_cls](cfg, ctx, inner_cls, dict(inner_cfg), merge)
    fcls, fcfg, fsub = _bidirectional_side(cfg.get("layer"), ctx)
    if cfg.get("backward_layer"):
        bcls, bcfg, bsub = _bidirectional_side(cfg["backward_layer"], ctx)
    else:
        bcls, bcfg, bsub = fcls, dict(fcfg), fsub
        bcfg["go_backwards"] = not bcfg.get("go_backwards", False)
    time_major = Values(fcfg, ctx).bool("time_major", False)
    if time_major != Values(bcfg, ctx).bool("time_major", False):
        raise ctx.error("Bidirectional with time_major=True on one side only is not supported")
    if "StackedRNNCells" in (fcls, bcls):
        if fcls != bcls:
            raise ctx.error("Bidirectional with StackedRNNCells on one side only is not supported")
        for side in (fcfg, bcfg):  # Keras's Bidirectional forces it on both sides
            side["zero_output_for_mask"] = Values(side, ctx).bool("return_sequences", False)
        fspecs = _stack_specs(fcfg, fsub, ctx, "forward_layer/")
        bspecs = _stack_specs(bcfg, bsub, ctx, "backward_layer/")
        weights = ctx.weights.take([(g, n) for _, _, g, n in fspecs + bspecs])  # one take: legacy files split it
        backward = _cell_stack(bcfg, bspecs, weights[len(fspecs):], ctx)
        return _cell_stack(fcfg, fspecs, weights[: len(fspecs)], ctx, backward=backward, merge_mode=merge,
                           time_major=time_major)
    nf = _rnn_weight_count(fcls, _rnn_options(fcls, fcfg, ctx))
    nb = _rnn_weight_count(bcls, _rnn_options(bcls, bcfg, ctx))
    wf, wb = ctx.weights.take([("forward_layer" + fsub, nf), ("backward_layer" + bsub, nb)])
    forward = _build_rnn_layer(fcls, fcfg, ctx, wf)
    backward = _build_rnn_layer(bcls, bcfg, ctx, wb)
    return Recurrent(rnn_layers.Bidirectional(forward, merge_mode=merge, backward_layer=backward), keras3_call_of(ctx),
                     time_major)
