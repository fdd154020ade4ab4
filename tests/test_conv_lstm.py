"""ConvLSTM1D / ConvLSTM2D / ConvLSTM3D against Keras 3 itself (torch backend): random
configurations (kernel sizes odd and even, strides, dilation, valid / same padding, both data
formats, activations, use_bias, masks of every kind, go_backwards, initial states, returned
sequences and states), float32 within 1e-5 and float64; training-mode dropout with Keras's own
masks imposed on both sides; gradients by gradcheck (float64) and against Keras's autograd;
stateful layers; the op's registration (opcheck) and its errors."""
import numpy as np
import pytest
import torch

import cudnn_rnn
from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)

ATOL = RTOL = 1e-5
SPATIAL = {1: (7,), 2: (6, 5), 3: (4, 5, 3)}
ACTIVATIONS = ["tanh", "relu", "sigmoid", "softsign", "hard_sigmoid"]


def make_mask(kind, batch, time, rng):
    if kind == "none":
        return None
    m = np.ones((batch, time), dtype=bool)
    if kind == "right":
        for b, n in enumerate(rng.randint(1, time + 1, size=batch)):
            m[b, n:] = False
    elif kind == "left":
        for b, n in enumerate(rng.randint(0, time, size=batch)):
            m[b, :n] = False
    elif kind == "holes":
        m = rng.rand(batch, time) < 0.6
        m[0, :] = False  # a row with no real step
    return m


def random_case(seed):
    rng = np.random.RandomState(seed)
    rank = int(rng.choice([1, 2, 3]))
    kernel = tuple(int(k) for k in rng.choice([1, 2, 3], size=rank))
    kw = dict(padding=str(rng.choice(["valid", "same"])), data_format=str(rng.choice(["channels_last",
                                                                                       "channels_first"])),
              activation=str(rng.choice(ACTIVATIONS)), recurrent_activation=str(rng.choice(ACTIVATIONS)),
              use_bias=bool(rng.rand() < 0.8), return_sequences=bool(rng.rand() < 0.6),
              return_state=bool(rng.rand() < 0.4), go_backwards=bool(rng.rand() < 0.3))
    if rng.rand() < 0.3:
        kw["strides"] = tuple(int(s) for s in rng.choice([1, 2], size=rank))
    elif rng.rand() < 0.3:
        kw["dilation_rate"] = tuple(int(d) for d in rng.choice([1, 2], size=rank))
    batch, time, channels, filters = int(rng.randint(1, 4)), int(rng.randint(1, 5)), int(rng.randint(1, 4)), int(
        rng.randint(1, 4))
    spatial = SPATIAL[rank]
    if kw["padding"] == "valid" and "dilation_rate" in kw:
        spatial = tuple(s + 2 for s in spatial)
    return rank, channels, filters, kernel, kw, batch, time, spatial, rng


def build_pair(rank, channels, filters, kernel, kw, rng, dtype=torch.float32):
    ours = getattr(cudnn_rnn, f"ConvLSTM{rank}D")(channels, filters, kernel, dtype=dtype, **kw)
    keras_layer = getattr(keras.layers, f"ConvLSTM{rank}D")(filters, kernel, dtype=str(dtype).split(".")[1], **kw)
    with torch.no_grad():
        for p in ours.parameters():
            p.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(int(rng.randint(1 << 30))))
    return ours, keras_layer


def copy_to_keras(ours, keras_layer, x_shape):
    keras_layer.build(x_shape)
    keras_layer.set_weights([p.detach().numpy() for p in ours.parameters()])


def run_keras(keras_layer, x, mask, initial_state, training=False):
    kwargs = {}
    if mask is not None:
        kwargs["mask"] = keras.ops.convert_to_tensor(mask)
    if initial_state is not None:
        kwargs["initial_state"] = [keras.ops.convert_to_tensor(s.numpy()) for s in initial_state]
    out = keras_layer(keras.ops.convert_to_tensor(x.numpy()), training=training, **kwargs)
    out = out if isinstance(out, (list, tuple)) else [out]
    return [torch.as_tensor(np.asarray(keras.ops.convert_to_numpy(t))) for t in out]


def x_shape(kw, batch, time, channels, spatial):
    if kw["data_format"] == "channels_last":
        return (batch, time, *spatial, channels)
    return (batch, time, channels, *spatial)


def assert_close(ours, expected, atol=ATOL, rtol=RTOL):
    ours = ours if isinstance(ours, list) else [ours]
    assert len(ours) == len(expected)
    for i, (a, b) in enumerate(zip(ours, expected)):
        assert tuple(a.shape) == tuple(b.shape), f"output {i}: shape {tuple(a.shape)}, Keras {tuple(b.shape)}"
        torch.testing.assert_close(a.detach(), b.to(a.dtype), atol=atol, rtol=rtol, msg=lambda m: f"output {i}: {m}")


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(48))
def test_random_conv_lstm_matches_keras(seed):
    rank, channels, filters, kernel, kw, batch, time, spatial, rng = random_case(seed)
    ours, keras_layer = build_pair(rank, channels, filters, kernel, kw, rng)
    shape = x_shape(kw, batch, time, channels, spatial)
    x = torch.from_numpy(rng.uniform(-1, 1, size=shape).astype(np.float32))
    copy_to_keras(ours, keras_layer, shape)
    mask = make_mask(str(rng.choice(["none", "right", "left", "holes"])), batch, time, rng)
    initial = None
    if rng.rand() < 0.3:
        state = ours.output_spatial(spatial)
        s_shape = (batch, *state, filters) if kw["data_format"] == "channels_last" else (batch, filters, *state)
        initial = [torch.from_numpy(rng.uniform(-1, 1, size=s_shape).astype(np.float32)) for _ in range(2)]
    got = ours(x, mask=None if mask is None else torch.from_numpy(mask), initial_state=initial)
    assert_close(got, run_keras(keras_layer, x, mask, initial))


@pytest.mark.keras
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_float64_matches_keras(rank):
    rng = np.random.RandomState(rank)
    kw = dict(padding="same", data_format="channels_last", activation="tanh", recurrent_activation="sigmoid",
              use_bias=True, return_sequences=True, return_state=True, go_backwards=False)
    ours, keras_layer = build_pair(rank, 2, 3, 2, kw, rng, dtype=torch.float64)
    shape = (2, 4, *SPATIAL[rank], 2)
    x = torch.from_numpy(rng.uniform(-1, 1, size=shape))
    copy_to_keras(ours, keras_layer, shape)
    mask = make_mask("holes", 2, 4, rng)
    assert_close(ours(x, mask=torch.from_numpy(mask)), run_keras(keras_layer, x, mask, None), atol=1e-12, rtol=1e-12)


def _keras_dropout(keras_layer, input_mask, recurrent_mask):
    """Keras's cell draws its masks in get_dropout_mask / get_recurrent_dropout_mask: these
    return the given ones instead."""
    cell = keras_layer.cell
    cell.get_dropout_mask = lambda step_input: keras.ops.convert_to_tensor(input_mask)
    cell.get_recurrent_dropout_mask = lambda step_input: keras.ops.convert_to_tensor(recurrent_mask)


@pytest.mark.keras
def test_training_dropout_with_keras_masks_matches_keras():
    """Keras 3's ConvLSTMCell takes gate k's mask as row k of its one [B, *S, C] mask (a
    batch-row index, so every sample shares it): imposed on both sides, as our [4, 1, ...] masks."""
    rng = np.random.RandomState(5)
    kw = dict(padding="same", data_format="channels_last", activation="tanh", recurrent_activation="sigmoid",
              use_bias=True, return_sequences=True, return_state=False, go_backwards=False, dropout=0.3,
              recurrent_dropout=0.4)
    ours, keras_layer = build_pair(2, 3, 2, 3, kw, rng)
    shape = (4, 5, 6, 5, 3)
    x = torch.from_numpy(rng.uniform(-1, 1, size=shape).astype(np.float32))
    copy_to_keras(ours, keras_layer, shape)
    drop_in = ((rng.rand(4, 6, 5, 3) > 0.3) / 0.7).astype(np.float32)        # Keras: [B, *S, C]
    drop_rec = ((rng.rand(4, 6, 5, 2) > 0.4) / 0.6).astype(np.float32)       # [B, *S', F]
    _keras_dropout(keras_layer, drop_in, drop_rec)
    ours_in = torch.from_numpy(drop_in).unsqueeze(1)   # [4 gates, 1, *S, C]
    ours_rec = torch.from_numpy(drop_rec).unsqueeze(1)
    ours.dropout_masks = lambda x_op, state, training: (ours_in, ours_rec)
    ours.train()
    mask = make_mask("right", 4, 5, rng)
    assert_close(ours(x, mask=torch.from_numpy(mask)), run_keras(keras_layer, x, mask, None, training=True))


def test_own_dropout_masks_per_gate_and_sequence():
    layer = cudnn_rnn.ConvLSTM2D(3, 2, 3, padding="same", dropout=0.5, recurrent_dropout=0.5, seed=3)
    x = torch.randn(2, 4, 5, 5, 3)
    dmask, rmask = layer.dropout_masks(layer._to_op(x, 2), (2, 5, 5, 2), training=True)
    assert dmask.shape == (4, 2, 5, 5, 3) and rmask.shape == (4, 2, 5, 5, 2)
    assert set(torch.unique(dmask).tolist()) <= {0.0, 2.0} and bool((dmask == 0).any())
    assert layer.dropout_masks(x, (2, 5, 5, 2), training=False) == (None, None)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    a, b = layer(x), layer(x)
    assert not torch.allclose(a, b)  # a new mask per call


@pytest.mark.parametrize("kw", [
    dict(padding="valid"),
    dict(padding="same", kernel_size=2, strides=2, go_backwards=True),
    dict(padding="same", dilation_rate=2, activation="relu", recurrent_activation="hard_sigmoid"),
], ids=["valid", "even-strided-backwards", "dilated-relu"])
def test_gradcheck(kw):
    kw = dict(kw)
    kernel = kw.pop("kernel_size", 3)
    torch.manual_seed(0)
    layer = cudnn_rnn.ConvLSTM2D(2, 2, kernel, return_sequences=True, return_state=True, dtype=torch.float64, **kw)
    x = torch.randn(3, 4, 5, 5, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    state = layer.output_spatial((5, 5))
    h0 = torch.randn(3, *state, 2, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(3, *state, 2, dtype=torch.float64, requires_grad=True)
    assert _gradcheck_layer(layer, x, mask, h0, c0)


@pytest.mark.parametrize("steps", [1, 3])
def test_gradcheck_without_initial_state(steps):
    """Without h0 the first step convolves x alone and the recurrent kernel's gradient skips that
    step (its zero state adds nothing): gradcheck in float64, and the same values and gradients
    as explicit zero states, which run every product (at one step, the recurrent kernel's
    gradient is zero)."""
    torch.manual_seed(3)
    layer = cudnn_rnn.ConvLSTM2D(2, 3, 3, padding="same", return_sequences=True, return_state=True,
                                 dtype=torch.float64)
    x = torch.randn(2, steps, 5, 4, 2, dtype=torch.float64, requires_grad=True)
    params = list(layer.parameters())

    def g(x, kernel, recurrent, bias, zeros=None):
        layer.kernel, layer.recurrent_kernel, layer.bias = kernel, recurrent, bias
        return tuple(layer(x, initial_state=zeros))

    inputs = (x,) + tuple(p.detach().clone().requires_grad_(True) for p in params)
    for name in ("kernel", "recurrent_kernel", "bias"):
        delattr(layer, name)
    assert torch.autograd.gradcheck(g, inputs, atol=1e-6, rtol=1e-5)
    zeros = [torch.zeros(2, 5, 4, 3, dtype=torch.float64)] * 2
    results = []
    for state in (None, zeros):
        out = g(*inputs, zeros=state)
        loss = sum((o * o).sum() for o in out)
        results.append(out + torch.autograd.grad(loss, inputs))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    if steps == 1:
        assert results[0][-2].abs().max() == 0  # the recurrent kernel's gradient
    # A recurrent kernel with an infinity: 0 * inf is nan in the products, so nothing is skipped
    # and both calls give the same nans.
    with torch.no_grad():
        recurrent = inputs[2].detach().clone()
        recurrent[0, 0, 0, 0] = float("inf")
        out_none = g(x, inputs[1], recurrent, inputs[3])
        out_zeros = g(x, inputs[1], recurrent, inputs[3], zeros=zeros)
    assert out_none[0].isnan().any()
    for a, b in zip(out_none, out_zeros):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12, equal_nan=True)


def _gradcheck_layer(layer, x, mask, h0, c0):
    """gradcheck of a float64 layer's outputs in x, the initial states and its parameters."""
    params = list(layer.parameters())

    # the parameters as gradcheck's inputs: the layer reads these tensors in their place
    def g(x, h0, c0, kernel, recurrent, bias):
        layer.kernel, layer.recurrent_kernel, layer.bias = kernel, recurrent, bias
        return tuple(layer(x, mask=mask, initial_state=[h0, c0]))

    inputs = (x, h0, c0) + tuple(p.detach().clone().requires_grad_(True) for p in params)
    for name in ("kernel", "recurrent_kernel", "bias"):
        delattr(layer, name)
    return torch.autograd.gradcheck(g, inputs, atol=1e-6, rtol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("variant", ["plain", "go_backwards", "initial_state", "last_output"])
def test_mask_per_position_matches_keras(rank, variant):
    """A mask [B, T, *S'] (what Keras's Masking gives a ConvLSTM): each masked position keeps its
    h and c and outputs its previous output (zero before its first real step), as backend.rnn
    does with a mask of the state's rank; float64 against Keras."""
    rng = np.random.RandomState(40 + rank)
    kw = dict(padding="same", data_format="channels_last", activation="tanh", recurrent_activation="sigmoid",
              use_bias=True, return_sequences=variant != "last_output", return_state=True,
              go_backwards=variant == "go_backwards")
    ours, keras_layer = build_pair(rank, 2, 3, 2, kw, rng, dtype=torch.float64)
    shape = (3, 5, *SPATIAL[rank], 2)
    x = torch.from_numpy(rng.uniform(-1, 1, size=shape))
    copy_to_keras(ours, keras_layer, shape)
    mask = rng.rand(3, 5, *SPATIAL[rank]) < 0.7
    mask[0] = False  # a row with no real position
    mask[1, :, 0] = False  # a position never real
    initial = None
    if variant == "initial_state":
        initial = [torch.from_numpy(rng.uniform(-1, 1, size=(3, *SPATIAL[rank], 3))) for _ in range(2)]
    got = ours(x, mask=torch.from_numpy(mask), initial_state=initial)
    assert_close(got, run_keras(keras_layer, x, mask, initial), atol=1e-12, rtol=1e-12)


def test_mask_per_position_gradcheck():
    torch.manual_seed(0)
    layer = cudnn_rnn.ConvLSTM2D(2, 2, 3, padding="same", return_sequences=True, return_state=True,
                                 dtype=torch.float64)
    x = torch.randn(2, 4, 4, 3, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 4, 4, 3, generator=torch.Generator().manual_seed(1)) < 0.6
    h0 = torch.randn(2, 4, 3, 2, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 4, 3, 2, dtype=torch.float64, requires_grad=True)
    assert _gradcheck_layer(layer, x, mask, h0, c0)


def test_mask_of_another_shape_is_refused():
    layer = cudnn_rnn.ConvLSTM2D(2, 2, 3, padding="valid")
    x = torch.randn(2, 4, 5, 5, 2)
    with pytest.raises(ValueError, match=r"mask must have shape \(2, 4\) \(batch, time\) or \(2, 4, 3, 3\)"):
        layer(x, mask=torch.ones(2, 4, 5, 5, dtype=torch.bool))


def test_gradcheck_with_dropout_masks():
    torch.manual_seed(1)
    layer = cudnn_rnn.ConvLSTM1D(2, 3, 3, padding="same", return_sequences=True, dtype=torch.float64)
    x = torch.randn(2, 3, 6, 2, dtype=torch.float64, requires_grad=True)
    dm = (torch.rand(4, 2, 6, 2, dtype=torch.float64) > 0.3).double() / 0.7
    rm = (torch.rand(4, 2, 6, 3, dtype=torch.float64) > 0.3).double() / 0.7
    op = torch.ops.cudnn_rnn.conv_lstm_forward

    def f(x, k, r, b):
        return op(x, k, r, b, None, None, None, dm, rm, [1], [1], [1], [1], "tanh", "sigmoid", False)[0]

    k = torch.randn(12, 2, 3, dtype=torch.float64, requires_grad=True)
    r = torch.randn(12, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (x, k, r, b), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kernel,go_backwards,activation", [(3, False, "tanh"), (2, True, "tanh"), (3, True, "relu")])
def test_one_convolution_per_step_matches_two(kernel, go_backwards, activation):
    """With stride 1, dilation 1 and "same" padding the CPU runs a step's input and recurrent
    convolutions as one over x_t and h concatenated (dropout masks shared by the four gates
    too); four identical per-gate masks take the path with two convolutions per step, which the
    Keras tests above check. Both must compute the same outputs, states and gradients (float64),
    with a mask whose rows end early, an even kernel (asymmetric padding) and a scalar cell."""
    torch.manual_seed(2)
    op = torch.ops.cudnn_rnn.conv_lstm_forward
    x = torch.randn(3, 4, 5, 6, 2, dtype=torch.float64, requires_grad=True)
    k = torch.randn(12, 2, kernel, kernel, dtype=torch.float64, requires_grad=True)
    r = torch.randn(12, 3, kernel, kernel, dtype=torch.float64, requires_grad=True)
    b = torch.randn(12, dtype=torch.float64, requires_grad=True)
    dm = (torch.rand(1, 3, 5, 6, 2, dtype=torch.float64) > 0.3).double() / 0.7
    rm = (torch.rand(1, 3, 5, 6, 3, dtype=torch.float64) > 0.3).double() / 0.7
    mask = torch.tensor([[True] * 4, [True, True, True, False], [True, False, False, False]])
    pad_before, pad_after = [(kernel - 1) // 2] * 2, [kernel // 2] * 2

    def run(d, rr):
        y, h, c = op(x, k, r, b, mask, None, None, d, rr, [1, 1], pad_before, pad_after, [1, 1], activation,
                     "sigmoid", go_backwards)[:3]
        grads = torch.autograd.grad((y * y).sum() + h.sum() + (c * c).sum(), (x, k, r, b))
        return (y, h, c) + grads

    for one, four in zip(run(dm, rm), run(dm.expand(4, -1, -1, -1, -1), rm.expand(4, -1, -1, -1, -1))):
        torch.testing.assert_close(one, four, atol=1e-10, rtol=1e-10)


@pytest.mark.keras
def test_gradients_match_keras_autograd():
    """Keras 3 on the torch backend is differentiable by torch.autograd: same loss, same grads."""
    rng = np.random.RandomState(8)
    kw = dict(padding="same", data_format="channels_last", activation="tanh", recurrent_activation="sigmoid",
              use_bias=True, return_sequences=True, return_state=False, go_backwards=True)
    ours, keras_layer = build_pair(2, 2, 3, 3, kw, rng)
    shape = (3, 4, 5, 4, 2)
    x = torch.from_numpy(rng.uniform(-1, 1, size=shape).astype(np.float32))
    copy_to_keras(ours, keras_layer, shape)
    mask = make_mask("holes", 3, 4, rng)
    xo = x.clone().requires_grad_(True)
    (ours(xo, mask=torch.from_numpy(mask)) ** 2).sum().backward()
    xk = x.clone().requires_grad_(True)
    (keras_layer(xk, mask=torch.from_numpy(mask)) ** 2).sum().backward()
    torch.testing.assert_close(xo.grad, xk.grad, atol=1e-5, rtol=1e-5)
    for p, v in zip(ours.parameters(), keras_layer.weights):
        torch.testing.assert_close(p.grad, v.value.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.keras
def test_stateful_carries_states_across_calls():
    rng = np.random.RandomState(2)
    kw = dict(padding="same", data_format="channels_last", activation="tanh", recurrent_activation="sigmoid",
              use_bias=True, return_sequences=False, return_state=False, go_backwards=False, stateful=True)
    ours, keras_layer = build_pair(1, 2, 3, 3, kw, rng)
    shape = (2, 3, 6, 2)
    copy_to_keras(ours, keras_layer, shape)
    for _ in range(3):
        x = torch.from_numpy(rng.uniform(-1, 1, size=shape).astype(np.float32))
        assert_close(ours(x), run_keras(keras_layer, x, None, None))
    ours.reset_states()
    keras_layer.reset_state()
    assert_close(ours(x), run_keras(keras_layer, x, None, None))


def test_opcheck():
    x = torch.randn(2, 3, 5, 4, 2)
    k, r, b = torch.randn(8, 2, 3, 3), torch.randn(8, 2, 3, 3), torch.randn(8)
    mask = torch.tensor([[True, False, True], [True, True, False]])
    args = (x, k, r, b, mask, None, None, None, None, [1, 1], [1, 1], [1, 1], [1, 1], "tanh", "sigmoid", True)
    torch.library.opcheck(torch.ops.cudnn_rnn.conv_lstm_forward.default, args)
    xg = x.clone().requires_grad_(True)
    torch.library.opcheck(torch.ops.cudnn_rnn.conv_lstm_forward.default, (xg,) + args[1:])


def test_compiles_without_graph_breaks():
    torch._dynamo.reset()  # compiled forwards of earlier tests count toward the recompile limit
    layer = cudnn_rnn.ConvLSTM2D(2, 3, 3, padding="same", return_sequences=True)
    x = torch.randn(2, 4, 5, 5, 2)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), layer(x))


@pytest.mark.parametrize("call, message", [
    (lambda l: l(torch.randn(2, 3, 5, 5)), r"x must have shape \(batch, time, \*spatial, channels\) with 2 spatial"),
    (lambda l: l(torch.randn(2, 3, 5, 5, 3)), "and 2 channels; got"),
    (lambda l: l(torch.randn(2, 3, 5, 5, 2, dtype=torch.float64)), "x must be torch.float32"),
    (lambda l: l(torch.randn(2, 3, 5, 5, 2), mask=torch.ones(2, 4, dtype=torch.bool)), r"mask must have shape \(2, 3\)"),
    (lambda l: l(torch.randn(2, 3, 2, 2, 2)), "smaller than the kernel's extent 3"),
    (lambda l: l(torch.randn(2, 3, 5, 5, 2), initial_state=[torch.zeros(2, 3, 3, 3)]), "list of 2 tensors"),
    (lambda l: l(torch.randn(2, 3, 5, 5, 2), initial_state=[torch.zeros(2, 5, 5, 3)] * 2),
     r"initial_state\[0\] must have shape \(2, 3, 3, 3\)"),
])
def test_bad_input_is_named(call, message):
    layer = cudnn_rnn.ConvLSTM2D(2, 3, 3)
    with pytest.raises((ValueError, TypeError), match=message):
        call(layer)


def test_op_checks_its_arguments():
    op = torch.ops.cudnn_rnn.conv_lstm_forward
    x, k, r = torch.randn(2, 3, 5, 2), torch.randn(8, 2, 3), torch.randn(8, 2, 3)
    with pytest.raises(ValueError, match=r"recurrent_kernel must have shape \(8, 2, \*kernel_size\)"):
        op(x, k, torch.randn(8, 3, 3), None, None, None, None, None, None, [1], [0], [0], [1], "tanh", "sigmoid", False)
    with pytest.raises(ValueError, match="stride must hold 1 values"):
        op(x, k, r, None, None, None, None, None, None, [1, 1], [0], [0], [1], "tanh", "sigmoid", False)
    with pytest.raises(ValueError, match="activation must be one of"):
        op(x, k, r, None, None, None, None, None, None, [1], [0], [0], [1], "swish2", "sigmoid", False)
    with pytest.raises(ValueError, match=r"dropout_mask must have shape \(1 or 4, 1 or 2, \[5\], 2\)"):
        op(x, k, r, None, None, None, None, torch.ones(3, 2, 5, 2), None, [1], [0], [0], [1], "tanh", "sigmoid",
           False)


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(6))
def test_keras_models_with_conv_lstm_load_and_match(seed, tmp_path):
    """Whole Keras 3 models (stacked ConvLSTMs, states out, a dense head) in each Keras 3 format."""
    from keras import layers

    from cudnn_rnn.keras import load_keras

    rng = np.random.RandomState(seed)
    rank = 1 + seed % 3
    fmt = "channels_first" if seed % 2 else "channels_last"
    spatial = SPATIAL[rank]
    shape = (4, *spatial, 2) if fmt == "channels_last" else (4, 2, *spatial)
    inp = keras.Input(shape)
    conv = getattr(layers, f"ConvLSTM{rank}D")
    h = conv(3, 2, padding="same", data_format=fmt, return_sequences=True,
             recurrent_activation=str(rng.choice(["sigmoid", "hard_sigmoid"])))(inp)
    h, state_h, state_c = conv(2, 3, padding=str(rng.choice(["same", "valid"])), data_format=fmt,
                               strides=int(rng.choice([1, 2])), go_backwards=bool(seed % 2),
                               return_state=True)(h)
    out = layers.Dense(2)(layers.Flatten()(h))
    model = keras.Model(inp, [out, state_c])
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, (3, *shape)).astype("float32")
    expected = [keras.ops.convert_to_numpy(t) for t in model(x)]
    model.save(tmp_path / "m.keras")
    model.save(tmp_path / "m.h5")
    model.save_weights(tmp_path / "m.weights.h5")
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.h5", None),
                       (tmp_path / "m.weights.h5", str(tmp_path / "m.keras"))):
        with torch.no_grad():
            got = load_keras(path, architecture=arch)(torch.as_tensor(x))
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a.numpy(), b, atol=ATOL, rtol=RTOL, err_msg=path.name)


@pytest.mark.keras
def test_zero_output_for_mask_and_stateful_models_load_fresh(tmp_path):
    """zero_output_for_mask (an RNN keyword ConvLSTM passes on) zeroes masked steps as Keras does;
    a stateful ConvLSTM loaded from a file starts from zero states (the loader's trial run leaves
    none behind), as a freshly loaded Keras model does."""
    from keras import layers

    from cudnn_rnn.keras import load_keras

    rng = np.random.RandomState(9)
    kw = dict(padding="same", data_format="channels_last", activation="tanh", recurrent_activation="sigmoid",
              use_bias=True, return_sequences=True, return_state=False, go_backwards=True, zero_output_for_mask=True)
    ours, keras_layer = build_pair(1, 2, 3, 3, kw, rng)
    shape = (3, 5, 6, 2)
    x = torch.from_numpy(rng.uniform(-1, 1, size=shape).astype(np.float32))
    copy_to_keras(ours, keras_layer, shape)
    mask = make_mask("holes", 3, 5, rng)
    assert_close(ours(x, mask=torch.from_numpy(mask)), run_keras(keras_layer, x, mask, None))

    inp = keras.Input(batch_shape=(2, 3, 6, 2))
    model = keras.Model(inp, layers.ConvLSTM1D(3, 3, padding="same", stateful=True)(inp))
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "s.keras")
    fresh = keras.saving.load_model(tmp_path / "s.keras", compile=False)
    x = rng.uniform(-1, 1, (2, 3, 6, 2)).astype("float32")
    with torch.no_grad():
        got = load_keras(tmp_path / "s.keras")(torch.as_tensor(x))
    np.testing.assert_allclose(got.numpy(), keras.ops.convert_to_numpy(fresh(x)), atol=ATOL, rtol=RTOL)


@pytest.mark.keras
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_keras_next_frame_prediction_model_converts_whole(fmt, tmp_path):
    """The shape of keras.io's ConvLSTM example (next-frame video prediction): ConvLSTM2D layers
    with BatchNormalization between them and a Conv3D head; here with a strided, dilated Conv2D
    under TimeDistributed too. Keras 3 and ours within 1e-5, in every format."""
    from keras import layers

    from cudnn_rnn.keras import load_keras

    rng = np.random.RandomState(4)
    shape = (None, 8, 8, 1) if fmt == "channels_last" else (None, 1, 8, 8)
    inp = keras.Input(shape)
    h = layers.ConvLSTM2D(4, 3, padding="same", return_sequences=True, activation="relu", data_format=fmt)(inp)
    if fmt == "channels_last":
        h = layers.BatchNormalization()(h)
    h = layers.ConvLSTM2D(3, 1, padding="same", return_sequences=True, data_format=fmt)(h)
    if fmt == "channels_last":  # (Keras 3 cannot build a channels_first Conv2D under TimeDistributed here)
        h = layers.TimeDistributed(layers.Conv2D(3, 2, strides=1, dilation_rate=2, padding="same"))(h)
    out = layers.Conv3D(1, (3, 3, 3), activation="sigmoid", padding="same")(h)  # channels last only in Keras here
    model = keras.Model(inp, out)
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32") if "variance" in w.path
                       else rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.weights])
    x = rng.uniform(0, 1, (2, 5) + shape[1:]).astype("float32")
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    model.save(tmp_path / "m.h5")
    for name in ("m.keras", "m.h5"):
        with torch.no_grad():
            got = load_keras(tmp_path / name)(torch.as_tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL, err_msg=name)
    # Conv2D channels first, strided with odd sizes (asymmetric "same" padding)
    img = keras.Input((3, 9, 7))
    conv = keras.Model(img, layers.Conv2D(4, (3, 2), strides=2, padding="same", data_format="channels_first",
                                          activation="tanh")(img))
    conv.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in conv.weights])
    conv.save(tmp_path / "c.keras")
    xi = rng.uniform(-1, 1, (2, 3, 9, 7)).astype("float32")
    with torch.no_grad():
        got = load_keras(tmp_path / "c.keras")(torch.as_tensor(xi)).numpy()
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(conv(xi)), atol=ATOL, rtol=RTOL)


@pytest.mark.keras
@pytest.mark.parametrize("merge_mode", ["concat", "sum", None])
def test_bidirectional_conv_lstm_matches_keras(merge_mode, tmp_path):
    """Bidirectional(ConvLSTM2D) with an explicit mask input and returned states, in .keras and .h5."""
    from keras import layers

    from cudnn_rnn.keras import load_keras

    rng = np.random.RandomState(6)
    x_in, m_in = keras.Input((5, 6, 5, 2)), keras.Input((5,), dtype="bool")
    out = layers.Bidirectional(layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True, return_state=True),
                               merge_mode=merge_mode)(x_in, mask=m_in)
    model = keras.Model([x_in, m_in], keras.tree.flatten(out))
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, (3, 5, 6, 5, 2)).astype("float32")
    m = make_mask("holes", 3, 5, rng)
    expected = [keras.ops.convert_to_numpy(t) for t in keras.tree.flatten(model([x, m]))]
    model.save(tmp_path / "m.keras")
    model.save(tmp_path / "m.h5")
    for name in ("m.keras", "m.h5"):
        with torch.no_grad():
            got = load_keras(tmp_path / name)(torch.as_tensor(x), torch.as_tensor(m))
        assert len(got) == len(expected)
        for i, (a, b) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(a.numpy(), b, atol=ATOL, rtol=RTOL, err_msg=f"{name} output {i}")


def _assert_float32_matches_float64(rank, channels, filters, kernel, kw, batch, time, spatial, rng, seed):
    layer32 = getattr(cudnn_rnn, f"ConvLSTM{rank}D")(channels, filters, kernel, **kw)
    layer64 = getattr(cudnn_rnn, f"ConvLSTM{rank}D")(channels, filters, kernel, dtype=torch.float64, **kw)
    with torch.no_grad():
        for p32, p64 in zip(layer32.parameters(), layer64.parameters()):
            p32.uniform_(-0.7, 0.7, generator=torch.Generator().manual_seed(seed))
            p64.copy_(p32.double())
    shape = x_shape(kw, batch, time, channels, spatial)
    x64 = torch.from_numpy(rng.uniform(-1, 1, size=shape)).requires_grad_(True)
    x32 = x64.detach().float().requires_grad_(True)
    outs = []
    for layer, x in ((layer32, x32), (layer64, x64)):
        got = layer(x)
        got = got if isinstance(got, list) else [got]
        sum(((t.double() * (i + 1)) ** 2).sum() for i, t in enumerate(got)).backward()
        outs.append([t.detach().double() for t in got] + [x.grad.double()] +
                    [p.grad.double() for p in layer.parameters()])
    for i, (a, b) in enumerate(zip(*outs)):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=2e-5, msg=lambda m: f"tensor {i} of {shape}, {kw}: {m}")


@pytest.mark.parametrize("seed", range(60))
def test_float32_matches_float64_on_one_channel_and_narrow_shapes(seed):
    """The same layer in float32 and float64, outputs and every gradient, on shapes that include
    one input channel, one filter, output widths of 1, strides, dilation and both data formats:
    what ATen's float32 convolution gets wrong when a one-channel tensor is a permuted view."""
    rng = np.random.RandomState(1000 + seed)
    rank = 1 + seed % 3
    channels, filters = (1, int(rng.randint(1, 4))) if seed % 2 == 0 else (int(rng.randint(1, 4)), 1)
    kernel = tuple(int(k) for k in rng.choice([1, 2, 3], size=rank))
    kw = dict(padding=str(rng.choice(["valid", "same"])),
              data_format="channels_last" if seed % 4 < 2 else "channels_first",
              return_sequences=bool(seed % 3), return_state=True)
    if seed % 5 < 3:
        kw["strides"] = tuple(int(s) for s in rng.choice([1, 2, 3], size=rank))
    elif seed % 5 == 3:
        kw["dilation_rate"] = tuple(int(d) for d in rng.choice([1, 2], size=rank))
    # spatial sizes from the smallest the kernel takes (an output width of 1) to 4 more
    span = [((k - 1) * (kw.get("dilation_rate") or (1,) * rank)[i] + 1) for i, k in enumerate(kernel)]
    spatial = tuple(int(rng.randint(s if kw["padding"] == "valid" else 1, s + 5)) for s in span)
    batch, time = int(rng.randint(1, 4)), int(rng.randint(1, 5))
    _assert_float32_matches_float64(rank, channels, filters, kernel, kw, batch, time, spatial, rng, seed)


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("rank, kernel, strides, spatial", [
    (2, (2, 3), (1, 2), (4, 4)),        # ATen's float32 convolution of a permuted one-channel view: wrong
    (2, (3, 3), (1, 2), (5, 3)),
    (3, (1, 2, 3), (1, 1, 2), (3, 4, 5)),
    (3, (2, 3, 3), (1, 1, 2), (4, 5, 5)),
    (1, 3, 2, (7,)),
])
def test_one_input_channel_with_strides(rank, kernel, strides, spatial, data_format):
    rng = np.random.RandomState(7)
    kw = dict(strides=strides, data_format=data_format, return_sequences=True, return_state=True)
    for trial in range(3):  # the defect read memory it does not own: it changed from run to run
        _assert_float32_matches_float64(rank, 1, 2, kernel, kw, 2, 3, spatial, rng, trial)
