"""Keras 3 (torch backend) as the oracle: builds the Keras equivalent of one of our layers, with
our weights copied in, and runs it. Nothing here reimplements a cell: every number comes out of
keras.layers.

The one activation Keras 3 does not ship is the Keras 2 hard_sigmoid; it is given to Keras as a
function written with keras.ops from its Keras 2 definition, clip(0.2 x + 0.5, 0, 1)
(tf-keras backend.py, see shared/reference/keras.md section 4.3).
"""
import os

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")  # on the CPU also where a GPU is visible (conftest.py says why)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import cudnn_rnn  # noqa: E402

assert keras.backend.backend() == "torch", "the oracle needs KERAS_BACKEND=torch"


@keras.saving.register_keras_serializable(package="cudnn_rnn_tests")
def _hard_sigmoid_keras2(x):
    return keras.ops.clip(0.2 * x + 0.5, 0.0, 1.0)


def keras_activation(name):
    return _hard_sigmoid_keras2 if name == "hard_sigmoid_keras2" else name


def _np(t):
    return t.detach().cpu().numpy()


def _keras_rnn(layer, *, return_sequences, return_state, go_backwards, zero_output_for_mask):
    kwargs = dict(
        units=layer.units,
        activation=keras_activation(layer.activation),
        use_bias=layer.use_bias,
        dropout=layer.dropout,
        recurrent_dropout=layer.recurrent_dropout,
        return_sequences=return_sequences,
        return_state=return_state,
        go_backwards=go_backwards,
        zero_output_for_mask=zero_output_for_mask,
    )
    if layer.cell != "simple_rnn":
        kwargs["recurrent_activation"] = keras_activation(layer.recurrent_activation)
    if layer.cell == "gru":
        kwargs["reset_after"] = layer.reset_after
    cls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU, "simple_rnn": keras.layers.SimpleRNN}[layer.cell]
    return cls(**kwargs)


def _copy_weights(keras_layer, ours, index, input_width):
    keras_layer.build((None, None, input_width))
    cell = keras_layer.cell
    weights = ours.layer_weights(index)
    cell.kernel.assign(_np(weights[0]))
    cell.recurrent_kernel.assign(_np(weights[1]))
    if ours.use_bias:
        cell.bias.assign(_np(weights[2]))


def _patch_dropout(keras_layer, input_mask, recurrent_mask):
    """Makes the Keras cell use the given per-sequence masks ([1 or G, B, W]) instead of drawing
    its own: Keras's cell returns one tensor, or a list of G (implementation=1)."""
    def as_keras(m):
        if m is None:
            return None
        m = keras.ops.convert_to_tensor(_np(m))
        return m[0] if m.shape[0] == 1 else [m[g] for g in range(m.shape[0])]

    cell = keras_layer.cell
    fixed_in, fixed_rec = as_keras(input_mask), as_keras(recurrent_mask)
    cell.get_dropout_mask = lambda step_input: fixed_in
    cell.get_recurrent_dropout_mask = lambda step_input: fixed_rec


def build_keras(ours, dropout_masks=None):
    """A callable f(x, mask, initial_state, training) running the Keras equivalent of `ours` (an
    LSTM/GRU/SimpleRNN, possibly a num_layers stack, or a Bidirectional of one).

    dropout_masks: {(layer, direction): (input mask, recurrent mask)} to impose on Keras."""
    bidirectional = isinstance(ours, cudnn_rnn.Bidirectional)
    sides = [ours.forward_layer, ours.backward_layer] if bidirectional else [ours]
    first = sides[0]
    stack = []
    for l in range(first.num_layers):
        final = l == first.num_layers - 1
        keras_sides = []
        for d, side in enumerate(sides):
            keras_sides.append(_keras_rnn(
                side,
                return_sequences=side.return_sequences if final else True,
                return_state=side.return_state if final else False,
                go_backwards=side.go_backwards,
                zero_output_for_mask=side.zero_output_for_mask,
            ))
        if bidirectional:
            kl = keras.layers.Bidirectional(keras_sides[0], merge_mode=ours.merge_mode if final else "concat",
                                            backward_layer=keras_sides[1])
            width = first.input_size if l == 0 else 2 * first.units
            kl.build((None, None, width))
            pairs = [(kl.forward_layer, sides[0]), (kl.backward_layer, sides[1])]
        else:
            kl = keras_sides[0]
            width = first.input_size if l == 0 else first.units
            pairs = [(kl, sides[0])]
        for d, (keras_layer, side) in enumerate(pairs):
            _copy_weights(keras_layer, side, l, width)
            if dropout_masks is not None:
                _patch_dropout(keras_layer, *dropout_masks.get((l, d), (None, None)))
        stack.append(kl)

    n_states = first.state_count * len(sides)

    def run(x, mask=None, initial_state=None, training=False):
        h = keras.ops.convert_to_tensor(_np(x))
        m = None if mask is None else keras.ops.convert_to_tensor(_np(mask))
        for l, kl in enumerate(stack):
            init = None
            if initial_state is not None:
                init = [keras.ops.convert_to_tensor(_np(s)) for s in initial_state[l * n_states : (l + 1) * n_states]]
            h = kl(h, mask=m, initial_state=init, training=training)
        out = h if isinstance(h, (list, tuple)) else [h]
        return [torch.as_tensor(np.asarray(keras.ops.convert_to_numpy(t))) for t in out]

    return run
