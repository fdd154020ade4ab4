"""Keras's generic recurrent wrappers against Keras 3 itself (torch backend): RNN over an
LSTMCell / GRUCell / SimpleRNNCell, RNN over StackedRNNCells (mixed cells, agreeing cells that
run as one num_layers stack), and Bidirectional of either, with masks, go_backwards,
return_sequences / return_state, initial states and stateful layers; saved by Keras in each
Keras 3 format and loaded with load_keras: outputs and states within 1e-5. The tf_keras (Keras 2)
files of the same wrappers are fixtures (tests/fixtures/make_fixtures.py, test_keras_fixtures.py)."""

import numpy as np
import pytest
import torch

from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)
from keras import layers

import cudnn_rnn
from cudnn_rnn.keras import ConversionError, load_keras, recurrent_layers

B, T, F = 3, 7, 4
ATOL = RTOL = 1e-5


def _cell(rng, units=None, like=None):
    """A random cell (or a copy of `like`'s configuration with its own weights)."""
    if like is not None:
        return type(like).from_config({**like.get_config(), "name": None})
    kind = str(rng.choice(["LSTMCell", "GRUCell", "SimpleRNNCell"]))
    kw = dict(units=int(units or rng.randint(2, 6)), use_bias=bool(rng.rand() < 0.85),
              activation=str(rng.choice(["tanh", "tanh", "relu", "softsign"])))
    if kind != "SimpleRNNCell":
        kw["recurrent_activation"] = str(rng.choice(["sigmoid", "hard_sigmoid", "sigmoid"]))
    if kind == "GRUCell":
        kw["reset_after"] = bool(rng.rand() < 0.6)
    if rng.rand() < 0.3:
        kw["dropout"], kw["recurrent_dropout"] = 0.2, 0.1  # inference: no effect, but in the config
    return getattr(layers, kind)(**kw)


def _cells(rng):
    """One cell, or a StackedRNNCells of 2-4 (some runs of agreeing cells)."""
    if rng.rand() < 0.4:
        return _cell(rng)
    cells = [_cell(rng)]
    for _ in range(rng.randint(1, 4)):
        cells.append(_cell(rng, like=cells[-1]) if rng.rand() < 0.5 else _cell(rng))
    return layers.StackedRNNCells(cells)


def random_model(seed):
    rng = np.random.RandomState(seed)
    if rng.rand() < 0.3:
        inp = keras.Input((T,), dtype="int32")
        h = layers.Embedding(12, F, mask_zero=True)(inp)
    else:
        inp = keras.Input((T, F))
        h = layers.Masking(0.0)(inp) if rng.rand() < 0.7 else inp
    outputs = []
    n = rng.randint(1, 3)
    for i in range(n):
        last = i == n - 1
        kw = dict(return_sequences=not last or bool(rng.rand() < 0.5), return_state=last and bool(rng.rand() < 0.5),
                  zero_output_for_mask=bool(rng.rand() < 0.3))
        if rng.rand() < 0.35:  # (Keras 3.15 cannot reload a Bidirectional whose layer has go_backwards=True)
            h = layers.Bidirectional(layers.RNN(_cells(rng), **kw), merge_mode=str(rng.choice(
                ["concat", "sum", "ave", "mul"])))(h)
        else:
            h = layers.RNN(_cells(rng), go_backwards=bool(rng.rand() < 0.4), **kw)(h)
        if kw["return_state"]:
            h, states = h[0], keras.tree.flatten(h[1:])
            outputs += states
    outputs.insert(0, h)
    model = keras.Model(inp, outputs)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    if inp.dtype == "int32":
        x = rng.randint(1, 12, size=(B, T)).astype("int32")
        x[1, 5:] = 0
        x[2, :2] = 0
        x[0, 3] = 0
    else:
        x = rng.uniform(-1, 1, size=(B, T, F)).astype("float32")
        x[1, 4:] = 0
        x[2, :1] = 0
        x[0, 2] = 0
    return model, x


def _np_outputs(y):
    return [keras.ops.convert_to_numpy(t) for t in keras.tree.flatten(y)]


def _ours(model, *xs):
    with torch.no_grad():
        y = model(*[torch.as_tensor(x) for x in xs])
    return [t.numpy() for t in (y if isinstance(y, list) else [y])]


def _assert_close(ours, expected, what):
    assert len(ours) == len(expected), f"{what}: {len(ours)} outputs, Keras gives {len(expected)}"
    for i, (a, b) in enumerate(zip(ours, expected)):
        assert a.shape == b.shape, f"{what} output {i}: shape {a.shape}, Keras {b.shape}"
        np.testing.assert_allclose(a, b, atol=ATOL, rtol=RTOL, err_msg=f"{what} output {i}")


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(24))
def test_random_rnn_cell_models_match_keras(seed, tmp_path):
    model, x = random_model(seed)
    expected = _np_outputs(model(x, training=False))
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "m.weights.h5")
    model.save(tmp_path / "m.h5")
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.weights.h5", str(tmp_path / "m.keras")),
                       (tmp_path / "m.h5", None)):
        _assert_close(_ours(load_keras(path, architecture=arch), x), expected, path.name)


@pytest.mark.keras
def test_agreeing_cells_run_as_one_stack_and_the_others_apart(tmp_path):
    inp = keras.Input((T, F))
    cells = [layers.LSTMCell(5), layers.LSTMCell(5), layers.LSTMCell(5), layers.LSTMCell(3),
             layers.GRUCell(3), layers.GRUCell(3, reset_after=False)]
    model = keras.Model(inp, layers.RNN(layers.StackedRNNCells(cells), return_sequences=True, name="cells")(inp))
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    parts = recurrent_layers(ours.layers["cells"])
    assert [(type(p).__name__, p.num_layers, p.units) for p in parts] == [
        ("LSTM", 3, 5), ("LSTM", 1, 3), ("GRU", 1, 3), ("GRU", 1, 3)]
    assert [p.reset_after for p in parts[2:]] == [True, False]


@pytest.mark.keras
@pytest.mark.parametrize("kind", ["stacked", "lstm", "bidirectional"])
def test_initial_states_from_inputs_and_keras3_unmasked_call(kind, tmp_path):
    """Keras 3 passes no mask to a call that has initial_state tensors (Layer.__call__ fills
    `mask` only for a call with one tensor argument): the Masking below changes nothing there,
    though the output still carries the input's mask on to the next layer (tf.keras masked the
    call too: the tfk_rnn_cells fixture)."""
    rng = np.random.RandomState(4)
    x_in = keras.Input((T, F))
    s_in = [keras.Input((5,)), keras.Input((5,)), keras.Input((3,))]
    if kind == "stacked":
        rnn = layers.RNN(layers.StackedRNNCells([layers.LSTMCell(5), layers.GRUCell(3)]), return_sequences=True,
                         return_state=True)
        init = [s_in[:2], s_in[2:]]
    elif kind == "lstm":
        rnn, init = layers.LSTM(5, return_sequences=True, return_state=True), s_in[:2]
    else:
        rnn = layers.Bidirectional(layers.RNN(layers.LSTMCell(5), return_sequences=True), merge_mode="sum")
        init = [s_in[0], s_in[1], s_in[1], s_in[0]]
    out = keras.tree.flatten(rnn(layers.Masking(0.0)(x_in), initial_state=init))
    out[0] = layers.LSTM(2)(out[0])  # masked: the mask goes on
    model = keras.Model([x_in] + s_in, out)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, (B, T, F)).astype("float32")
    x[1, 3:] = 0
    xs = [x] + [rng.uniform(-1, 1, (B, int(s.shape[1]))).astype("float32") for s in s_in]
    expected = _np_outputs(model(xs))
    for suffix in (".keras", ".h5"):
        model.save(tmp_path / f"m{suffix}")
        _assert_close(_ours(load_keras(tmp_path / f"m{suffix}"), *xs), expected, suffix)


@pytest.mark.keras
@pytest.mark.parametrize("stacked", [False, True])
def test_stateful_rnn_cells_carry_states_across_calls(stacked, tmp_path):
    rng = np.random.RandomState(5)
    cell = layers.StackedRNNCells([layers.GRUCell(4), layers.LSTMCell(3)]) if stacked else layers.LSTMCell(3)
    inp = keras.Input(batch_shape=(B, T, F))
    model = keras.Model(inp, layers.RNN(cell, stateful=True, return_sequences=True)(inp))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    chunks = [rng.uniform(-1, 1, (B, T, F)).astype("float32") for _ in range(3)]
    for i, chunk in enumerate(chunks):  # the second and third calls start from the states the previous left
        _assert_close(_ours(ours, chunk), _np_outputs(model(chunk)), f"call {i}")


@pytest.mark.keras
def test_cell_stack_exports_back_to_keras(tmp_path):
    rng = np.random.RandomState(6)
    inp = keras.Input((T, F))
    h = layers.RNN(layers.StackedRNNCells([layers.LSTMCell(3), layers.LSTMCell(3), layers.GRUCell(2)]),
                   return_sequences=True)(inp)
    h = layers.Bidirectional(layers.RNN([layers.SimpleRNNCell(2), layers.GRUCell(3, reset_after=False)]))(h)
    model = keras.Model(inp, layers.RNN(layers.GRUCell(2))(layers.RepeatVector(3)(h)))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    cudnn_rnn.save_keras(ours, tmp_path / "back.keras")
    back = keras.saving.load_model(tmp_path / "back.keras", compile=False)
    for a, b in zip(model.weights, back.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)


@pytest.mark.keras


@pytest.mark.parametrize("cell, message", [
    ({"class_name": "PeepholeLSTMCell", "config": {"units": 2}}, "RNN over a PeepholeLSTMCell cell is not supported"),
    ({"class_name": "StackedRNNCells", "config": {"cells": []}}, "expected a list of 1 to 64 cells"),
    ({"class_name": "StackedRNNCells", "config": {"cells": [{"class_name": "MyCell", "config": {}}]}},
     "RNN over a MyCell cell is not supported (StackedRNNCells cell 0"),
    ("LSTMCell", "not a serialized layer"),
])
def test_unsupported_cells_are_refused_by_name(cell, message, tmp_path):
    model = keras.Sequential([keras.Input((5, 3)), layers.RNN(layers.LSTMCell(2), name="rnn")])
    model.save_weights(tmp_path / "w.weights.h5")
    config = model.get_config()
    config["layers"][1]["config"]["cell"] = cell
    with pytest.raises(ConversionError, match="layer 'rnn'") as info:
        load_keras(tmp_path / "w.weights.h5", architecture={"class_name": "Sequential", "config": config})
    assert message in str(info.value)
