"""Parity with torch.nn.LSTM / GRU / RNN through to_torch() and from_torch(): outputs, final
states and every gradient (input, initial state, weights)."""
import pytest
import torch
from torch import nn

import cudnn_rnn

CASES = [
    ("lstm", {}, 1, False),
    ("lstm", {"use_bias": False}, 2, False),
    ("lstm", {}, 2, True),
    ("gru", {}, 1, False),
    ("gru", {"use_bias": False}, 1, True),
    ("gru", {}, 3, True),
    ("simple_rnn", {}, 1, False),
    ("simple_rnn", {"activation": "relu"}, 2, True),
]
LAYERS = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}


def _ours(cell, kwargs, num_layers, bidirectional, dtype):
    torch.manual_seed(0)
    layer = LAYERS[cell](5, 7, num_layers=num_layers, return_sequences=True, return_state=True, dtype=dtype, **kwargs)
    if bidirectional:
        layer = cudnn_rnn.Bidirectional(layer)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.5, 0.5)
    return layer.eval()


def _final_states(out, cell, bidirectional):
    """Our [y, *states] -> torch.nn's (h_n, c_n) of the last layer, directions stacked."""
    states = out[1:]
    per = 2 if cell == "lstm" else 1
    hs = [states[i * per] for i in range(2 if bidirectional else 1)]
    cs = [states[i * per + 1] for i in range(2 if bidirectional else 1)] if cell == "lstm" else []
    return torch.stack(hs), (torch.stack(cs) if cs else None)


@pytest.mark.parametrize("cell,kwargs,num_layers,bidirectional", CASES)
def test_to_torch_outputs_and_gradients(cell, kwargs, num_layers, bidirectional):
    dtype = torch.float64
    ours = _ours(cell, kwargs, num_layers, bidirectional, dtype)
    ref = cudnn_rnn.to_torch(ours)
    x = torch.randn(4, 9, 5, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    out = ours(x)
    y_ref, hidden = ref(x_ref)
    h_ref = hidden[0] if cell == "lstm" else hidden
    torch.testing.assert_close(out[0], y_ref)
    dirs = 2 if bidirectional else 1
    h, c = _final_states(out, cell, bidirectional)
    torch.testing.assert_close(h, h_ref[-dirs:])
    if cell == "lstm":
        torch.testing.assert_close(c, hidden[1][-dirs:])

    g = torch.randn_like(y_ref)
    (out[0] * g).sum().backward()
    (y_ref * g).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    back = cudnn_rnn.from_torch(_grads_as_module(ref))
    for (name, p), (_, q) in zip(ours.named_parameters(), back.named_parameters()):
        torch.testing.assert_close(p.grad, q, msg=lambda m: f"{name}: {m}")


def _grads_as_module(ref):
    """A copy of the torch module whose weights are its gradients, so that from_torch maps them
    into the Keras layout with the same permutations as the weights."""
    clone = type(ref)(ref.input_size, ref.hidden_size, num_layers=ref.num_layers, bias=ref.bias,
                      batch_first=True, bidirectional=ref.bidirectional, dtype=torch.float64,
                      **({"nonlinearity": ref.nonlinearity} if isinstance(ref, nn.RNN) and not isinstance(ref, (nn.LSTM, nn.GRU)) else {}))
    with torch.no_grad():
        for (name, p), (_, q) in zip(clone.named_parameters(), ref.named_parameters()):
            p.copy_(q.grad)
    if ref.bias and not isinstance(ref, nn.GRU):
        # Keras's single bias is b_ih + b_hh, so its gradient is one of the two (they are equal).
        with torch.no_grad():
            for name, p in clone.named_parameters():
                if name.startswith("bias_hh"):
                    p.zero_()
    return clone


@pytest.mark.parametrize("cell,kwargs,num_layers,bidirectional", CASES)
def test_from_torch_matches_torch_with_initial_state(cell, kwargs, num_layers, bidirectional):
    torch.manual_seed(1)
    cls = {"lstm": nn.LSTM, "gru": nn.GRU, "simple_rnn": nn.RNN}[cell]
    extra = {"nonlinearity": kwargs["activation"]} if "activation" in kwargs else {}
    ref = cls(5, 7, num_layers=num_layers, bias=kwargs.get("use_bias", True), batch_first=True,
              bidirectional=bidirectional, **extra)
    ours = cudnn_rnn.from_torch(ref, return_state=True).eval()
    x = torch.randn(3, 6, 5)
    dirs = 2 if bidirectional else 1
    h0 = torch.randn(num_layers * dirs, 3, 7)
    c0 = torch.randn(num_layers * dirs, 3, 7)
    if cell == "lstm":
        y_ref, _ = ref(x, (h0, c0))
        init = [s for i in range(num_layers * dirs) for s in (h0[i], c0[i])]
    else:
        y_ref, _ = ref(x, h0)
        init = list(h0)
    out = ours(x, initial_state=init)
    torch.testing.assert_close(out[0], y_ref, atol=2e-6, rtol=1e-5)


def test_to_torch_refuses_what_torch_cannot_express():
    with pytest.raises(ValueError, match="reset_after=False"):
        cudnn_rnn.GRU(3, 4, reset_after=False).to_torch()
    with pytest.raises(ValueError, match="recurrent_activation='hard_sigmoid'"):
        cudnn_rnn.LSTM(3, 4, recurrent_activation="hard_sigmoid").to_torch()
    with pytest.raises(ValueError, match="merge_mode='sum'"):
        cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(3, 4), merge_mode="sum").to_torch()
    with pytest.raises(ValueError, match="go_backwards"):
        cudnn_rnn.SimpleRNN(3, 4, go_backwards=True).to_torch()
    with pytest.raises(TypeError, match="GRU.from_torch needs a matching torch module"):
        cudnn_rnn.GRU.from_torch(nn.LSTM(3, 4, batch_first=True))


def test_from_torch_refuses_time_major_modules():
    """torch's default batch_first=False means (time, batch, features) input: converted silently,
    the same weights would run on transposed data."""
    with pytest.raises(ValueError, match=r"batch_first=False .* set module.batch_first = True"):
        cudnn_rnn.from_torch(nn.GRU(3, 4))
    module = nn.LSTM(3, 4)
    x_time_major = torch.randn(5, 2, 3)
    expected = module(x_time_major)[0]
    module.batch_first = True  # what the message says to do
    got = cudnn_rnn.from_torch(module)(x_time_major.transpose(0, 1)).transpose(0, 1)
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
