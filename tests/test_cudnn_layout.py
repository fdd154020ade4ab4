"""The cuDNN weight-space plan, tested on the CPU against torch.nn's own flat weights: torch.nn
lays its cuDNN parameters out as (per pseudo-layer) W_ih, W_hh, b_ih, b_hh with gates in cuDNN
order, so packing our Keras tensors with that layout's offsets must reproduce torch.nn's flat
buffer element for element."""
import pytest
import torch

import cudnn_rnn
from cudnn_rnn import _C
from cudnn_rnn.cells import GATES



def torch_like_offsets(cell, num_layers, dirs, input_size, units, bias=True):
    """(offsets [n, 2], space size) of torch.nn's flat weight order, per (pseudo-layer, linLayerID)."""
    g = GATES[cell]
    rows, pos = [], 0
    for l in range(num_layers):
        width = input_size if l == 0 else dirs * units
        for d in range(dirs):
            w_ih, pos = pos, pos + g * units * width
            w_hh, pos = pos, pos + g * units * units
            b_ih, pos = pos, pos + g * units
            b_hh, pos = pos, pos + g * units
            for k in range(g):
                rows.append((w_ih + k * units * width, b_ih + k * units))
            for k in range(g):
                rows.append((w_hh + k * units * units, b_hh + k * units))
    return torch.tensor(rows, dtype=torch.int64), pos


CASES = [("lstm", 1, False), ("lstm", 2, True), ("gru", 1, False), ("gru", 3, True), ("simple_rnn", 2, False)]


@pytest.mark.parametrize("cell,num_layers,bidirectional", CASES)
def test_packing_reproduces_torch_flat_weights(cell, num_layers, bidirectional):
    torch.manual_seed(0)
    cls = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}[cell]
    layer = cls(5, 3, num_layers=num_layers)
    if bidirectional:
        layer = cudnn_rnn.Bidirectional(layer)
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-1, 1)
    reference = layer.to_torch()  # LSTM / SimpleRNN: bias_hh = 0, exactly DOUBLE_BIAS's plan
    flat = torch.cat([w.detach().reshape(-1) for w in reference._flat_weights])
    sides = [layer.forward_layer, layer.backward_layer] if bidirectional else [layer]
    weights = [w.detach() for l in range(num_layers) for s in sides for w in s.layer_weights(l)]
    dirs = 2 if bidirectional else 1
    offsets, size = torch_like_offsets(cell, num_layers, dirs, 5, 3)
    space = _C._testing.pack_keras_weights(cell, True, True, num_layers, bidirectional, 5, 3, weights, offsets, size)
    torch.testing.assert_close(space, flat, rtol=0, atol=0)

    # Gradients come back the same way: unpacking the packed buffer returns the Keras tensors.
    back = _C._testing.unpack_keras_gradients(cell, True, True, num_layers, bidirectional, 5, 3, weights, offsets, space)
    for a, b in zip(back, weights):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)


def test_gate_tables():
    assert [_C._testing.cudnn_lin_layer("lstm", i) for i in range(8)] == [(0, False), (1, False), (2, False), (3, False),
                                                                  (0, True), (1, True), (2, True), (3, True)]
    # cuDNN GRU is r, z, h; Keras is z, r, h
    assert [_C._testing.cudnn_lin_layer("gru", i) for i in range(6)] == [(1, False), (0, False), (2, False),
                                                                 (1, True), (0, True), (2, True)]
    assert [_C._testing.cudnn_lin_layer("simple_rnn", i) for i in range(2)] == [(0, False), (0, True)]
    with pytest.raises(RuntimeError, match="out of range"):
        _C._testing.cudnn_lin_layer("gru", 6)


def test_no_bias_packs_zeros_and_bad_offsets_are_refused():
    weights = [torch.randn(5, 12), torch.randn(3, 12)]
    offsets, size = torch_like_offsets("lstm", 1, 1, 5, 3)
    space = _C._testing.pack_keras_weights("lstm", False, False, 1, False, 5, 3, weights, offsets, size)
    bias_part = space[4 * 3 * 5 + 4 * 3 * 3:]
    assert bool((bias_part == 0).all()) and bias_part.numel() == 24
    with pytest.raises(RuntimeError, match="fall outside the weight space"):
        _C._testing.pack_keras_weights("lstm", False, False, 1, False, 5, 3, weights, offsets, size - 1)


def _choose(mask=None, cell="lstm", activation="tanh", recurrent_activation="sigmoid", reset_after=True,
            num_layers=1, bidirectional=False, go_backwards=False, dropout_gates=0, recurrent_dropout=False,
            dtype=torch.float32, cudnn_version=92400):
    b, t = (mask.shape if mask is not None else (3, 5))
    return _C._testing.choose_backend(cell, activation, recurrent_activation, reset_after, num_layers, bidirectional,
                             go_backwards, b, t, mask, dropout_gates, recurrent_dropout, dtype, cudnn_version)


def test_mask_to_lengths_and_backend_choice():
    m = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    assert _choose(m) == (True, "", [3, 1, 4])
    assert _choose(None) == (True, "", [5, 5, 5])
    left = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert _choose(left)[:2] == (False, "the mask is not right-padded")
    holes = torch.tensor([[1, 0, 1, 0]], dtype=torch.bool)
    assert _choose(holes)[:2] == (False, "the mask is not right-padded")
    empty = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert _choose(empty)[:2] == (False, "a row of the mask has no real step")
    assert _choose(cell="gru", reset_after=False)[1].startswith("GRU reset_after=False is not supported by cuDNN")
    assert "'hard_sigmoid' is not supported" in _choose(recurrent_activation="hard_sigmoid")[1]
    assert _choose(cell="simple_rnn", activation="relu")[0]
    assert "(tanh or relu only)" in _choose(cell="simple_rnn", activation="elu")[1]
    assert "recurrent_dropout" in _choose(recurrent_dropout=True)[1]
    assert _choose(dropout_gates=1)[0] and "per-gate" in _choose(dropout_gates=4)[1]
    assert "inner layers" in _choose(dropout_gates=1, num_layers=2)[1]
    assert _choose(go_backwards=True)[0] and _choose(go_backwards=True, bidirectional=True)[0]
    assert "go_backwards with a mask" in _choose(m, go_backwards=True)[1]
    assert "go_backwards in a stack" in _choose(go_backwards=True, num_layers=2)[1]
    assert _choose(bidirectional=True, num_layers=3)[0]
    assert "9.13" in _choose(dtype=torch.bfloat16, cudnn_version=91200)[1]
    assert _choose(dtype=torch.bfloat16, cudnn_version=91300)[0]


def test_algorithm_preference_and_choice():
    import cudnn_rnn

    assert cudnn_rnn.cudnn_algorithm() == "auto"
    try:
        cudnn_rnn.set_cudnn_algorithm("standard")
        assert _C.choose_algorithm("lstm", 64, torch.float32, True, 9) == "STANDARD"
        cudnn_rnn.set_cudnn_algorithm("auto")
        assert _C.choose_algorithm("lstm", 64, torch.float32, True, 9) == "PERSIST_STATIC_SMALL_H"
        assert _C.choose_algorithm("lstm", 64, torch.float32, False, 9) == "STANDARD"  # variable lengths
        assert _C.choose_algorithm("lstm", 256, torch.float32, True, 9) == "STANDARD"
        assert _C.choose_algorithm("gru", 64, torch.float32, True, 9) == "STANDARD"  # LSTM only
        assert _C.choose_algorithm("simple_rnn", 256, torch.float16, True, 9) == "STANDARD"
        assert _C.choose_algorithm("gru", 64, torch.float64, True, 9) == "STANDARD"
        assert _C.choose_algorithm("gru", 64, torch.bfloat16, True, 9) == "STANDARD"
        assert _C.choose_algorithm("gru", 64, torch.float32, True, 5) == "STANDARD"  # compute capability < 6
        assert "algorithm PERSIST_STATIC_SMALL_H" in str(cudnn_rnn.explain(cudnn_rnn.LSTM(3, 64), "cuda"))
        cudnn_rnn.set_cudnn_algorithm("persist_static_small_h")
        assert _C.choose_algorithm("simple_rnn", 256, torch.float16, True, 9) == "PERSIST_STATIC_SMALL_H"
        assert _C.choose_algorithm("gru", 64, torch.float32, True, 9) == "PERSIST_STATIC_SMALL_H"
        cudnn_rnn.set_cudnn_algorithm("persist_static")
        assert _C.choose_algorithm("lstm", 512, torch.float32, True, 9) == "PERSIST_STATIC"
        with pytest.raises(ValueError, match="algorithm must be 'standard', 'auto'"):
            cudnn_rnn.set_cudnn_algorithm("fastest")
    finally:
        cudnn_rnn.set_cudnn_algorithm("auto")
