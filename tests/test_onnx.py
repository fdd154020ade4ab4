"""ONNX export (cudnn_rnn/onnx.py): layers and converted Keras models exported with the dynamo
exporter onto ONNX's LSTM / GRU / RNN operators and run in onnxruntime, within 1e-5 of ours (which
the Keras tests pin to Keras): every cell, reset_after both ways, Keras 2 and 3 hard_sigmoid,
stacks, go_backwards, Bidirectional merges, masks of every pattern (padded on either side, holes,
empty rows) with Keras's outputs at masked steps, states in and out, dynamic batch and time; the
Loop translation of activations ONNX's recurrent operators lack, every kernel activation;
ConvLSTM1D/2D/3D; Keras 3 models through the CLI against Keras itself."""
import os
import subprocess
import sys
import warnings

import numpy as np
import onnx
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


def _agree_at_both_shapes(module, path, got, args, args2, name):
    """The exported file's outputs (got, on args) and its run on args2 (another batch and
    length: the dynamic dimensions) against the module's, within 1e-5."""
    session = ort.InferenceSession(str(path))
    got2 = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args2)})
    for g, a in ((got, args), (got2, args2)):
        with torch.no_grad():
            ref = module(*a)
        ref = ref if isinstance(ref, tuple) else (ref,)
        assert len(g) == len(ref)
        for i, (o, r) in enumerate(zip(g, ref)):
            np.testing.assert_allclose(o, r.numpy(), atol=ATOL, rtol=RTOL, err_msg=f"{name} output {i}")


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


def _holes(batch, time, rng):
    """Any pattern: holes inside rows, an empty row, a full one."""
    mask = rng.uniform(size=(batch, time)) > 0.35
    mask[0] = True
    mask[-1] = False
    return torch.from_numpy(mask)


MASKS = {"no-mask": None, "right-padded": _right_padded, "left-and-right-padded": _mixed_padding, "holes": _holes}


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
    # a forward layer that reads backwards (Keras's Bidirectional then runs its copy forwards)
    "bi-lstm-backwards-states": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(4, 5, go_backwards=True,
                                                                               return_sequences=True, return_state=True)),
    "bi-gru-backwards-stack-last": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.GRU(4, 5, num_layers=2, go_backwards=True),
                                                                  merge_mode="mul"),
}


# activations ONNX's LSTM / GRU / RNN lack: an ONNX Loop over time
LOOP_LAYERS = {
    "loop-lstm-gelu-hard-silu-states": lambda: cudnn_rnn.LSTM(4, 5, activation="gelu", recurrent_activation="hard_silu",
                                                              return_sequences=True, return_state=True),
    "loop-gru-silu-states": lambda: cudnn_rnn.GRU(4, 5, activation="silu", return_sequences=True, return_state=True),
    "loop-gru-reset-before-selu": lambda: cudnn_rnn.GRU(4, 5, activation="selu", reset_after=False,
                                                        recurrent_activation="hard_sigmoid_keras2",
                                                        return_sequences=True),
    "loop-gru-no-bias-mish": lambda: cudnn_rnn.GRU(4, 5, activation="mish", use_bias=False, return_sequences=True),
    "loop-simple-relu6-stack-backwards": lambda: cudnn_rnn.SimpleRNN(4, 5, activation="relu6", num_layers=2,
                                                                     go_backwards=True, return_sequences=True),
    "loop-lstm-zero-output": lambda: cudnn_rnn.LSTM(4, 5, activation="tanh_shrink", return_sequences=True,
                                                    zero_output_for_mask=True),
    "loop-bi-lstm-stack-relu6": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(4, 5, activation="relu6", num_layers=2,
                                                                               return_sequences=True)),
    "loop-bi-gru-last-sum": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.GRU(4, 5, activation="log_sigmoid"),
                                                            merge_mode="sum"),
    "loop-bi-simple-backwards": lambda: cudnn_rnn.Bidirectional(cudnn_rnn.SimpleRNN(4, 5, activation="gelu",
                                                                                    go_backwards=True,
                                                                                    return_sequences=True)),
}


@pytest.mark.parametrize("masks", list(MASKS))
@pytest.mark.parametrize("name", list(LAYERS) + list(LOOP_LAYERS))
def test_layers_run_in_onnxruntime_as_ours(name, masks, tmp_path):
    torch.manual_seed(0)
    rng = np.random.RandomState(1)
    layer = {**LAYERS, **LOOP_LAYERS}[name]().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.6, 0.6)
    module = _Call(layer).eval()
    make = MASKS[masks]
    x = torch.randn(4, 6, 4)
    args = (x, make(4, 6, rng)) if make else (x,)
    got = _run(module, args, tmp_path / "m.onnx")
    ops = {n.op_type for n in onnx.load(str(tmp_path / "m.onnx")).graph.node}
    assert ("Loop" in ops) == (name in LOOP_LAYERS) and bool(ops & {"LSTM", "GRU", "RNN"}) == (name in LAYERS), ops
    # dynamic batch and time: the same graph on another shape
    x2 = torch.randn(5, 9, 4)
    args2 = (x2, make(5, 9, rng)) if make else (x2,)
    _agree_at_both_shapes(module, tmp_path / "m.onnx", got, args, args2, name)


@pytest.mark.parametrize("activation", cudnn_rnn.cells.ACTIVATIONS)
def test_every_kernel_activation_exports(activation, tmp_path):
    """Each activation the kernels implement, as a GRU's gates and candidate, with holes in the mask."""
    torch.manual_seed(1)
    layer = cudnn_rnn.GRU(3, 4, activation=activation, recurrent_activation=activation, return_sequences=True).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.5, 0.5)
    x, mask = torch.randn(3, 5, 3), _holes(3, 5, np.random.RandomState(2))
    got = _run(_Call(layer), (x, mask), tmp_path / "m.onnx")
    with torch.no_grad():
        ref = layer(x, mask=mask)
    np.testing.assert_allclose(got[0], ref.numpy(), atol=ATOL, rtol=RTOL)


CONV_LSTMS = {  # (layer, input shape)
    "2d-same-states": (lambda: cudnn_rnn.ConvLSTM2D(2, 3, 3, padding="same", return_sequences=True, return_state=True),
                       (2, 4, 6, 5, 2)),
    "1d-strided-backwards": (lambda: cudnn_rnn.ConvLSTM1D(2, 3, 2, strides=2, go_backwards=True, return_sequences=True),
                             (3, 5, 9, 2)),
    "3d-dilated-keras2-gates": (lambda: cudnn_rnn.ConvLSTM3D(1, 2, 2, padding="same", dilation_rate=2,
                                                             recurrent_activation="hard_sigmoid_keras2"),
                                (2, 3, 5, 5, 5, 1)),
    "2d-even-kernel-gelu-zero-output-channels-first": (
        lambda: cudnn_rnn.ConvLSTM2D(2, 3, (2, 3), padding="same", activation="gelu", zero_output_for_mask=True,
                                     return_sequences=True, data_format="channels_first"), (2, 4, 2, 6, 5)),
}


@pytest.mark.parametrize("masks", ["no-mask", "holes"])
@pytest.mark.parametrize("name", list(CONV_LSTMS))
def test_conv_lstm_runs_in_onnxruntime_as_ours(name, masks, tmp_path):
    """ConvLSTM1D/2D/3D as an ONNX Conv over every step and a Loop over time: strides, dilation,
    Keras's asymmetric 'same' padding, go_backwards, both data formats, masks with holes, states;
    the graph re-run at another batch and length."""
    torch.manual_seed(0)
    rng = np.random.RandomState(1)
    make, shape = CONV_LSTMS[name]
    module = _Call(make()).eval()

    def inputs(batch, time):
        x = torch.randn(batch, time, *shape[2:])
        return (x, _holes(batch, time, rng)) if masks == "holes" else (x,)

    args = inputs(*shape[:2])
    got = _run(module, args, tmp_path / "m.onnx")
    args2 = inputs(shape[0] + 1, shape[1] + 3)
    _agree_at_both_shapes(module, tmp_path / "m.onnx", got, args, args2, name)


def test_conv_lstm_initial_states(tmp_path):
    class WithStates(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = cudnn_rnn.ConvLSTM2D(2, 3, 3, padding="same", return_sequences=True, return_state=True)

        def forward(self, x, mask, h, c):
            return tuple(self.layer(x, mask=mask, initial_state=[h, c]))

    torch.manual_seed(3)
    module = WithStates().eval()
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False  # no real step: the initial states come out
    mask[2, 1] = False
    args = (torch.randn(3, 4, 5, 5, 2), mask, torch.randn(3, 5, 5, 3), torch.randn(3, 5, 5, 3))
    got = _run(module, args, tmp_path / "m.onnx")
    with torch.no_grad():
        ref = module(*args)
    for o, r in zip(got, ref):
        np.testing.assert_allclose(o, r.numpy(), atol=ATOL, rtol=RTOL)


def _keras_model(kind):
    from keras_oracle import keras
    from keras import layers

    if kind == "conv-lstm":  # keras.io's next-frame prediction shape
        return keras.Sequential([keras.Input((None, 8, 8, 1)),
                                 layers.ConvLSTM2D(4, 3, padding="same", return_sequences=True),
                                 layers.BatchNormalization(),
                                 layers.ConvLSTM2D(3, (2, 2), padding="same", return_sequences=True),
                                 layers.Conv3D(1, 3, padding="same", activation="sigmoid")])
    if kind == "standard-operators":  # Bidirectional LSTM, GRU reset_after=False with hard_sigmoid gates
        rnns = [layers.Bidirectional(layers.LSTM(5, return_sequences=True)),
                layers.GRU(4, reset_after=False, recurrent_activation="hard_sigmoid")]
    else:  # activations ONNX's recurrent operators lack: the Loop
        rnns = [layers.Bidirectional(layers.GRU(5, activation="silu", return_sequences=True), merge_mode="sum"),
                layers.LSTM(4, activation="gelu", go_backwards=True)]
    return keras.Sequential([keras.Input((None,), dtype="int32"), layers.Embedding(20, 6, mask_zero=True), *rnns,
                             layers.Dense(3, activation="softmax")])


@pytest.mark.keras
@pytest.mark.parametrize("kind,padding", [("standard-operators", "left"), ("standard-operators", "holes"),
                                          ("loop", "holes"), ("conv-lstm", None)])
def test_converted_keras_model_through_the_cli(kind, padding, tmp_path):
    """A Keras 3 model (Embedding mask_zero, recurrent layers, a dense head) -> cudnn-rnn convert
    model.keras model.onnx -> onnxruntime, on left-padded tokens (Keras's pad_sequences default)
    or tokens with zeros anywhere: the outputs Keras computes, within 1e-5."""
    from keras_oracle import keras

    rng = np.random.RandomState(3)
    model = _keras_model(kind)
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32") if "variance" in w.path  # BatchNormalization
                       else rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.weights])
    model.save(tmp_path / "m.keras")
    out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "convert", str(tmp_path / "m.keras"),
                          str(tmp_path / "m.onnx")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "KERAS_BACKEND": "torch"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "checked in onnxruntime" in out.stdout, out.stdout
    if kind == "conv-lstm":
        frames = rng.uniform(size=(2, 5, 8, 8, 1)).astype("float32")
        expected = keras.ops.convert_to_numpy(model(frames))
        assert np.isfinite(expected).all()
        session = ort.InferenceSession(str(tmp_path / "m.onnx"))
        got = session.run(None, {session.get_inputs()[0].name: frames})[0]
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)
        return
    tokens = rng.randint(1, 20, size=(4, 9)).astype("int64")
    if padding == "left":
        for b, n in enumerate([9, 6, 3, 1]):
            tokens[b, : 9 - n] = 0
    else:
        tokens[rng.uniform(size=tokens.shape) < 0.35] = 0
        tokens[0, 4] = 7
    expected = keras.ops.convert_to_numpy(model(tokens.astype("int32")))
    assert np.isfinite(expected).all()
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: tokens})[0]
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("activation", ["tanh", "silu"])  # ONNX's LSTM, the Loop
def test_rows_without_a_real_step_keep_their_initial_states(activation, tmp_path):
    class WithStates(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x, mask, h, c):
            return tuple(self.layer(x, mask=mask, initial_state=[h, c]))

    torch.manual_seed(2)
    module = WithStates(cudnn_rnn.LSTM(4, 5, activation=activation, return_sequences=True, return_state=True)).eval()
    x = torch.randn(3, 6, 4)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1] = False  # no real step: Keras keeps the initial states
    mask[2, :3] = False
    mask[0, 2] = False  # a hole
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


def test_loops_and_model_inputs_share_no_names(tmp_path):
    """ONNX names are one namespace across a graph and its Loop bodies: the two Loops of a
    Bidirectional (whose bodies' values the exporter once named alike), then a model whose inputs
    are called what a body might call its states (h_0, c_0) with two Loop layers in a row."""
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first = cudnn_rnn.LSTM(3, 4, activation="silu", return_sequences=True)
            self.second = cudnn_rnn.Bidirectional(cudnn_rnn.GRU(4, 2, activation="gelu", return_sequences=True))

        def forward(self, x, h_0, c_0):
            return self.second(self.first(x, initial_state=[h_0, c_0]))

    torch.manual_seed(4)
    cases = [(_Call(cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(1, 2, recurrent_activation="gelu"))), (torch.randn(2, 3, 1),)),
             (Two(), (torch.randn(2, 5, 3), torch.randn(2, 4), torch.randn(2, 4)))]
    for i, (module, args) in enumerate(cases):
        module.eval()
        got = _run(module, args, tmp_path / f"m{i}.onnx")
        onnx.checker.check_model(onnx.load(str(tmp_path / f"m{i}.onnx")), full_check=True)
        with torch.no_grad():
            np.testing.assert_allclose(got[0], module(*args).numpy(), atol=ATOL, rtol=RTOL)


def test_float64_layers_are_refused_by_name(tmp_path):
    layer = cudnn_rnn.LSTM(3, 4).double().eval()
    with pytest.raises(OnnxExportError, match="runs in double: ONNX export takes float32 layers"):
        export(_Call(layer), (torch.randn(2, 5, 3, dtype=torch.float64),), tmp_path / "m.onnx")


@pytest.mark.parametrize("name", ["2d-same", "1d-strided-valid-backwards-states", "3d-channels-first"])
def test_conv_lstm_mask_per_position_runs_in_onnxruntime_as_ours(name, tmp_path):
    """A mask per output position (batch, time, *S': what Keras's Masking gives a ConvLSTM): a
    masked position keeps its h and c and outputs its previous output, in the Loop as in the op;
    the graph re-run at another batch and length."""
    torch.manual_seed(2)
    layer, shape = {
        "2d-same": (cudnn_rnn.ConvLSTM2D(2, 3, 3, padding="same", return_sequences=True), (2, 4, 5, 5, 2)),
        "1d-strided-valid-backwards-states": (
            cudnn_rnn.ConvLSTM1D(2, 3, 3, strides=2, return_sequences=True, return_state=True, go_backwards=True),
            (2, 5, 9, 2)),
        "3d-channels-first": (cudnn_rnn.ConvLSTM3D(1, 2, 2, padding="same", data_format="channels_first",
                                                   return_sequences=True, zero_output_for_mask=True), (2, 3, 1, 3, 4, 3)),
    }[name]
    module = _Call(layer.eval())

    def inputs(batch, time):
        x = torch.randn(batch, time, *shape[2:])
        with torch.no_grad():
            out_spatial = layer.output_spatial(layer._spatial_in(x))
        mask = torch.rand(batch, time, *out_spatial) < 0.7
        mask[0, 0] = False  # a position masked from the first step: zeros
        return x, mask

    args = inputs(*shape[:2])
    got = _run(module, args, tmp_path / "m.onnx")
    _agree_at_both_shapes(module, tmp_path / "m.onnx", got, args, inputs(shape[0] + 1, shape[1] + 2), name)


def test_softplus_keeps_large_values(tmp_path):
    """softplus(x) = x for large x, as Keras computes it; onnxruntime's recurrent operators return
    inf above ~88, so softplus layers run in the Loop."""
    torch.manual_seed(5)
    layer = cudnn_rnn.SimpleRNN(3, 4, activation="softplus", return_sequences=True).eval()
    x = 100 * torch.randn(2, 5, 3)
    got = _run(_Call(layer), (x,), tmp_path / "m.onnx")
    with torch.no_grad():
        ref = layer(x)
    assert ref.abs().max() > 90
    np.testing.assert_allclose(got[0], ref.numpy(), atol=ATOL, rtol=RTOL)


def test_cli_check_of_the_exported_file_fails_loudly(tmp_path, capsys):
    """cudnn-rnn convert runs the .onnx file in onnxruntime against the model: a file that does
    not compute what the model does is reported (exit status 3), here another layer's export."""
    from cudnn_rnn.cli import _check_onnx

    torch.manual_seed(6)
    exported, other = _Call(cudnn_rnn.GRU(3, 4)).eval(), _Call(cudnn_rnn.GRU(3, 4)).eval()
    args = (torch.randn(2, 5, 3),)
    _run(exported, args, tmp_path / "m.onnx")
    assert _check_onnx(str(tmp_path / "m.onnx"), exported, args) == 0
    assert "checked in onnxruntime" in capsys.readouterr().out
    assert _check_onnx(str(tmp_path / "m.onnx"), other, args) == 3
    assert "onnxruntime's outputs differ from the model's" in capsys.readouterr().err


def test_cli_check_takes_equal_infinities_as_agreement(tmp_path, capsys):
    """Outputs past float32's range: the same infinity on both sides agrees (inf - inf is NaN,
    not a difference), the finite outputs are compared, and a model computing other values is
    reported."""
    from cudnn_rnn.cli import _check_onnx

    class Scaled(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):  # the last column overflows wherever |y| is above 3.4e-4
            y = self.layer(x)
            return torch.cat([y, y[..., :1] * 1e38 * 1e4], dim=-1)

    torch.manual_seed(7)
    exported, other = Scaled(cudnn_rnn.GRU(3, 4)).eval(), Scaled(cudnn_rnn.GRU(3, 4)).eval()
    args = (torch.randn(2, 5, 3),)
    with torch.no_grad():
        assert torch.isinf(exported(*args)).any() and torch.isfinite(exported(*args)).any()
    _run(exported, args, tmp_path / "m.onnx")
    assert _check_onnx(str(tmp_path / "m.onnx"), exported, args) == 0
    assert "where both are finite (the model's outputs overflow on these inputs)" in capsys.readouterr().out
    assert _check_onnx(str(tmp_path / "m.onnx"), other, args) == 3


def test_cli_check_is_relative_for_large_outputs(tmp_path, capsys):
    """Outputs in the hundreds of thousands: float32's rounding alone differs by more than 1e-4
    there, which the check takes relative to the outputs; another model is still reported."""
    from cudnn_rnn.cli import _check_onnx

    class Large(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x) * 1e6

    torch.manual_seed(8)
    exported, other = (Large(cudnn_rnn.LSTM(3, 4, return_sequences=True)).eval() for _ in range(2))
    args = (torch.randn(2, 9, 3),)
    got = _run(exported, args, tmp_path / "m.onnx")[0]
    with torch.no_grad():
        assert np.abs(got - exported(*args).numpy()).max() > 1e-4  # rounding, at this scale
    assert _check_onnx(str(tmp_path / "m.onnx"), exported, args) == 0
    capsys.readouterr()
    other.layer.load_state_dict({k: v * 1.001 for k, v in exported.layer.state_dict().items()})
    assert _check_onnx(str(tmp_path / "m.onnx"), other, args) == 3


def test_converted_keras_model_through_the_python_api(tmp_path, capfd):
    """cudnn_rnn.onnx.export(model, (tokens,), path) on a model load_keras made (forward(*inputs)):
    dynamic batch and length, run in onnxruntime at two lengths against the eager model; one
    self-contained file, and nothing printed (torch's progress and onnxscript's folding notes
    only with verbose=True)."""
    model = cudnn_rnn.load_keras(os.path.join(os.path.dirname(__file__), "..", "examples", "sentiment.h5")).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 150, (4, 20), generator=g)
    tokens[:2, :6] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cudnn_rnn.onnx.export(model, (tokens,), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == ["m.onnx"]
    printed = capfd.readouterr()
    assert "[torch.onnx]" not in printed.out and "Skipping constant folding" not in printed.err, printed
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    name = session.get_inputs()[0].name
    for t in (tokens, tokens[1:, 9:].contiguous()):
        (got,) = session.run(None, {name: t.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(got, model(t).numpy(), atol=1e-5, rtol=1e-5)


class _Step(torch.nn.Module):
    """One timestep of a layer, states in and out (docs/guides/serving.md)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x_t, h, c):
        y, h, c = self.layer(x_t[:, None], initial_state=[h, c])
        return y, h, c


def test_exported_step_function_streams_the_whole_sequence(tmp_path):
    """The streaming recipe: a step module exported with torch.export and to ONNX, called T times
    with the states carried by the caller, gives the eager layer's output for the whole sequence."""
    torch.manual_seed(0)
    layer = cudnn_rnn.LSTM(16, 32, return_state=True).eval()
    step = _Step(layer)
    example = (torch.randn(2, 16), torch.zeros(2, 32), torch.zeros(2, 32))
    batch = torch.export.Dim("batch")
    program = torch.export.export(step, example, dynamic_shapes=({0: batch}, {0: batch}, {0: batch}))
    torch.export.save(program, tmp_path / "step.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cudnn_rnn.onnx.export(step, example, tmp_path / "step.onnx")
    xs = torch.randn(3, 7, 16)
    with torch.no_grad():
        full = layer(xs)[0]
        run = torch.export.load(tmp_path / "step.pt2").module()
        session = ort.InferenceSession(str(tmp_path / "step.onnx"))
        names = [i.name for i in session.get_inputs()]
        h = c = torch.zeros(3, 32)
        ho = co = np.zeros((3, 32), np.float32)
        for t in range(7):
            y, h, c = run(xs[:, t], h, c)
            yo, ho, co = session.run(None, dict(zip(names, [xs[:, t].numpy(), ho, co])))
    torch.testing.assert_close(y, full, atol=1e-6, rtol=1e-6)
    np.testing.assert_allclose(yo, full.numpy(), atol=1e-5, rtol=1e-5)


def test_missing_exporter_packages_are_named_before_any_work(tmp_path, monkeypatch, capsys):
    """Without onnxscript (torch does not install it) the export and the CLI say which packages
    to install, in one line; the CLI says so before converting the model."""
    import importlib.util

    from cudnn_rnn import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(ImportError, match=r"needs the package onnxscript, which is not installed: pip install onnx "):
        export(_Call(cudnn_rnn.GRU(3, 4)), (torch.randn(2, 5, 3),), tmp_path / "m.onnx")
    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("the model was converted before the check"))
    assert cli.main(["convert", os.path.join(ROOT, "examples", "sentiment.h5"), str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"cudnn-rnn: {tmp_path / 'm.onnx'}: ONNX export needs the package onnxscript, which is " \
                          "not installed: pip install onnx onnxscript onnxruntime (cudnn_rnn's [onnx] extra)", err
    assert not (tmp_path / "m.onnx").exists()


def test_lookup_hashing_and_bucketing_layers_run_in_onnxruntime_as_keras(tmp_path):
    """Lookup layers, integer Hashing and bucketing, exported through the CLI: IntegerLookup (int,
    several OOV bins by FarmHash, count, multi_hot) and Hashing of int64 values up to the extremes
    (k3_lookup, written by Keras 3.15 on TensorFlow: onnxruntime on its stored inputs gives its
    stored outputs); Discretization (int and one_hot), keras.ops.digitize and searchsorted (left
    and right) on values that fall on the boundaries, against Keras 3 itself. ONNX has no
    searchsorted (the translation counts by comparison), and the FarmHash of a number's decimal
    digits took them by a truncating division that torch's exporter computed in floats."""
    from keras_oracle import keras

    data = os.path.join(ROOT, "tests", "fixtures", "data")
    out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "convert", os.path.join(data, "k3_lookup.keras"),
                          str(tmp_path / "lookup.onnx")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    stored = np.load(os.path.join(data, "k3_lookup.npz"))
    session = ort.InferenceSession(str(tmp_path / "lookup.onnx"))
    got = session.run(None, {i.name: stored[f"input_{k}"].astype(np.int64) for k, i in enumerate(session.get_inputs())})
    assert len(got) == 10 and np.abs(stored["input_1"]).max() > 1 << 62
    for j, g in enumerate(got):
        np.testing.assert_allclose(g, stored[f"output_{j}"], atol=ATOL, rtol=RTOL, err_msg=f"output {j}")

    x = keras.Input((6,))
    bins = [-1.0, 0.0, 0.5, 2.0]
    outputs = [keras.layers.Discretization(bin_boundaries=bins)(x),
               keras.layers.Discretization(bin_boundaries=bins, output_mode="one_hot")(keras.layers.Reshape((6, 1))(x)),
               keras.ops.digitize(x, keras.ops.array(bins)), keras.ops.searchsorted(keras.ops.array([-1.0, 0.0, 0.5, 2.0]), x),
               keras.ops.searchsorted(keras.ops.array([-1.0, 0.0, 0.5, 2.0]), x, side="right")]
    model = keras.Model(x, outputs)
    model.save(tmp_path / "bins.keras")
    out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "convert", str(tmp_path / "bins.keras"),
                          str(tmp_path / "bins.onnx")], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "KERAS_BACKEND": "torch"})
    assert out.returncode == 0, out.stdout + out.stderr
    values = np.array([[-2.0, -1.0, 0.0, 0.25, 0.5, 2.0], [3.0, -0.5, 1.0, 2.5, -1.5, 0.0]], np.float32)
    session = ort.InferenceSession(str(tmp_path / "bins.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: values})
    expected = [keras.ops.convert_to_numpy(y) for y in model(values)]
    for j, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_array_equal(g, e, err_msg=f"output {j}")


@pytest.mark.keras
def test_ctc_decoding_and_resampling_run_in_onnxruntime_as_keras(tmp_path):
    """Greedy CTC decoding of an LSTM's per-step scores (lengths per sample), and affine_transform
    (reflected borders; a transform per image: the export keeps that batch), map_coordinates
    (wrapped) and ssim, exported by cudnn_rnn.onnx.export: onnxruntime against Keras 3 itself.
    The decoding moves its labels to the front by a cumulative count and a scatter (ONNX has no
    sort for it)."""
    from keras_oracle import keras

    rng = np.random.RandomState(3)
    x = keras.Input((6, 5))
    logits = keras.layers.Dense(4)(keras.layers.LSTM(7, return_sequences=True)(x))
    lengths = keras.ops.cast(keras.ops.sum(keras.ops.cast(keras.ops.abs(x[:, :, 0]) < 0.8, "int32"), axis=1), "int32")
    image = keras.ops.reshape(keras.layers.Dense(12 * 13 * 2)(x[:, -1]), (-1, 12, 13, 2))
    model = keras.Model(x, [*keras.ops.ctc_decode(logits, lengths),
                            keras.ops.image.affine_transform(image, np.array([[1.0, 0.1, 0.5, 0.0, 0.9, 0.2, 0, 0]] * 3, "float32"),
                                                             fill_mode="reflect"),
                            keras.ops.image.map_coordinates(image[0, :, :, 0], np.array([[[1.5, -2.2]], [[0.5, 14.7]]], "float32"),
                                                            1, "wrap"),
                            keras.ops.image.ssim(image, image * 0.5 + 0.2)])
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    values = rng.uniform(-1, 1, (3, 6, 5)).astype("float32")
    ours = cudnn_rnn.load_keras(tmp_path / "m.keras").eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cudnn_rnn.onnx.export(ours, (torch.as_tensor(values),), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    got = session.run(None, {session.get_inputs()[0].name: values})
    expected = [keras.ops.convert_to_numpy(y) for y in model(values)]
    assert len(got) == len(expected) == 5
    for j, (g, e) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(g, e, atol=ATOL, rtol=RTOL, err_msg=f"output {j}")
