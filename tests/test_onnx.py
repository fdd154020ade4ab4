"""ONNX export (cudnn_rnn/onnx.py): layers and converted Keras models exported with the dynamo
exporter onto ONNX's LSTM / GRU / RNN operators and run in onnxruntime, within 1e-5 of ours (which
the Keras tests pin to Keras): every cell, reset_after both ways, Keras 2 and 3 hard_sigmoid,
stacks, go_backwards, Bidirectional merges, masks padded on either side (rows of both kinds in one
batch) with Keras's outputs at padded steps, states out, dynamic batch and time. What the
standard operators cannot express is loud: a mask with holes gives NaN, an activation ONNX lacks
is refused at export."""
import os
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch

import cudnn_rnn
from cudnn_rnn.onnx import OnnxExportError, export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ATOL = RTOL = 1e-5


class _Call(torch.nn.Module):
    """layer(x, mask=mask) with a tuple of outputs (ONNX exports tensors and tuples)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, mask=None):
        out = self.layer(x, mask=mask)
        return tuple(out) if isinstance(out, list) else out


def _run(module, args, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export(module, args, path)
    session = ort.InferenceSession(str(path))
    return session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})


def _right_padded(batch, time, rng):
    mask = np.ones((batch, time), dtype=bool)
    for b, n in enumerate(rng.randint(0, time + 1, size=batch)):
        mask[b, n:] = False
    mask[0] = True
    return torch.from_numpy(mask)


def _mixed_padding(batch, time, rng):
    """Rows padded on the right, on the left (Keras's pad_sequences default), not at all, or wholly."""
    mask = np.ones((batch, time), dtype=bool)
    for b in range(batch):
        n = int(rng.randint(0, time + 1))
        if b % 2:
            mask[b, : time - n] = False
        else:
            mask[b, n:] = False
    mask[0] = True
    return torch.from_numpy(mask)


MASKS = {"no-mask": None, "right-padded": _right_padded, "left-and-right-padded": _mixed_padding}


LAYERS = {
    "lstm-states": lambda: cudnn_rnn.LSTM(4, 5, return_sequences=True, return_state=True),
    "lstm-hard-sigmoid-keras2": lambda: cudnn_rnn.LSTM(4, 5, recurrent_activation="hard_sigmoid_keras2"),
    "gru-reset-after": lambda: cudnn_rnn.GRU(4, 5, return_sequences=True, return_state=True),
    "gru-reset-before-hard-sigmoid": lambda: cudnn_rnn.GRU(4, 5, reset_after=False, recurrent_activation="hard_sigmoid",
                                                           return_sequences=True),
    "gru-no-bias": lambda: cudnn_rnn.GRU(4, 5, use_bias=False, return_sequences=True),
    "simple-rnn-relu": lambda: cudnn_rnn.SimpleRNN(4, 5, activation="relu", return_sequences=True),
    "lstm-stack-backwards": lambda: cudnn_rnn.LSTM(4, 5, num_layers=2, go_backwards=True, return_sequences=True),
    "gru-backwards-last": lambda: cudnn_rnn.GRU(4, 5, go_backwards=True),
    "lstm-zero-output": lambda: cudnn_rnn.LSTM(4, 5, return_sequences=True, zero_output_for_mask=True),
    "bi-lstm-concat": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(4, 5, return_sequences=True)),
    "bi-gru-stack-sum": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.GRU(4, 5, num_layers=2, return_sequences=True),
                                                       merge_mode="sum"),
    "bi-simple-last": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.SimpleRNN(4, 5), merge_mode="ave"),
}


@pytest.mark.parametrize("masks", list(MASKS))
@pytest.mark.parametrize("name", list(LAYERS))
def test_layers_run_in_onnxruntime_as_ours(name, masks, tmp_path):
    torch.manual_seed(0)
    rng = np.random.RandomState(1)
    layer = LAYERS[name]().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.6, 0.6)
    module = _Call(layer).eval()
    make = MASKS[masks]
    x = torch.randn(4, 6, 4)
    args = (x, make(4, 6, rng)) if make else (x,)
    got = _run(module, args, tmp_path / "m.onnx")
    # dynamic batch and time: the same graph on another shape
    x2 = torch.randn(5, 9, 4)
    args2 = (x2, make(5, 9, rng)) if make else (x2,)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    got2 = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args2)})
    for g, a in ((got, args), (got2, args2)):
        with torch.no_grad():
            ref = module(*a)
        ref = ref if isinstance(ref, tuple) else (ref,)
        assert len(g) == len(ref)
        for i, (o, r) in enumerate(zip(g, ref)):
            np.testing.assert_allclose(o, r.numpy(), atol=ATOL, rtol=RTOL, err_msg=f"{name} output {i}")


def test_a_mask_with_holes_gives_nan(tmp_path):
    layer = cudnn_rnn.LSTM(4, 5, return_sequences=True).eval()
    x = torch.randn(3, 6, 4)
    right = _right_padded(3, 6, np.random.RandomState(0))
    _run(_Call(layer), (x, right), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    holes = torch.ones(3, 6, dtype=torch.bool)
    holes[1, 2] = False
    out = session.run(None, {session.get_inputs()[0].name: x.numpy(), session.get_inputs()[1].name: holes.numpy()})
    assert np.isnan(out[0]).all()


def test_activations_onnx_lacks_are_refused_by_name(tmp_path):
    with pytest.raises(OnnxExportError, match="activation 'silu' has no ONNX recurrent-operator equivalent"):
        export(_Call(cudnn_rnn.GRU(4, 5, activation="silu")), (torch.randn(2, 3, 4),), tmp_path / "m.onnx")


@pytest.mark.keras
def test_converted_keras_model_through_the_cli(tmp_path):
    """A Keras 3 model (Embedding mask_zero, Bidirectional LSTM, GRU reset_after=False with
    hard_sigmoid gates, a dense head) -> cudnn-rnn convert model.keras model.onnx -> onnxruntime,
    on left-padded tokens: the outputs Keras computes, within 1e-5."""
    from keras_oracle import keras
    from keras import layers

    rng = np.random.RandomState(3)
    model = keras.Sequential([keras.Input((None,), dtype="int32"), layers.Embedding(20, 6, mask_zero=True),
                              layers.Bidirectional(layers.LSTM(5, return_sequences=True)),
                              layers.GRU(4, reset_after=False, recurrent_activation="hard_sigmoid"),
                              layers.Dense(3, activation="softmax")])
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "convert", str(tmp_path / "m.keras"),
                          str(tmp_path / "m.onnx")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "KERAS_BACKEND": "torch"})
    assert out.returncode == 0, out.stdout + out.stderr
    tokens = rng.randint(1, 20, size=(4, 9)).astype("int64")
    for b, n in enumerate([9, 6, 3, 1]):
        tokens[b, : 9 - n] = 0  # left padding: Keras's pad_sequences default
    expected = keras.ops.convert_to_numpy(model(tokens.astype("int32")))
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: tokens})[0]
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


def test_rows_without_a_real_step_keep_their_initial_states(tmp_path):
    class WithStates(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x, mask, h, c):
            return tuple(self.layer(x, mask=mask, initial_state=[h, c]))

    torch.manual_seed(2)
    module = WithStates(cudnn_rnn.LSTM(4, 5, return_sequences=True, return_state=True)).eval()
    x = torch.randn(3, 6, 4)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1] = False  # no real step: Keras keeps the initial states
    mask[2, :3] = False
    h, c = torch.randn(3, 5), torch.randn(3, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export(module, (x, mask, h, c), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    got = session.run(None, dict(zip([i.name for i in session.get_inputs()], [a.numpy() for a in (x, mask, h, c)])))
    with torch.no_grad():
        ref = module(x, mask, h, c)
    for o, r in zip(got, ref):
        np.testing.assert_allclose(o, r.numpy(), atol=ATOL, rtol=RTOL)
