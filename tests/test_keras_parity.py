"""Parity with Keras 3 itself (torch backend), float32, max error 1e-5.

Random configurations cover every cell, activation, use_bias, reset_after, go_backwards,
return_sequences / return_state, mask shape (right- and left-padded, holes, empty rows),
initial_state, zero_output_for_mask, dropout and recurrent_dropout (Keras's masks imposed on both
sides), Bidirectional merge modes with and without a distinct backward_layer, and num_layers
stacks (compared with the same stack of Keras layers)."""
import numpy as np
import pytest
import torch

import cudnn_rnn
from keras_oracle import build_keras

ACTIVATIONS = list(cudnn_rnn._C.activation_names())
# exp(exp(...)) overflows to inf/nan within a few random steps; it has its own test below.
SWEEP_ACTIVATIONS = [a for a in ACTIVATIONS if a != "exponential"]
GATE_ACTIVATIONS = ["sigmoid", "hard_sigmoid", "hard_sigmoid_keras2", "tanh", "relu", "linear", "softsign"]
MASK_KINDS = ["none", "right", "left", "holes", "empty_row", "random", "all_true", "first_only", "last_only"]
ATOL = RTOL = 1e-5
N_RANDOM = 240


def make_mask(kind, batch, time, rng):
    if kind == "none":
        return None
    m = np.ones((batch, time), dtype=bool)
    lengths = rng.randint(1, time + 1, size=batch)
    if kind == "right":
        m = np.arange(time)[None, :] < lengths[:, None]
    elif kind == "left":
        m = np.arange(time)[None, :] >= (time - lengths)[:, None]
    elif kind == "holes":
        m = rng.rand(batch, time) > 0.35
        m[:, 0] = True
    elif kind == "empty_row":
        m = rng.rand(batch, time) > 0.3
        m[rng.randint(batch)] = False
    elif kind == "random":
        m = rng.rand(batch, time) > 0.5
    elif kind == "first_only":
        m[:, 1:] = False
    elif kind == "last_only":
        m[:, :-1] = False
    return torch.from_numpy(np.ascontiguousarray(m))


def layer_kwargs(cell, rng, return_sequences, return_state, go_backwards, zero_output):
    kw = dict(
        activation=str(rng.choice(SWEEP_ACTIVATIONS)) if rng.rand() < 0.5 else "tanh",
        use_bias=bool(rng.rand() < 0.8),
        return_sequences=return_sequences,
        return_state=return_state,
        go_backwards=go_backwards,
        zero_output_for_mask=zero_output,
    )
    if cell != "simple_rnn":
        kw["recurrent_activation"] = str(rng.choice(GATE_ACTIVATIONS)) if rng.rand() < 0.5 else "sigmoid"
    if cell == "gru":
        kw["reset_after"] = bool(rng.rand() < 0.5)
    return kw


LAYERS = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}


def randomize_(module, rng, scale=0.7):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-scale, scale, size=tuple(p.shape)).astype(np.float32)))


def random_case(seed):
    rng = np.random.RandomState(seed)
    cell = str(rng.choice(list(LAYERS)))
    batch, time, features, units = rng.randint(1, 5), rng.randint(1, 8), rng.randint(1, 6), rng.randint(1, 7)
    bidirectional = rng.rand() < 0.35
    num_layers = 1 if rng.rand() < 0.75 else 2
    return_sequences = bool(rng.rand() < 0.6)
    return_state = bool(rng.rand() < 0.4)
    go_backwards = bool(rng.rand() < 0.35)
    zero_output = bool(rng.rand() < 0.3)
    kw = layer_kwargs(cell, rng, return_sequences, return_state, go_backwards, zero_output)
    training = rng.rand() < 0.2
    if training:
        kw["dropout"] = float(rng.choice([0.0, 0.3]))
        kw["recurrent_dropout"] = float(rng.choice([0.0, 0.4]))
    layer = LAYERS[cell](features, units, num_layers=num_layers, **kw)
    if bidirectional:
        backward = None
        if num_layers == 1 and rng.rand() < 0.4:  # a backward layer of its own configuration
            bcell = str(rng.choice(list(LAYERS)))
            bkw = layer_kwargs(bcell, rng, return_sequences, return_state, not go_backwards, zero_output)
            backward = LAYERS[bcell](features, int(rng.randint(1, 7)), **bkw)
        merge = rng.choice(["concat", "sum", "mul", "ave", None])
        if backward is not None and backward.units != units and merge not in ("concat", None):
            merge = "concat"
        layer = cudnn_rnn.Bidirectional(layer, merge_mode=merge, backward_layer=backward)
    randomize_(layer, rng)
    x = torch.from_numpy(rng.uniform(-1.5, 1.5, size=(batch, time, features)).astype(np.float32))
    mask = make_mask(str(rng.choice(MASK_KINDS)), batch, time, rng)
    initial_state = None
    sides = [layer.forward_layer, layer.backward_layer] if bidirectional else [layer]
    # Keras's Bidirectional splits initial_state in halves, so both sides need as many states.
    if rng.rand() < 0.3 and len({s.state_count for s in sides}) == 1:
        initial_state = [
            torch.from_numpy(rng.uniform(-1, 1, size=(batch, s.units)).astype(np.float32))
            for l in range(num_layers) for s in sides for _ in range(s.state_count)
        ]
    return layer, x, mask, initial_state, training


def run_both(layer, x, mask, initial_state, training):
    """Our layer and Keras on the same weights, inputs and (when training) dropout masks."""
    layer.train(training)
    sides = [layer.forward_layer, layer.backward_layer] if isinstance(layer, cudnn_rnn.Bidirectional) else [layer]
    imposed = {}
    for d, side in enumerate(sides):
        inputs, recurrent = side.dropout_masks(x, training)
        for l in range(side.num_layers):
            imposed[(l, d)] = (inputs[l] if inputs else None, recurrent[l] if recurrent else None)
        side.dropout_masks = (lambda i, r: lambda x, training: (i, r))(inputs, recurrent)
    ours = layer(x, mask=mask, initial_state=initial_state)
    ours = ours if isinstance(ours, list) else [ours]
    keras_out = build_keras(layer, imposed)(x, mask, initial_state, training)
    return ours, keras_out


def assert_matches(ours, expected):
    assert len(ours) == len(expected), f"{len(ours)} outputs, Keras gives {len(expected)}"
    for i, (a, b) in enumerate(zip(ours, expected)):
        assert tuple(a.shape) == tuple(b.shape), f"output {i}: shape {tuple(a.shape)}, Keras {tuple(b.shape)}"
        torch.testing.assert_close(a.detach(), b, atol=ATOL, rtol=RTOL, msg=lambda m: f"output {i}: {m}")


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(N_RANDOM))
def test_random_config_matches_keras(seed):
    torch.manual_seed(seed)
    assert_matches(*run_both(*random_case(seed)))


@pytest.mark.keras
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("cell", list(LAYERS))
def test_every_activation_matches_keras(cell, activation):
    rng = np.random.RandomState(7)
    kw = {"activation": activation, "return_sequences": True}
    if cell != "simple_rnn" and activation != "exponential":  # exp gates on exp candidates overflow
        kw["recurrent_activation"] = activation
    layer = LAYERS[cell](3, 4, **kw)
    randomize_(layer, rng, scale=0.3)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(2, 5, 3)).astype(np.float32))
    assert_matches(*run_both(layer, x, make_mask("holes", 2, 5, rng), None, False))


@pytest.mark.keras
@pytest.mark.parametrize("merge_mode", ["concat", "sum", "mul", "ave", None])
@pytest.mark.parametrize("cell", list(LAYERS))
def test_bidirectional_merge_modes_match_keras(cell, merge_mode):
    rng = np.random.RandomState(11)
    layer = cudnn_rnn.Bidirectional(LAYERS[cell](3, 4, return_sequences=True, return_state=True), merge_mode=merge_mode)
    randomize_(layer, rng)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(3, 6, 3)).astype(np.float32))
    assert_matches(*run_both(layer, x, make_mask("right", 3, 6, rng), None, False))


@pytest.mark.keras
@pytest.mark.parametrize("cell", list(LAYERS))
@pytest.mark.parametrize("recurrent_dropout", [0.0, 0.4])
def test_dropout_masks_match_keras(cell, recurrent_dropout):
    rng = np.random.RandomState(3)
    kw = dict(dropout=0.3, recurrent_dropout=recurrent_dropout, return_sequences=True, return_state=True)
    if cell == "gru":
        kw["reset_after"] = False
    layer = LAYERS[cell](4, 5, num_layers=2, **kw)
    randomize_(layer, rng)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(3, 6, 4)).astype(np.float32))
    inputs, recurrent = layer.dropout_masks(x, training=True)
    per_gate = layer.gates if recurrent_dropout else 1
    assert inputs[0].shape == (per_gate, 3, 4) and inputs[1].shape == (per_gate, 3, 5)
    assert bool((inputs[0] == 0).any()) and bool(torch.isclose(inputs[0].max(), torch.tensor(1 / 0.7)))
    assert_matches(*run_both(layer, x, make_mask("holes", 3, 6, rng), None, True))


def test_dropout_is_off_in_eval_and_one_mask_per_sequence():
    layer = cudnn_rnn.LSTM(4, 5, dropout=0.5, recurrent_dropout=0.5, return_sequences=True)
    x = torch.randn(3, 6, 4)
    layer.eval()
    assert layer.dropout_masks(x, training=False) == ([], [])
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    torch.manual_seed(0)
    a = layer(x)
    torch.manual_seed(0)
    b = layer(x)
    torch.testing.assert_close(a, b)
    assert not torch.allclose(a, layer(x))


@pytest.mark.keras
@pytest.mark.parametrize("cell", list(LAYERS))
def test_stateful_matches_keras(cell):
    import keras

    rng = np.random.RandomState(5)
    layer = LAYERS[cell](3, 4, stateful=True, return_sequences=True).eval()
    randomize_(layer, rng)
    xs = [torch.from_numpy(rng.uniform(-1, 1, size=(2, 5, 3)).astype(np.float32)) for _ in range(3)]
    kcls = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU, "simple_rnn": keras.layers.SimpleRNN}[cell]
    kl = kcls(4, stateful=True, return_sequences=True)
    kl.build((2, 5, 3))
    w = layer.layer_weights()
    kl.cell.kernel.assign(w[0].detach().numpy())
    kl.cell.recurrent_kernel.assign(w[1].detach().numpy())
    kl.cell.bias.assign(w[2].detach().numpy())
    for x in xs:
        expected = torch.as_tensor(keras.ops.convert_to_numpy(kl(x.numpy())))
        torch.testing.assert_close(layer(x).detach(), expected, atol=ATOL, rtol=RTOL)
    layer.reset_states()
    kl.reset_state()
    expected = torch.as_tensor(keras.ops.convert_to_numpy(kl(xs[0].numpy())))
    torch.testing.assert_close(layer(xs[0]).detach(), expected, atol=ATOL, rtol=RTOL)


def test_random_cases_cover_the_semantics():
    """The random sweep above is only as good as what it draws: check it draws everything."""
    seen = set()
    for seed in range(N_RANDOM):
        layer, x, mask, initial_state, training = random_case(seed)
        bi = isinstance(layer, cudnn_rnn.Bidirectional)
        side = layer.forward_layer if bi else layer
        seen |= {f"cell={side.cell}", f"bidirectional={bi}", f"num_layers={side.num_layers}",
                 f"return_sequences={side.return_sequences}", f"return_state={side.return_state}",
                 f"go_backwards={side.go_backwards}", f"use_bias={side.use_bias}",
                 f"initial_state={initial_state is not None}", f"training={training}",
                 f"recurrent_activation={side.recurrent_activation}", f"mask={mask is not None}"}
        if side.cell == "gru":
            seen.add(f"reset_after={side.reset_after}")
        if bi:
            seen.add(f"merge={layer.merge_mode}")
            seen.add(f"own_backward={type(layer.backward_layer) is not type(side) or layer.backward_layer.units != side.units}")
        if mask is not None and not bool(mask.all()):
            seen.add("masked_steps")
        if training and side.recurrent_dropout:
            seen.add("recurrent_dropout")
    wanted = {f"cell={c}" for c in LAYERS} | {"bidirectional=True", "num_layers=2", "return_state=True",
              "go_backwards=True", "use_bias=False", "initial_state=True", "training=True", "reset_after=False",
              "reset_after=True", "recurrent_activation=hard_sigmoid", "recurrent_activation=hard_sigmoid_keras2",
              "masked_steps", "recurrent_dropout", "own_backward=True"} | {
              f"merge={m}" for m in ["concat", "sum", "mul", "ave", None]}
    assert wanted <= seen, f"never drawn: {sorted(wanted - seen)}"


@pytest.mark.keras
def test_simple_rnn_dropout_rate_one_matches_keras():
    """Keras's SimpleRNN cell applies a rate of 1 (all inputs dropped); LSTM/GRU skip it."""
    rng = np.random.RandomState(4)
    layer = cudnn_rnn.SimpleRNN(3, 4, dropout=1.0, return_sequences=True)
    randomize_(layer, rng)
    x = torch.from_numpy(rng.uniform(-1, 1, size=(2, 5, 3)).astype(np.float32))
    inputs, _ = layer.dropout_masks(x, training=True)
    assert bool((inputs[0] == 0).all())
    assert_matches(*run_both(layer, x, None, None, True))
    assert cudnn_rnn.LSTM(3, 4, dropout=1.0).dropout_masks(x, training=True) == ([], [])
