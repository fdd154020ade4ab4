"""Module structure: parameter names and shapes (the Keras tensors), Keras initialisers."""
import pytest
import torch

import cudnn_rnn


def test_parameters_are_the_keras_tensors():
    shapes = {n: tuple(p.shape) for n, p in cudnn_rnn.LSTM(5, 3, num_layers=2).named_parameters()}
    assert shapes == {"kernel": (5, 12), "recurrent_kernel": (3, 12), "bias": (12,),
                      "kernel_l1": (3, 12), "recurrent_kernel_l1": (3, 12), "bias_l1": (12,)}
    assert {n: tuple(p.shape) for n, p in cudnn_rnn.GRU(5, 3).named_parameters()}["bias"] == (2, 9)
    assert {n: tuple(p.shape) for n, p in cudnn_rnn.GRU(5, 3, reset_after=False).named_parameters()}["bias"] == (9,)
    assert [n for n, _ in cudnn_rnn.SimpleRNN(5, 3, use_bias=False).named_parameters()] == ["kernel", "recurrent_kernel"]
    bi = cudnn_rnn.Bidirectional(cudnn_rnn.GRU(5, 3, num_layers=2))
    assert tuple(bi.forward_layer.kernel_l1.shape) == (6, 9)  # inner layers read both directions
    assert tuple(bi.backward_layer.kernel_l1.shape) == (6, 9) and bi.backward_layer.go_backwards
    assert cudnn_rnn.LSTM(5, 3).state_dict().keys() == {"kernel", "recurrent_kernel", "bias"}


def test_keras_initialisers():
    torch.manual_seed(0)
    layer = cudnn_rnn.LSTM(40, 30)
    limit = (6 / (40 + 120)) ** 0.5  # glorot_uniform over (fan_in, fan_out) = (40, 4u)
    assert layer.kernel.abs().max() <= limit and layer.kernel.abs().max() > 0.9 * limit
    r = layer.recurrent_kernel.detach()  # orthogonal: (u, 4u) has orthonormal rows
    torch.testing.assert_close(r @ r.T, torch.eye(30), atol=1e-5, rtol=0)
    expected_bias = torch.zeros(120)
    expected_bias[30:60] = 1.0  # unit_forget_bias
    torch.testing.assert_close(layer.bias.detach(), expected_bias)
    assert layer.bias.detach().abs().sum() == 30
    assert cudnn_rnn.LSTM(4, 3, unit_forget_bias=False).bias.detach().abs().sum() == 0
    ones = cudnn_rnn.GRU(4, 3, kernel_initializer="ones", bias_initializer="ones")
    assert bool((ones.kernel == 1).all()) and bool((ones.bias == 1).all())


def test_float64_layers():
    layer = cudnn_rnn.GRU(3, 4, dtype=torch.float64, return_sequences=True)
    assert layer(torch.randn(2, 5, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("make", [
    lambda: cudnn_rnn.LSTM(6, 5, return_sequences=True),
    lambda: cudnn_rnn.Bidirectional(cudnn_rnn.GRU(6, 4, return_sequences=True)),
    lambda: cudnn_rnn.ConvLSTM1D(6, 3, 3, padding="same", return_sequences=True),
], ids=["lstm", "bidirectional-gru", "conv-lstm"])
def test_autocast_runs_in_the_parameters_precision(make):
    """Under torch.autocast (CPU, bfloat16) a layer after a Linear gets the Linear's bfloat16
    output and computes in float32 on it, exactly as called outside autocast on that input."""
    torch.manual_seed(0)
    linear, layer = torch.nn.Linear(4, 6), make()
    x = torch.randn(2, 7, 4) if not isinstance(layer, cudnn_rnn.ConvLSTM1D) else torch.randn(2, 3, 7, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = linear(x)
        assert h.dtype == torch.bfloat16
        got = layer(h)
    expected = layer(h.float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _Doubled(torch.nn.Module):
    def forward(self, w):
        return 2 * w


@pytest.mark.parametrize("make", [lambda: cudnn_rnn.LSTM(5, 7, num_layers=2, return_sequences=True),
                                  lambda: cudnn_rnn.GRU(5, 7, use_bias=False, return_sequences=True)])
def test_parametrized_weights_reach_the_op(make):
    """A weight under torch.nn.utils.parametrize is no longer in the module's parameter dict:
    the layer reads it through the parametrization (its gradient reaching the original), as it
    reads a plain parameter directly; the same numbers as a layer holding the doubled weights."""
    from torch.nn.utils import parametrize
    torch.manual_seed(0)
    layer = make()
    plain = make()
    plain.load_state_dict(layer.state_dict())
    with torch.no_grad():
        plain.recurrent_kernel.mul_(2)
        getattr(plain, "kernel_l1", plain.kernel).mul_(2)
    parametrize.register_parametrization(layer, "recurrent_kernel", _Doubled())
    if hasattr(layer, "kernel_l1"):
        parametrize.register_parametrization(layer, "kernel_l1", _Doubled())
    else:
        parametrize.register_parametrization(layer, "kernel", _Doubled())
    x = torch.randn(3, 4, 5)
    y = layer(x)
    torch.testing.assert_close(y, plain(x))
    y.sum().backward()
    assert layer.parametrizations.recurrent_kernel.original.grad is not None
    assert layer.parametrizations.recurrent_kernel.original.grad.abs().sum() > 0


class _Watch(torch.overrides.TorchFunctionMode):
    """A torch function mode that passes every call on: with one active, the layers run their
    Python path (a mode above the dispatcher sees that path's calls)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _states(cell, B, H, kind):
    states = [torch.randn(B, H) for _ in range(2 if cell == "lstm" else 1)]
    if kind == "none":
        return None
    if kind == "tensor":
        return states[0] if cell != "lstm" else states
    return tuple(states) if kind == "tuple" else states


@pytest.mark.parametrize("cell", ["lstm", "gru", "simple_rnn"])
@pytest.mark.parametrize("return_sequences,return_state", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("states", ["none", "list", "tuple", "tensor"])
def test_layer_call_in_cpp_matches_the_python_path(cell, return_sequences, return_state, states):
    """The everyday call runs in C++ (cudnn_rnn._C.layer_call): the same outputs, bit for bit, and
    the same gradients as the Python path, which a torch function mode forces."""
    torch.manual_seed(0)
    make = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}[cell]
    layer = make(5, 7, return_sequences=return_sequences, return_state=return_state)
    x = torch.randn(3, 4, 5, requires_grad=True)
    init = _states(cell, 3, 7, states)
    spec = layer.op_spec().args()
    taken = cudnn_rnn._C.layer_call(x, layer._parameters, ("kernel", "recurrent_kernel", "bias"), init, spec, 5, 7,
                                    2 if cell == "lstm" else 1, return_sequences, return_state, False, None)
    assert taken is not None  # the C++ path takes this call

    def outputs(out):
        return list(out) if isinstance(out, list) else [out]

    fast = outputs(layer(x, initial_state=init))
    with _Watch():
        slow = outputs(layer(x, initial_state=init))
    assert len(fast) == len(slow) == (1 + (2 if cell == "lstm" else 1) * return_state)
    for a, b in zip(fast, slow):
        assert a.shape == b.shape and torch.equal(a, b)
    params = [x] + list(layer.parameters())
    g_fast = torch.autograd.grad(sum((o * o).sum() for o in fast), params)
    g_slow = torch.autograd.grad(sum((o * o).sum() for o in slow), params)
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with torch.no_grad():  # inference (no saved activations) the same way
        fast = outputs(layer(x, initial_state=init))
        with _Watch():
            slow = outputs(layer(x, initial_state=init))
    for a, b in zip(fast, slow):
        assert not a.requires_grad and torch.equal(a, b)


class _Sub(torch.Tensor):
    pass


def test_layer_call_in_cpp_declines_what_the_python_path_runs():
    """What the C++ call does not take it returns None for, and the layer's Python path runs the
    call: its errors name the argument as before."""
    layer = cudnn_rnn.LSTM(5, 7, return_state=True)
    spec = layer.op_spec().args()

    def call(x, states=None):
        return cudnn_rnn._C.layer_call(x, layer._parameters, ("kernel", "recurrent_kernel", "bias"), states, spec, 5, 7,
                                       2, False, True, False, None)

    x = torch.randn(3, 4, 5)
    h = torch.randn(3, 7)
    assert call(x) is not None
    assert call(x.as_subclass(_Sub)) is None  # a subclass (its __torch_function__ sees the Python path)
    assert call(x.double()) is None  # another dtype than the parameters (autocast, or an error)
    assert call(torch.randn(3, 4, 6)) is None
    assert call(torch.randn(3, 0, 5)) is None
    assert call(x, [h]) is None  # LSTM takes two states
    assert call(x, [h, torch.randn(3, 8)]) is None
    assert call(x, [h, "c"]) is None

    class States(list):  # items it makes as they are read: only an exact list or tuple is taken
        def __getitem__(self, i):
            return torch.zeros(3, 7)

    assert call(x, States([h, h])) is None
    weights = dict(layer._parameters)
    weights["kernel"] = weights["kernel"].as_subclass(_Sub)
    assert cudnn_rnn._C.layer_call(x, weights, ("kernel", "recurrent_kernel", "bias"), None, spec, 5, 7, 2, False,
                                   True, False, None) is None

    class Clamped(cudnn_rnn.LSTM):  # overrides a step of the Python path, which then runs
        def run(self, *args, **kwargs):
            y, h_n, c_n = super().run(*args, **kwargs)
            return y.clamp(-0.01, 0.01), h_n, c_n

    clamped = Clamped(5, 7, return_sequences=True)
    assert clamped(x).abs().max() <= 0.01
    with torch.device("cpu"):  # torch's default-device mode only places new tensors: still taken
        assert torch._C._is_torch_function_mode_enabled() and not cudnn_rnn.layers._traced_or_overridden()
    with pytest.raises(ValueError, match=r"x must have shape \(batch, time, 5\)"):
        layer(torch.randn(3, 4, 6))
    with pytest.raises(ValueError, match=r"initial_state\[1\] must have shape \(3, 7\)"):
        layer(x, initial_state=[h, torch.randn(3, 8)])
    with pytest.raises(TypeError, match="must have dtype torch.float32"):
        layer(x.double())


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_stateful_layer_call_in_cpp_keeps_the_states_as_the_python_path(cell):
    """A stateful layer's calls in C++ carry the same states as its Python path: chunk after chunk,
    then after reset_states() (zeros) and reset_states(states)."""
    torch.manual_seed(1)
    make = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU}[cell]
    layer = make(5, 7, stateful=True, return_sequences=True, return_state=True)
    chunks = torch.randn(3, 2, 4, 5).unbind(0)
    given = [torch.randn(2, 7) for _ in range(2 if cell == "lstm" else 1)]

    def stream():
        outs = []
        for x in chunks:
            outs += layer(x)
        layer.reset_states()
        outs += layer(chunks[0])
        layer.reset_states(given)
        outs += layer(chunks[1])
        assert all(not s.requires_grad for s in layer._states)
        outs += [s.clone() for s in layer._states]
        layer.reset_states()
        return outs

    fast = stream()
    with _Watch():
        slow = stream()
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    assert layer._states is None
