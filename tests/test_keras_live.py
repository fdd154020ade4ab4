"""Random models built with Keras 3 itself (torch backend), saved in each Keras 3 format
(.keras, .weights.h5 + architecture, legacy .h5, Keras 3's unzipped model directory and sharded
weights), loaded with load_keras: outputs within 1e-5.
Also the converted-file round trip and the CLI."""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch

from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)
from keras import layers

import cudnn_rnn
from cudnn_rnn.keras import ConversionError, load_converted, load_keras, save_converted

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T = 3, 7


def _rnn(rng, units, last):
    kind = rng.choice(["LSTM", "GRU", "SimpleRNN"])
    kw = dict(units=units, return_sequences=not last or bool(rng.rand() < 0.5), go_backwards=bool(rng.rand() < 0.3),
              use_bias=bool(rng.rand() < 0.85))
    if kind != "SimpleRNN":
        kw["recurrent_activation"] = str(rng.choice(["sigmoid", "hard_sigmoid", "sigmoid"]))
    if kind == "GRU":
        kw["reset_after"] = bool(rng.rand() < 0.6)
    if kind == "SimpleRNN":
        kw["activation"] = str(rng.choice(["tanh", "relu"]))
    if rng.rand() < 0.4:
        # (Keras 3.15 cannot reload a Bidirectional whose layer has go_backwards=True)
        kw["go_backwards"] = False
        layer = getattr(layers, kind)(**kw)
        return layers.Bidirectional(layer, merge_mode=str(rng.choice(["concat", "sum", "ave", "mul"])))
    return getattr(layers, kind)(**kw)


def random_model(seed):
    rng = np.random.RandomState(seed)
    token_input = rng.rand() < 0.5
    if token_input:
        inp = keras.Input((T,), dtype="int32")
        h = layers.Embedding(12, 5, mask_zero=True)(inp)
    else:
        inp = keras.Input((T, 4))
        h = layers.Masking(0.0)(inp)
    n = rng.randint(1, 4)
    for i in range(n):
        h = _rnn(rng, int(rng.randint(2, 6)), last=i == n - 1)(h)
        if h.ndim == 3 and rng.rand() < 0.3:
            h = layers.TimeDistributed(layers.Dense(4, activation="tanh"))(h)
        if h.ndim == 3 and rng.rand() < 0.2:
            h = layers.LayerNormalization()(h)
    if h.ndim == 3:
        h = layers.GlobalAveragePooling1D()(h) if rng.rand() < 0.5 else layers.Flatten()(h)
    out = layers.Dense(3, activation=str(rng.choice(["softmax", "linear", "sigmoid"])))(h)
    model = keras.Model(inp, out) if rng.rand() < 0.5 else keras.Sequential(
        [keras.Input(inp.shape[1:], dtype=inp.dtype)] + [l for l in keras.Model(inp, out).layers[1:]])
    weights = [rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()]
    model.set_weights(weights)
    if token_input:
        x = rng.randint(1, 12, size=(B, T)).astype("int32")
        x[1, 5:] = 0
        x[2, :2] = 0
    else:
        x = rng.uniform(-1, 1, size=(B, T, 4)).astype("float32")
        x[1, 4:] = 0
        x[0, 2] = 0
    return model, x


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(16))
def test_random_keras3_models(seed, tmp_path):
    model, x = random_model(seed)
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "m.weights.h5")
    model.save(tmp_path / "m.h5")
    model.save(tmp_path / "unzipped", zipped=False)
    # sharded weights, in shards as small as Keras allows (its largest variable)
    largest = max(w.size * 4 for w in model.get_weights())
    model.save_weights(tmp_path / "m.weights.json", max_shard_size=largest * 1.01 / 1024**3)
    weight_map = json.loads((tmp_path / "m.weights.json").read_text())["weight_map"]
    assert len({name for names in weight_map.values() for name in names}) > 1
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.weights.h5", tmp_path / "m.keras"),
                       (tmp_path / "m.h5", None), (tmp_path / "m.weights.h5", json.loads(model.to_json())),
                       (tmp_path / "unzipped", None), (tmp_path / "m.weights.json", tmp_path / "unzipped")):
        ours = load_keras(path, architecture=str(arch) if isinstance(arch, os.PathLike) else arch)
        with torch.no_grad():
            y = ours(torch.as_tensor(x)).numpy()
        np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5, err_msg=f"{path.name} (architecture {arch})")


@pytest.mark.keras
@pytest.mark.parametrize("case", ["batch_shape", "reshape", "constant", "transforms"])
def test_models_that_run_at_one_batch_size(case, tmp_path):
    """A model that runs at one batch size only (its inputs declare it, or an operation's shape or
    constant array holds it) loads, computes what Keras computes at that batch, and traces at it."""
    rng = np.random.RandomState(7)
    n = 4
    x = keras.Input(batch_shape=(n, T, 4)) if case == "batch_shape" else keras.Input((T, 4))
    h = layers.LSTM(3, return_sequences=True)(x)
    if case in ("batch_shape", "reshape"):
        out = keras.ops.reshape(h, (n, -1))
    elif case == "constant":
        out = layers.GRU(2)(h) + rng.uniform(-1, 1, (n, 2)).astype("float32")
    else:
        image = keras.ops.reshape(layers.Dense(12)(h[:, -1]), (-1, 3, 4, 1))
        shear = np.array([[1.0, 0.1 * i, 0.0, 0.0, 1.0, 0.2, 0.0, 0.0] for i in range(n)], "float32")
        out = keras.ops.image.affine_transform(image, shear)
    model = keras.Model(x, out)
    data = rng.uniform(-1, 1, (n, T, 4)).astype("float32")
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    assert ours.batch_size == n and ours.example_inputs()[0].shape[0] == n  # what an export traces with
    with torch.no_grad():
        got = ours(torch.as_tensor(data)).numpy()
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(data)), atol=1e-5, rtol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("case", ["layer", "regrouped", "op", "op_regrouped", "nested"])
def test_models_whose_graph_holds_the_free_length(case, tmp_path):
    """Inputs that leave the time free where a reshape holds it to one length (Keras runs such a
    model at that length only): the model loads, declares that length, computes what Keras
    computes, and exports there."""
    rng = np.random.RandomState(11)
    x = keras.Input((None, 4))
    if case == "layer":
        h = layers.Reshape((10, 4))(x)
    elif case == "regrouped":  # 10 steps of 4 as 5 of 8
        h = layers.Reshape((5, 8))(x)
    elif case == "op":
        h = keras.ops.reshape(x, (-1, 10, 4))
    elif case == "op_regrouped":  # (Keras runs it wherever 4 x batch x length is a multiple of 40; at 10 steps
        h = keras.ops.reshape(x, (-1, 5, 8))  # the batch stays)
    else:
        inner = keras.Input((None, 4))
        h = keras.Model(inner, layers.Reshape((10, 4))(inner))(x)
    out = layers.Dense(2)(layers.Flatten()(layers.LSTM(3, return_sequences=True)(h)))
    model = keras.Model(x, out)
    data = rng.uniform(-1, 1, (3, 10, 4)).astype("float32")
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    assert ours.input_specs[0][1][1] == 10 and ours.example_inputs()[0].shape[1] == 10
    with torch.no_grad():
        got = ours(torch.as_tensor(data)).numpy()
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(data)), atol=1e-5, rtol=1e-5)
    program = torch.export.export(ours, tuple(ours.example_inputs()))
    np.testing.assert_allclose(program.module()(torch.as_tensor(data[:2])).detach().numpy(), got[:2], atol=1e-6)


@pytest.mark.keras
@pytest.mark.parametrize("case", ["frames", "regrouped", "framed_projection", "position_table"])
def test_models_that_run_at_particular_lengths(case, tmp_path):
    """A free time axis a reshape splits into fixed pieces at lengths other than 8, 128 or 1024
    (raw samples framed by Reshape((-1, 20)), then maybe a product with a constant (20, 4) matrix;
    3 features a step regrouped by Reshape((-1, 5, 6)): multiples of 10 steps; any multiple runs,
    so the model keeps its free length, and the search for the shortest length it runs at finds
    one), or that a constant table fixes (a position embedding of ops.arange(12) added to the
    tokens': that length is declared): the model loads and computes what Keras computes."""
    rng = np.random.RandomState(12)
    if case == "position_table":
        x = keras.Input((None,), dtype="int32")
        h = layers.Embedding(30, 4)(x) + layers.Embedding(12, 4)(keras.ops.arange(0, 12))
        data = rng.randint(0, 30, (3, 12)).astype("int32")
    elif case in ("frames", "framed_projection"):
        x = keras.Input((None,))
        h = layers.Reshape((-1, 20))(x)
        if case == "framed_projection":
            h = keras.ops.matmul(h, rng.uniform(-1, 1, (20, 4)).astype("float32"))
        data = rng.uniform(-1, 1, (3, 180)).astype("float32")
    else:
        x = keras.Input((None, 3))
        h = layers.Reshape((-1, 30))(layers.Reshape((-1, 5, 6))(x))
        data = rng.uniform(-1, 1, (3, 30, 3)).astype("float32")
    model = keras.Model(x, layers.Dense(2)(layers.LSTM(3)(h)))
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    assert ours.input_specs[0][1][1] == (12 if case == "position_table" else None)
    if case != "position_table":
        assert ours.shortest_length(at_least=7) % (10 if case == "regrouped" else 20) == 0
    with torch.no_grad():
        got = ours(torch.as_tensor(data)).numpy()
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(data)), atol=1e-5, rtol=1e-5)


@pytest.mark.keras
def test_a_model_too_short_at_every_length_is_refused_without_long_runs(tmp_path, monkeypatch):
    """A recurrent layer before a convolution no length up to 65536 steps satisfies: the trials
    past 1024 steps check the shapes alone (nothing computed) and the refusal names every length
    tried."""
    import cudnn_rnn.keras.load as loader

    x = keras.Input((None, 2))
    h = layers.Conv1D(1, 40000, dilation_rate=2)(layers.LSTM(3, return_sequences=True)(x))  # (80,000 steps)
    keras.Model(x, h).save(tmp_path / "m.keras")
    real = []
    trial = loader._trial
    monkeypatch.setattr(loader, "_trial", lambda model, inputs, path: (real.append(inputs[0].shape[1]),
                                                                        trial(model, inputs, path)))
    with pytest.raises(ConversionError, match=r"at 8, 128, 1024, 4096, 16384 or 65536 steps: the layer raised"):
        load_keras(tmp_path / "m.keras")
    assert max(real) == 1024


@pytest.mark.keras
@pytest.mark.parametrize("case", ["mel_spectrogram", "stft_convolutions"])
def test_models_that_need_long_inputs(case, tmp_path):
    """Audio models on a free number of samples that run only on more than 1024 of them
    (MelSpectrogram's defaults pad by 1024 on each side, reflecting; an STFT's frames through a
    stack of valid convolutions and a pooling): the model loads, keeps its free length and
    computes what Keras computes on 3000 samples."""
    rng = np.random.RandomState(13)
    if case == "mel_spectrogram":
        x = keras.Input((None,))
        h = layers.Permute((2, 1))(layers.MelSpectrogram(num_mel_bins=16)(x))
        out = layers.Dense(2)(layers.LSTM(3)(h))
        data = rng.normal(0, 0.2, (2, 3000)).astype("float32")
    else:
        x = keras.Input((None, 1))
        h = layers.STFTSpectrogram(mode="log", frame_length=64, frame_step=16, fft_length=64)(x)
        h = layers.MaxPooling1D(4)(layers.Conv1D(4, 40, activation="relu")(h))
        out = layers.Dense(2)(layers.GlobalMaxPooling1D()(layers.Conv1D(3, 8)(h)))
        data = rng.normal(0, 0.2, (2, 3000, 1)).astype("float32")
    model = keras.Model(x, out)
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    assert ours.input_specs[0][1][1] is None
    with torch.no_grad():
        got = ours(torch.as_tensor(data)).numpy()
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(data)), atol=1e-5, rtol=1e-5)


def test_converted_file_round_trip(tmp_path):
    fixture = os.path.join(ROOT, "tests", "fixtures", "data", "k3_functional.keras")
    model = load_keras(fixture)
    save_converted(model, tmp_path / "m.pt")
    again = load_converted(tmp_path / "m.pt")
    xs = [torch.randn(3, 6, 4), torch.randn(3, 6, 4)]
    for a, b in zip(model(*xs), again(*xs)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cudnn_rnn", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "KERAS_BACKEND": "torch"})


def test_cli_inspect_convert_verify(tmp_path):
    fixture = os.path.join(ROOT, "tests", "fixtures", "data", "k3_functional.keras")
    out = _cli("inspect", fixture)
    assert out.returncode == 0, out.stderr
    assert "GRU reset_after=False is not supported by cuDNN" in out.stdout and "bidirectional_1" in out.stdout
    out = _cli("convert", fixture, str(tmp_path / "m.pt2"), "--progress")
    assert out.returncode == 0, out.stderr
    program = torch.export.load(str(tmp_path / "m.pt2"))
    xs = [torch.randn(5, 6, 4), torch.randn(5, 6, 4)]
    for a, b in zip(program.module()(*xs), load_keras(fixture)(*xs)):
        torch.testing.assert_close(a, b)
    out = _cli("verify", fixture)
    assert out.returncode == 0 and "max abs error against Keras" in out.stdout, out.stdout + out.stderr
    out = _cli("inspect", str(tmp_path / "missing.keras"))
    assert out.returncode == 2 and "missing.keras: cannot be opened" in out.stderr


def test_cli_serves_recorded_keras_operations(tmp_path):
    """The keras.ops fixture (statistics, sorting, attention, pooling, linear algebra around an
    LSTM, written by Keras on TensorFlow) exports to .pt2 over any batch and computes Keras's
    outputs; ONNX is refused in one line naming the torch operator torch's exporter lacks (the
    matrix inverse), without a traceback."""
    data = os.path.join(ROOT, "tests", "fixtures", "data")
    out = _cli("convert", os.path.join(data, "k3_operations.keras"), str(tmp_path / "m.pt2"))
    assert out.returncode == 0, out.stdout + out.stderr
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    ref = np.load(os.path.join(data, "k3_operations.npz"))
    x = torch.as_tensor(ref["input_0"])
    got = program(torch.cat([x, x]))  # (a batch the export did not see)
    outputs = sorted((k for k in ref.files if k.startswith("output_")), key=lambda k: int(k.split("_")[1]))
    assert len(got) == len(outputs)
    for a, name in zip(got, outputs):
        want = ref[name]
        np.testing.assert_allclose(a.detach().numpy(), np.concatenate([want, want]), rtol=1e-4, atol=1e-5, err_msg=name)
    out = _cli("convert", os.path.join(data, "k3_operations.keras"), str(tmp_path / "m.onnx"))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "has no translation for aten.linalg_inv_ex" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_cli_says_what_failed_and_what_to_pass(tmp_path):
    data = os.path.join(ROOT, "tests", "fixtures", "data")
    # Keras 3 cannot load this tf.keras 2 file: the oracle's failure is named, no traceback
    out = _cli("verify", os.path.join(data, "tfk_functional.h5"))
    assert out.returncode == 3, out.stdout + out.stderr
    assert "Keras 3.15.1 itself cannot load" in out.stderr and "Traceback" not in out.stderr, out.stderr
    # a weights-only file: the hint names the command-line flag
    out = _cli("inspect", os.path.join(data, "k3_sequential.weights.h5"))
    assert out.returncode == 2 and "--architecture MODEL.keras" in out.stderr, out.stderr
    # not a terminal: no progress unless asked
    out = _cli("convert", os.path.join(data, "k3_sequential.keras"), str(tmp_path / "m.pt2"))
    assert out.returncode == 0 and "[cudnn-rnn]" not in out.stderr, out.stderr
    assert "import cudnn_rnn, torch; torch.export.load" in out.stdout
    out = _cli("convert", os.path.join(data, "k3_sequential.keras"), str(tmp_path / "m.pt"), "--progress")
    assert out.returncode == 0 and "[cudnn-rnn] converting" in out.stderr


@pytest.mark.keras
@pytest.mark.parametrize("fixture", ["k3_sequential", "k3_functional"])
@pytest.mark.parametrize("suffix", [".keras", ".weights.h5"])
def test_round_trip_keras_ours_keras_is_exact(fixture, suffix, tmp_path):
    source = os.path.join(ROOT, "tests", "fixtures", "data", f"{fixture}.keras")
    original = keras.saving.load_model(source, compile=False)
    ours = load_keras(source)
    cudnn_rnn.save_keras(ours, tmp_path / f"back{suffix}")
    if suffix == ".keras":
        back = keras.saving.load_model(tmp_path / "back.keras", compile=False)
    else:
        back = keras.saving.load_model(source, compile=False)
        back.load_weights(tmp_path / "back.weights.h5")
    for a, b in zip(original.weights, back.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)
    data = np.load(os.path.join(ROOT, "tests", "fixtures", "data", f"{fixture}.npz"))
    xs = [data[k] for k in sorted(k for k in data.files if k.startswith("input_"))]
    y0 = original(xs if len(xs) > 1 else xs[0])
    y1 = back(xs if len(xs) > 1 else xs[0])
    for a, b in zip(y0 if isinstance(y0, list) else [y0], y1 if isinstance(y1, list) else [y1]):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


@pytest.mark.keras
@pytest.mark.parametrize("make", [
    lambda: cudnn_rnn.LSTM(4, 5, return_sequences=True, recurrent_activation="hard_sigmoid", num_layers=2),
    lambda: cudnn_rnn.GRU(4, 3, reset_after=False, go_backwards=True, return_state=True),
    lambda: cudnn_rnn.Bidirectional(cudnn_rnn.SimpleRNN(4, 3, activation="relu", return_sequences=True), merge_mode="ave"),
    lambda: cudnn_rnn.Bidirectional(cudnn_rnn.GRU(4, 3), backward_layer=cudnn_rnn.LSTM(4, 2, go_backwards=True)),
], ids=["lstm-stack", "gru-before", "bi-simple", "bi-mixed"])
def test_our_layers_export_to_keras(make, tmp_path):
    torch.manual_seed(0)
    layer = make().eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.uniform_(-0.6, 0.6)
    cudnn_rnn.save_keras(layer, tmp_path / "l.keras")
    back = keras.saving.load_model(tmp_path / "l.keras", compile=False)
    x = np.random.RandomState(0).uniform(-1, 1, (3, 6, 4)).astype("float32")
    mask = np.ones((3, 6), bool)
    mask[1, 4:] = False
    expected = back(x, mask=mask)
    ours = layer(torch.as_tensor(x), mask=torch.as_tensor(mask))
    for a, b in zip(ours if isinstance(ours, list) else [ours], expected if isinstance(expected, (list, tuple)) else [expected]):
        np.testing.assert_allclose(a.detach().numpy(), keras.ops.convert_to_numpy(b), atol=1e-5, rtol=1e-5)


def _matches_in_both_formats(model, xs, tmp_path):
    """Saves `model` as .keras and legacy .h5, loads each: its outputs on xs within 1e-5 of
    Keras's. (Keras's outputs, the model loaded from the .h5.)"""
    expected = keras.ops.convert_to_numpy(model(xs))
    for suffix in (".keras", ".h5"):
        model.save(tmp_path / f"m{suffix}")
        ours = load_keras(tmp_path / f"m{suffix}")
        with torch.no_grad():
            y = ours(*[torch.as_tensor(x) for x in xs]).numpy()
        np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5, err_msg=suffix)
    return expected, ours


@pytest.mark.keras
def test_nested_models_and_shared_layers(tmp_path):
    rng = np.random.RandomState(9)
    encoder = keras.Sequential([keras.Input((T, 4)), layers.Masking(0.0), layers.GRU(5, return_sequences=True),
                                layers.LSTM(3)], name="encoder")
    a, b = keras.Input((T, 4)), keras.Input((T, 4))
    shared_head = layers.Dense(2)
    out = layers.Subtract()([shared_head(encoder(a)), shared_head(encoder(b))])
    model = keras.Model([a, b], out)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    xs = [rng.uniform(-1, 1, (B, T, 4)).astype("float32") for _ in range(2)]
    xs[0][1, 5:] = 0
    _matches_in_both_formats(model, xs, tmp_path)


@pytest.mark.keras
def test_time_distributed_model_and_frozen_nested_batch_norm(tmp_path):
    """TimeDistributed of a whole Sequential (BatchNormalization, a frozen convolution) and a
    frozen functional base with BatchNormalization as a nested model: .keras and legacy .h5 (which
    lists a nested model's trainable weights first), and save_keras's file read back by Keras."""
    rng = np.random.RandomState(13)
    frame = keras.Sequential([keras.Input((6, 6, 2)), layers.Conv2D(3, 3, padding="same"), layers.BatchNormalization(),
                              layers.Conv2D(4, 1), layers.GlobalAveragePooling2D()])
    frame.layers[0].trainable = False
    i = keras.Input((6, 6, 2))
    base = keras.Model(i, layers.Dense(3)(layers.Flatten()(layers.BatchNormalization()(layers.Conv2D(2, 3)(i)))))
    base.trainable = False
    video, image = keras.Input((T, 6, 6, 2)), keras.Input((6, 6, 2))
    out = layers.Concatenate()([layers.GRU(4)(layers.TimeDistributed(frame)(video)), base(image)])
    model = keras.Model([video, image], out)
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32") if "variance" in v.path
                       else rng.uniform(-0.6, 0.6, w.shape).astype("float32") for v, w in zip(model.weights, model.get_weights())])
    xs = [rng.uniform(-1, 1, (B, T, 6, 6, 2)).astype("float32"), rng.uniform(-1, 1, (B, 6, 6, 2)).astype("float32")]
    expected, ours = _matches_in_both_formats(model, xs, tmp_path)
    cudnn_rnn.save_keras(ours, tmp_path / "back.keras")
    back = keras.models.load_model(tmp_path / "back.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(back(xs)), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("inner_kind", ["functional", "sequential"])
def test_nested_model_output_read_by_a_layer_and_returned(inner_kind, tmp_path):
    """Keras 3 numbers a nested Functional model's calls from 0 where a layer reads them and from
    1 in output_layers (a nested Sequential from 0 in both): the model's outputs must be the calls
    the config names, here the first of two calls, also read by a later layer."""
    rng = np.random.RandomState(11)
    if inner_kind == "sequential":
        inner = keras.Sequential([keras.Input((T, 4)), layers.Masking(0.0), layers.LSTM(3, return_sequences=True)],
                                 name="inner")
    else:
        si = keras.Input((T, 4))
        inner = keras.Model(si, layers.LSTM(3, return_sequences=True)(layers.Masking(0.0)(si)), name="inner")
    a, b = keras.Input((T, 4)), keras.Input((T, 4))
    first, second = inner(a), inner(b)
    model = keras.Model([a, b], [layers.Concatenate()([first, second]), first, layers.Dense(2)(second)])
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    xs = [rng.uniform(-1, 1, (B, T, 4)).astype("float32") for _ in range(2)]
    xs[0][1, 5:] = 0
    expected = [keras.ops.convert_to_numpy(t) for t in model(xs)]
    for suffix in (".keras", ".h5"):
        model.save(tmp_path / f"m{suffix}")
        ours = load_keras(tmp_path / f"m{suffix}")
        with torch.no_grad():
            ys = ours(*[torch.as_tensor(x) for x in xs])
        assert len(ys) == 3
        for i, (y, e) in enumerate(zip(ys, expected)):
            np.testing.assert_allclose(y.numpy(), e, atol=1e-5, rtol=1e-5, err_msg=f"{suffix} output {i}")


def _sequential_lists(case):
    if case == "state-last":
        return keras.Sequential([keras.Input((T, 4)), layers.Masking(0.0), layers.LSTM(3, return_state=True)])
    if case == "bi-none-then-merge":
        return keras.Sequential([keras.Input((T, 4)), layers.Masking(0.0),
                                 layers.Bidirectional(layers.GRU(3, return_sequences=True), merge_mode=None),
                                 layers.Concatenate(), layers.SimpleRNN(2)])
    if case == "bi-state-last":
        return keras.Sequential([keras.Input((T, 4)), layers.Bidirectional(layers.LSTM(3, return_state=True))])
    if case == "sequential-in-sequential":
        inner = keras.Sequential([keras.Input((T, 4)), layers.Masking(0.0), layers.GRU(3, return_state=True)], name="inner")
        return keras.Sequential([keras.Input((T, 4)), inner, layers.Concatenate(), layers.Dense(2)])
    if case == "functional-in-sequential":
        x = keras.Input((T, 4))
        h = layers.LSTM(2, return_sequences=True)(x)
        inner = keras.Model(x, [layers.GlobalAveragePooling1D()(h), layers.Flatten()(h)], name="inner")
        return keras.Sequential([keras.Input((T, 4)), inner, layers.Concatenate(), layers.Dense(2)])
    if case == "sequential-in-sequential-last":
        inner = keras.Sequential([keras.Input((T, 4)), layers.LSTM(3, return_state=True)], name="inner")
        return keras.Sequential([keras.Input((T, 4)), inner])
    inner = keras.Sequential([keras.Input((T, 4)), layers.Masking(0.0),
                              layers.GRU(3, return_sequences=True, return_state=True)], name="inner")
    x = keras.Input((T, 4))
    seq, state = inner(x)
    return keras.Model(x, layers.Dense(2)(layers.Concatenate()([layers.GlobalAveragePooling1D()(seq), state])))


@pytest.mark.keras
@pytest.mark.parametrize("case", ["state-last", "bi-none-then-merge", "bi-state-last", "nested",
                                  "sequential-in-sequential", "functional-in-sequential",
                                  "sequential-in-sequential-last"])
def test_sequential_passes_a_layers_list_to_the_next(case, tmp_path):
    """A Sequential hands a layer's whole result to the next layer: after an RNN with
    return_state, a Bidirectional with merge_mode=None or a nested model with several outputs that
    is a list (every element read by the next layer, or all returned). Keras 3 files, and save_keras of the model loaded from the
    legacy .h5, reloaded by Keras."""
    rng = np.random.RandomState(12)
    model = _sequential_lists(case)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, (B, T, 4)).astype("float32")
    x[1, 4:] = 0
    expected = model(x)
    expected = [keras.ops.convert_to_numpy(t) for t in (expected if isinstance(expected, (list, tuple)) else [expected])]
    for suffix in (".keras", ".h5"):
        model.save(tmp_path / f"m{suffix}")
        ours = load_keras(tmp_path / f"m{suffix}")
        cudnn_rnn.save_keras(ours, tmp_path / "back.keras")
        back = keras.saving.load_model(tmp_path / "back.keras", compile=False)(x)
        with torch.no_grad():
            ys = ours(torch.as_tensor(x))
        ys = ys if isinstance(ys, list) else [ys]
        back = back if isinstance(back, (list, tuple)) else [back]
        assert len(ys) == len(expected) == len(back), suffix
        for i, (y, b, e) in enumerate(zip(ys, back, expected)):
            np.testing.assert_allclose(y.numpy(), e, atol=1e-5, rtol=1e-5, err_msg=f"{suffix} output {i}")
            np.testing.assert_allclose(keras.ops.convert_to_numpy(b), e, atol=1e-6, rtol=1e-6,
                                       err_msg=f"{suffix} written back, output {i}")


def test_keras_2_2_4_defaults_to_hard_sigmoid_gates(tmp_path):
    """Keras <= 2.2.4 configs may omit recurrent_activation, whose default then was hard_sigmoid
    (Keras 2's 0.2x + 0.5): such a file loads as the same file with the key written out."""
    import h5py
    import shutil

    source = os.path.join(ROOT, "tests", "fixtures", "data", "tfk_sequential.h5")
    explicit, implicit = tmp_path / "explicit.h5", tmp_path / "implicit.h5"
    for path, drop in ((explicit, False), (implicit, True)):
        shutil.copy(source, path)
        with h5py.File(path, "r+") as f:
            config = json.loads(f.attrs["model_config"])
            for layer in config["config"]["layers"]:
                inner = layer["config"].get("layer", layer)["config"] if layer["class_name"] == "Bidirectional" else layer["config"]
                if layer["class_name"] in ("LSTM", "GRU", "Bidirectional"):
                    if drop:
                        inner.pop("recurrent_activation", None)
                    else:
                        inner["recurrent_activation"] = "hard_sigmoid"
            f.attrs["model_config"] = json.dumps(config)
            f.attrs["keras_version"] = "2.2.4"
    x = torch.randn(3, 6, 4)
    with torch.no_grad():
        a, b = load_keras(explicit)(x), load_keras(implicit)(x)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    layer = load_keras(implicit).layers["lstm"].layer
    assert layer.recurrent_activation == "hard_sigmoid_keras2"


@pytest.mark.keras
@pytest.mark.parametrize("first", ["lstm", "conv1d", "dense"])
def test_sequential_without_declared_input_shape(first, tmp_path):
    """A Sequential built by calling it (no Input layer: its config declares no input shape) takes
    its input width from its first layer's weights."""
    rng = np.random.RandomState(3)
    head = {"lstm": [layers.Masking(0.0), layers.LSTM(4, return_sequences=True)],
            "conv1d": [layers.Conv1D(4, 3, padding="causal")],
            "dense": [layers.Dropout(0.1), layers.Dense(4)]}[first]
    model = keras.Sequential(head + [layers.GRU(3)] if first != "dense" else head + [layers.Dense(2)])
    x = rng.uniform(-1, 1, size=(B, T, 5) if first != "dense" else (B, 5)).astype("float32")
    model(x)  # builds it
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    # as tf.keras writes a Sequential built by fit: an input layer without batch_shape
    with zipfile.ZipFile(tmp_path / "m.keras") as z:
        members = {name: z.read(name) for name in z.namelist()}
    config = json.loads(members["config.json"])
    for layer in config["config"]["layers"]:
        if layer["class_name"] == "InputLayer":
            layer["config"].pop("batch_shape", None)
            layer["config"].pop("batch_input_shape", None)
    config["config"].pop("build_input_shape", None)
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(tmp_path / "edited.keras", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    ours = load_keras(tmp_path / "edited.keras")
    assert ours.input_specs[0][1][-1] == x.shape[-1]  # the width its first layer implies
    with torch.no_grad():
        np.testing.assert_allclose(ours(torch.as_tensor(x)).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_cli_version_outputs_and_lengths(tmp_path):
    """--version; an output kind it does not write and a missing folder are refused by name (exit
    2, no traceback); a declared fixed length is kept and said, --any-length makes it dynamic."""
    import onnxruntime as ort

    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.startswith(f"cudnn-rnn {cudnn_rnn.__version__} (torch "), out.stdout
    example = os.path.join(ROOT, "examples", "sentiment.h5")
    out = _cli("convert", example, str(tmp_path / "model.xyz"))
    assert out.returncode == 2 and "must end in .pt" in out.stderr and "Traceback" not in out.stderr
    out = _cli("convert", example, str(tmp_path / "missing" / "model.pt"))
    assert out.returncode == 2 and "does not exist" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "missing").exists()
    out = _cli("convert", example, str(tmp_path / "fixed.onnx"))
    assert out.returncode == 0 and "declares fixed lengths (input 0: 20)" in out.stderr, out.stderr
    out = _cli("convert", example, str(tmp_path / "any.onnx"), "--any-length")
    assert out.returncode == 0, out.stderr
    session = ort.InferenceSession(str(tmp_path / "any.onnx"))
    tokens = torch.randint(1, 150, (3, 7))
    (got,) = session.run(None, {session.get_inputs()[0].name: tokens.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(got, load_keras(example)(tokens).numpy(), atol=1e-5, rtol=1e-5)
    usage = " ".join(_cli("verify", "--help").stdout.split())
    assert "--tolerance" in usage and "above it verify exits 1" in usage and "seed of the random inputs" in usage


def test_cli_any_length_of_a_fixed_length_file_with_reversed_slices(tmp_path):
    """A Keras 3 file (TensorFlow backend) with a declared length of 6 and slices with negative
    steps (h[:, ::-1], h[:, 4:0:-2], h[..., ::-2], h[:, -2::-3, 1:4]; the fixture test matches it
    against Keras's outputs). With --any-length, torch.export proves those slices' shapes only from
    8 steps: the example follows the minimum it takes (it stayed at the declared 6, and the export
    failed), and the program and the ONNX file match the eager model from there on."""
    import re

    import onnxruntime as ort

    fixture = os.path.join(ROOT, "tests", "fixtures", "data", "k3_reversed_slices.keras")
    model = load_keras(fixture)
    for ext in ("pt2", "onnx"):
        out = _cli("convert", fixture, str(tmp_path / f"m.{ext}"), "--any-length")
        assert out.returncode == 0, out.stderr[-3000:]
        said = re.search(r"time >= (\d+)", out.stdout)
        minimum = int(said.group(1)) if said else 2
        assert minimum <= 16, out.stdout
        if ext == "pt2":
            program = torch.export.load(str(tmp_path / "m.pt2")).module()
        else:
            session = ort.InferenceSession(str(tmp_path / "m.onnx"))
        for T in (minimum, minimum + 3, 41):
            x = torch.randn(2, T, 4)
            with torch.no_grad():
                want = [y.numpy() for y in model(x)]
            got = ([y.detach().numpy() for y in program(x)] if ext == "pt2"
                   else session.run(None, {session.get_inputs()[0].name: x.numpy()}))
            assert [g.shape for g in got] == [w.shape for w in want]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_cli_any_length_keeps_state_inputs_and_refuses_length_bound_models(tmp_path):
    """--any-length frees the length of sequence inputs only: the state inputs (batch, units) of
    tf_keras's stacked-cells fixture keep their sizes (they were given a free second dimension,
    and the export failed), and the program matches the eager model at three lengths. A model that
    splits the time axis into halves (tf.split(h, 2, axis=1)) holds at even lengths only: convert
    says so, for .pt2 and for .onnx (whose exporter fell back to a fixed length without a word); one
    that runs at its declared length only says that."""
    import onnxruntime as ort

    data = os.path.join(ROOT, "tests", "fixtures", "data")
    fixture = os.path.join(data, "tfk_stacked_states.h5")
    model = load_keras(fixture)
    for ext in ("pt2", "onnx"):
        out = _cli("convert", fixture, str(tmp_path / f"m.{ext}"), "--any-length")
        assert out.returncode == 0, out.stderr[-3000:]
        # (an .onnx file names its inputs: by the model's input_keys)
        names = [f"{k}: " for k in model.input_keys] if ext == "onnx" else [""] * 4
        assert "the program takes {}float32 [batch, time, 4]; {}float32 [batch, 3]; {}float32 [batch, 4]; {}float32 " \
               "[batch, 4]".format(*names) in out.stdout, out.stdout
        if ext == "pt2":
            program = torch.export.load(str(tmp_path / "m.pt2")).module()
        else:
            session = ort.InferenceSession(str(tmp_path / "m.onnx"))
        for T in (3, 6, 17):
            xs = [torch.rand(2, T, 4) * 2 - 1] + [torch.rand(2, n) * 2 - 1 for n in (3, 4, 4)]
            with torch.no_grad():
                want = [y.numpy() for y in model(*xs)]
            got = ([y.detach().numpy() for y in program(*xs)] if ext == "pt2" else
                   session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), xs)}))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    split = os.path.join(data, "tfk_more_tf_ops.h5")
    for ext in ("pt2", "onnx"):
        out = _cli("convert", split, str(tmp_path / f"split.{ext}"), "--any-length")
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        assert "cannot be exported" in out.stderr and "particular lengths only" in out.stderr, out.stderr[-2000:]
        assert "Traceback" not in out.stderr
    # one that runs at its declared length only (a reshape to T * 4 values): one line, no traceback;
    # at that length it exports, its batch free (tf.fill of tf.shape's sizes keeps them symbolic)
    bound = os.path.join(data, "tfk_tf_gathers_losses.h5")
    out = _cli("convert", bound, str(tmp_path / "bound.pt2"), "--any-length")
    assert out.returncode == 2 and "does not run on" in out.stderr and "without --any-length" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    out = _cli("convert", bound, str(tmp_path / "bound.pt2"))
    assert out.returncode == 0, out.stderr[-3000:]
    program, model = torch.export.load(str(tmp_path / "bound.pt2")).module(), load_keras(bound)
    xs = [torch.rand(5, 6, 4) * 2 - 1, torch.randint(0, 24, (5, 6))]
    with torch.no_grad():
        for g, w in zip(program(*xs), model(*xs)):
            np.testing.assert_allclose(g.detach().numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("case", ["permuted", "attention"])
def test_cli_exports_strided_same_pooling_followed_by_views(tmp_path, case):
    """A "same" pooling of stride 2 over the free length, then: Permute back and LeakyReLU
    (permuted: the activation on the transposed view made torch.export compare strides over the
    pooled length), or a Dot self-attention (attention: its reshape compared the pooled length's
    square divided by itself). Both guards are true, but torch could not prove them through the
    padding's max(0, ...), so the export failed at every minimum. The padding needs no max where the
    window is as long as the stride; the .pt2 takes every length from the minimum it reports (at
    most 4: a pooled length of 1 is specialised) and matches Keras there."""
    import re

    rng = np.random.RandomState(6)
    if case == "permuted":
        body = [layers.Permute((2, 1)), layers.AveragePooling1D(2, padding="same", data_format="channels_first"),
                layers.Permute((2, 1)), layers.LeakyReLU(0.2), layers.LSTM(4)]
        model = keras.Sequential([keras.Input((None, 3))] + body)
    else:
        x_in = keras.Input((None, 3))
        h = layers.MaxPooling1D(2, padding="same")(layers.Dense(4)(x_in))
        scores = layers.Softmax()(layers.Dot(axes=(2, 2))([h, h]))
        model = keras.Model(x_in, layers.GRU(3)(layers.Dot(axes=(2, 1))([scores, h])))
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    out = _cli("convert", str(tmp_path / "m.keras"), str(tmp_path / "m.pt2"))
    assert out.returncode == 0, out.stderr[-3000:]
    said = re.search(r"time >= (\d+)", out.stdout)
    minimum = int(said.group(1)) if said else 2
    assert minimum <= 4, out.stdout
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    for T in (minimum, 7, 30):
        x = rng.uniform(-1, 1, (2, T, 3)).astype("float32")
        np.testing.assert_allclose(program(torch.as_tensor(x)).detach().numpy(),
                                   keras.ops.convert_to_numpy(model(x)), rtol=1e-5, atol=1e-5)


@pytest.mark.keras
def test_cli_exports_a_model_that_needs_a_minimum_length(tmp_path):
    """keras.io's CNN-LSTM (Embedding, Conv1D(kernel 5), MaxPooling1D(4), LSTM) runs from 8 steps.
    convert finds that length: its .pt2 takes every length from the minimum torch.export proves
    its shapes over (12: a pooled length of 1 is specialised) and its .onnx every length from 8,
    both as Keras computes them; onnx.export from the Python API too; verify's default inputs
    are that long. (A 5-step example cannot be traced through it, and torch.export makes
    F.max_pool1d's input length a constant.)"""
    import onnxruntime as ort

    import cudnn_rnn.onnx

    rng = np.random.RandomState(5)
    model = keras.Sequential([keras.Input((None,), dtype="int32"), layers.Embedding(300, 8),
                              layers.Conv1D(6, 5, activation="relu"), layers.MaxPooling1D(4), layers.LSTM(7),
                              layers.Dense(2, activation="sigmoid")])
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")

    def keras_on(length):
        tokens = rng.randint(0, 300, size=(3, length))
        return tokens, keras.ops.convert_to_numpy(model(tokens.astype("int32")))

    out = _cli("convert", str(tmp_path / "m.keras"), str(tmp_path / "m.pt2"))
    assert out.returncode == 0, out.stderr
    assert "the program takes int64 [batch, time >= 12]" in out.stdout, out.stdout
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    for length in (12, 23, 64):
        tokens, expected = keras_on(length)
        np.testing.assert_allclose(program(torch.as_tensor(tokens)).detach().numpy(), expected, atol=1e-5, rtol=1e-5)
    out = _cli("convert", str(tmp_path / "m.keras"), str(tmp_path / "m.onnx"))
    assert out.returncode == 0 and "checked in onnxruntime" in out.stdout, out.stdout + out.stderr
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    name = session.get_inputs()[0].name
    assert f"the program takes {name}: int64 [batch, time >= 8]" in out.stdout, out.stdout
    assert [name] == load_keras(str(tmp_path / "m.keras")).input_keys
    for length in (8, 13, 64):
        tokens, expected = keras_on(length)
        (got,) = session.run(None, {session.get_inputs()[0].name: tokens.astype("int64")})
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    cudnn_rnn.onnx.export(load_keras(tmp_path / "m.keras"), (torch.as_tensor(keras_on(30)[0]),), tmp_path / "api.onnx")
    session = ort.InferenceSession(str(tmp_path / "api.onnx"))
    tokens, expected = keras_on(20)
    (got,) = session.run(None, {session.get_inputs()[0].name: tokens.astype("int64")})
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
    out = _cli("verify", str(tmp_path / "m.keras"))
    assert out.returncode == 0 and "max abs error against Keras" in out.stdout, out.stdout + out.stderr


@pytest.mark.keras
def test_strided_same_padding_exports_with_a_dynamic_length(tmp_path):
    """Conv1D(strides=2, padding="same") and MaxPooling1D(3, strides=2, padding="same") pad by an
    amount that depends on the length's parity: computed symbolically, the .pt2 keeps the length
    dynamic (a guard on its value fails the export at every minimum length)."""
    rng = np.random.RandomState(6)
    model = keras.Sequential([keras.Input((None, 4)), layers.Conv1D(5, 3, strides=2, padding="same"),
                              layers.MaxPooling1D(3, strides=2, padding="same"), layers.GRU(3), layers.Dense(2)])
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    out = _cli("convert", str(tmp_path / "m.keras"), str(tmp_path / "m.pt2"))
    assert out.returncode == 0, out.stderr
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    for length in (16, 17, 30, 41):
        x = rng.uniform(-1, 1, size=(2, length, 4)).astype("float32")
        np.testing.assert_allclose(program(torch.as_tensor(x)).detach().numpy(), keras.ops.convert_to_numpy(model(x)),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.keras
def test_adaptive_pooling_exports_for_every_length(tmp_path):
    """AdaptiveMaxPooling1D / AdaptiveAveragePooling1D after a recurrent layer: the exported
    windows follow the length (torch's exporters fix F.adaptive_*_pool's windows to the
    example's: its ONNX computes other values or fails at other lengths), in .pt2 and .onnx, as
    Keras computes them; and the windows' form against torch's own adaptive pooling in 1-3-D."""
    import onnxruntime as ort
    import torch.nn.functional as F

    from cudnn_rnn.keras.layers.pooling import _adaptive_along

    rng = np.random.RandomState(8)
    for n, (d, kind) in enumerate([(1, "max"), (1, "avg"), (2, "max"), (2, "avg"), (3, "max"), (3, "avg")]):
        h = torch.randn(2, 3, *rng.randint(1, 23, size=d).tolist(), dtype=torch.float64)
        size = rng.randint(1, 7, size=d).tolist()
        got = h
        for axis, m in enumerate(size):
            got = _adaptive_along(got, 2 + axis, m, kind == "avg")
        pool = getattr(F, f"adaptive_{kind}_pool{d}d")
        torch.testing.assert_close(got, pool(h, size), rtol=1e-12, atol=1e-12, msg=f"{d}-D {kind} {size}")
    for layer in (layers.AdaptiveMaxPooling1D(4), layers.AdaptiveAveragePooling1D(5)):
        model = keras.Sequential([keras.Input((None, 3)), layers.LSTM(4, return_sequences=True), layer,
                                  layers.Flatten(), layers.Dense(2)])
        model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
        model.save(tmp_path / "m.keras")
        for suffix in (".pt2", ".onnx"):
            out = _cli("convert", str(tmp_path / "m.keras"), str(tmp_path / f"m{suffix}"))
            assert out.returncode == 0, out.stderr
        program = torch.export.load(str(tmp_path / "m.pt2")).module()
        session = ort.InferenceSession(str(tmp_path / "m.onnx"))
        for length in (7, 16, 33, 64):
            x = rng.uniform(-1, 1, size=(2, length, 3)).astype("float32")
            expected = keras.ops.convert_to_numpy(model(x))
            np.testing.assert_allclose(program(torch.as_tensor(x)).detach().numpy(), expected, atol=1e-5, rtol=1e-5)
            np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], expected,
                                       atol=1e-5, rtol=1e-5)


def _speech_model():
    """keras.io's DeepSpeech-2-like CTC model, small: spectrogram frames reshaped to an image,
    strided 'same' Conv2D over time and frequency, reshaped back to a sequence (-1 steps),
    Bidirectional GRUs."""
    inp = keras.Input((None, 17))
    h = layers.Reshape((-1, 17, 1))(inp)
    h = layers.Conv2D(4, (11, 9), strides=(2, 2), padding="same", use_bias=False)(h)
    h = layers.ReLU()(layers.BatchNormalization()(h))
    h = layers.Reshape((-1, h.shape[-2] * h.shape[-1]))(h)
    h = layers.Bidirectional(layers.GRU(6, return_sequences=True))(h)
    return keras.Model(inp, layers.Dense(5, activation="softmax")(h))


def _seq2seq_model():
    """keras.io's character-level seq2seq: the encoder LSTM's states start the decoder's, two
    inputs of their own lengths."""
    encoder, decoder = keras.Input((None, 6)), keras.Input((None, 5))
    _, h, c = layers.LSTM(8, return_state=True)(encoder)
    y = layers.LSTM(8, return_sequences=True)(decoder, initial_state=[h, c])
    return keras.Model([encoder, decoder], layers.Dense(5, activation="softmax")(y))


@pytest.mark.keras
@pytest.mark.parametrize("make", [_speech_model, _seq2seq_model], ids=["speech", "seq2seq"])
def test_classic_models_export_for_other_lengths(make, tmp_path, capsys):
    """cudnn-rnn convert to .pt2 and .onnx, the programs run at lengths other than the
    example's (odd and even: a strided 'same' convolution pads by the length's parity), as Keras
    computes them."""
    import onnxruntime as ort

    from cudnn_rnn import cli

    rng = np.random.RandomState(9)
    model = make()
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32") if "variance" in w.path
                       else rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.weights])
    model.save(tmp_path / "m.keras")
    for suffix in (".pt2", ".onnx"):
        assert cli.main(["convert", str(tmp_path / "m.keras"), str(tmp_path / f"m{suffix}"), "--no-progress"]) == 0
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    for lengths in ((19, 12), (40, 7)):
        xs = [rng.uniform(-1, 1, size=(2, n, int(i.shape[-1]))).astype("float32") for n, i in zip(lengths, model.inputs)]
        expected = keras.ops.convert_to_numpy(model(xs if len(xs) > 1 else xs[0]))
        np.testing.assert_allclose(program(*map(torch.as_tensor, xs)).detach().numpy(), expected, atol=1e-5, rtol=1e-5)
        got = session.run(None, {i.name: x for i, x in zip(session.get_inputs(), xs)})[0]
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.keras
def test_cli_says_an_exported_stateful_model_keeps_no_state(tmp_path, capsys):
    """A stateful LSTM exported: the program starts every call from zero states (Keras's second
    call continues from the first's), which convert says, naming the layer; the first call
    computes what Keras computes."""
    from cudnn_rnn import cli

    rng = np.random.RandomState(10)
    model = keras.Sequential([keras.Input(batch_shape=(3, None, 4)), layers.LSTM(5, stateful=True, return_sequences=True,
                                                                                name="streaming_lstm")])
    model.set_weights([rng.uniform(-0.5, 0.5, w.shape).astype("float32") for w in model.get_weights()])
    model.save(tmp_path / "m.keras")
    assert cli.main(["convert", str(tmp_path / "m.keras"), str(tmp_path / "m.pt2"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "keeps no state between calls: its stateful layers (streaming_lstm) start every call from zero states" in err
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    x = rng.uniform(-1, 1, size=(3, 6, 4)).astype("float32")
    np.testing.assert_allclose(program(torch.as_tensor(x)).detach().numpy(), keras.ops.convert_to_numpy(model(x)),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("merge", ["Maximum", "Minimum", "Multiply", "Add", "Average"])
@pytest.mark.parametrize("masked", ["first", "all", "two_of_three"])
def test_merges_read_their_inputs_masks(merge, masked, tmp_path):
    """Keras 3.4+'s Maximum / Minimum / Multiply use the input masks for their values (a masked
    step takes the other inputs' value, or 1 in a product, then 0 where every input is masked);
    Flatten then reads every step, masked ones included."""
    rng = np.random.RandomState(21)
    n = 3 if masked == "two_of_three" else 2
    ins = [keras.Input((T, 4)) for _ in range(n)]
    branches = []
    for i, inp in enumerate(ins):
        if masked == "all" or i == 0 or (masked == "two_of_three" and i == 1):
            branches.append(layers.LSTM(3, return_sequences=True)(layers.Masking(0.0)(inp)))
        else:
            branches.append(layers.Dense(3)(inp))
    model = keras.Model(ins, layers.Dense(2)(layers.Flatten()(getattr(layers, merge)()(branches))))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    xs = [rng.uniform(-1, 1, (B, T, 4)).astype("float32") for _ in range(n)]
    xs[0][1, 4:] = 0  # different padded steps per input
    xs[1][1, 2:] = 0
    xs[1][2, :3] = 0
    expected = keras.ops.convert_to_numpy(model(xs))
    model.save(tmp_path / "m.keras")
    with torch.no_grad():
        y = load_keras(tmp_path / "m.keras")(*[torch.as_tensor(x) for x in xs]).numpy()
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("layer", ["Rescaling", "Normalization"])
def test_rescaling_and_normalization_pass_the_mask_on(layer, tmp_path):
    """Keras 3's Rescaling and Normalization support masking: the mask of a Masking before them
    reaches the causal Attention and the GRU after them (both dropped it here, and the attention
    read padded steps)."""
    rng = np.random.RandomState(22)
    inp = keras.Input((T, 4))
    h = layers.Masking(0.0)(inp)
    h = layers.Rescaling(0.5, offset=0.25)(h) if layer == "Rescaling" else layers.Normalization(
        mean=[0.1, -0.2, 0.0, 0.3], variance=[1.5, 0.5, 2.0, 1.0])(h)
    a = layers.Attention(use_scale=True)([h, h], use_causal_mask=True)
    out = layers.Concatenate()([layers.GlobalAveragePooling1D()(a), layers.GRU(3)(h)])
    model = keras.Model(inp, layers.Dense(2)(out))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") if w.ndim else w
                       for w in model.get_weights()])
    x = rng.uniform(-1, 1, (B, T, 4)).astype("float32")
    x[0, 3] = 0  # a hole
    x[1, T - 2:] = 0
    x[2, :2] = 0
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    with torch.no_grad():
        y = load_keras(tmp_path / "m.keras")(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("kind", ["ConvLSTM1D", "ConvLSTM2D", "Bidirectional"])
def test_masking_before_a_conv_lstm(kind, tmp_path):
    """Keras's Masking gives a ConvLSTM a mask per position (batch, time, *spatial): padded frames
    and single all-zero pixels keep their states."""
    rng = np.random.RandomState(31)
    spatial = (6,) if kind == "ConvLSTM1D" else (5, 4)
    inp = keras.Input((5, *spatial, 2))
    conv = getattr(layers, "ConvLSTM1D" if kind == "ConvLSTM1D" else "ConvLSTM2D")
    h = layers.Masking(0.0)(inp)
    if kind == "Bidirectional":
        h = layers.Bidirectional(conv(3, 3, padding="same", return_sequences=True))(h)
    else:
        h = conv(3, 3, padding="same", return_sequences=True)(h)
    model = keras.Model(inp, layers.Dense(2)(layers.Flatten()(h)))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, size=(3, 5, *spatial, 2)).astype("float32")
    x[1, 3:] = 0  # padded frames
    x[0, 1, 2] = 0  # zero pixels (rows) inside real frames
    x[2, 0, 0] = 0
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    with torch.no_grad():
        y = load_keras(tmp_path / "m.keras")(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.keras
def test_masking_before_a_channels_first_conv_lstm_is_refused_by_name(tmp_path):
    """With channels_first input Keras's Masking reduces the last spatial axis and its ConvLSTM
    masks (filter, row) pairs of the state: not converted, and said so (a shape where every size
    is 3 would otherwise pass for a mask per position)."""
    inp = keras.Input((4, 3, 3, 3))
    model = keras.Model(inp, layers.ConvLSTM2D(3, 3, padding="same", data_format="channels_first")(
        layers.Masking(0.0)(inp)))
    model.save(tmp_path / "m.keras")
    with pytest.raises(ConversionError, match=r"layer 'conv_lstm2d.*a Masking mask reaches a channels_first ConvLSTM"):
        load_keras(tmp_path / "m.keras")


@pytest.mark.keras
def test_embedding_masks_float_ids_as_given(tmp_path):
    """An Embedding fed float ids (a float32 Input, the Keras default): Keras looks up the ids
    truncated but masks on the values as given, so 0.5 is row 0 and a real step. (A Sequential:
    a functional model's file records the mask as a not_equal op of its own.)"""
    model = keras.Sequential([keras.Input((6,)), layers.Embedding(9, 3, mask_zero=True), layers.LSTM(4)])
    rng = np.random.RandomState(5)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = np.array([[0.5, 2.7, 0.0, 0.0, 4.0, 0.25], [3.0, 0.0, 0.5, 8.9, 0.0, 0.0]], dtype="float32")
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    for name in ("m.keras", "m.h5"):
        model.save(tmp_path / name)
        with torch.no_grad():
            got = load_keras(tmp_path / name)(torch.as_tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.keras
def test_cli_verify_feeds_ids_to_float_embedding_inputs(tmp_path):
    """verify draws ids in the vocabulary for an input an Embedding reads, whatever its dtype
    (standard-normal floats there are negative ids, which the lookup refuses)."""
    inp = keras.Input((12,))
    model = keras.Model(inp, layers.Dense(2)(layers.GRU(3)(layers.Embedding(30, 4)(inp))))
    model.save(tmp_path / "m.keras")
    out = _cli("verify", str(tmp_path / "m.keras"), "--no-progress")
    assert out.returncode == 0 and "max abs error against Keras" in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.keras
def test_cli_verify_runs_its_reference_on_the_cpu():
    """verify's reference computes on the CPU whatever device Keras's torch backend would choose
    (CUDA where a GPU is visible, whose TF32 convolutions are no float32 reference). Keras told to
    use the meta device, which computes no values, shows which device the reference ran on."""
    fixture = os.path.join(ROOT, "tests", "fixtures", "data", "k3_functional.keras")
    out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "verify", fixture, "--no-progress"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "KERAS_BACKEND": "torch", "KERAS_TORCH_DEVICE": "meta"})
    assert out.returncode == 0 and "max abs error against Keras" in out.stdout, out.stdout + out.stderr[-2000:]


@pytest.mark.keras
def test_cli_verify_gives_keras_2_files_keras_2_hard_sigmoid(tmp_path):
    """A file written by Keras 2 with hard_sigmoid gates was trained with Keras 2's hard_sigmoid
    (clip(0.2x + 0.5)), which load_keras keeps; Keras 3, verify's reference, redefined it
    (clip(x / 6 + 0.5)). verify gives the reference Keras 2's function and says so; the
    conversion agrees with it. (A Keras 3 legacy .h5 whose writer version reads 2.2.4 stands in
    for the Keras 2 file.)"""
    import h5py

    inp = keras.Input((5, 3))
    h = layers.LSTM(4, recurrent_activation="hard_sigmoid", return_sequences=True)(inp)
    model = keras.Model(inp, layers.Dense(2, activation="hard_sigmoid")(h))
    rng = np.random.RandomState(6)
    model.set_weights([rng.uniform(-1.5, 1.5, w.shape).astype("float32") for w in model.get_weights()])
    path = tmp_path / "m.h5"
    model.save(path)
    with h5py.File(path, "r+") as f:
        f.attrs["keras_version"] = "2.2.4"
    out = _cli("verify", str(path), "--no-progress")
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "hard_sigmoid as Keras 2.2.4, which wrote the file, defined it" in out.stdout, out.stdout
    assert "; 2 activation(s))" in out.stdout, out.stdout


@pytest.mark.keras
def test_recurrent_activation_without_a_kernel_is_refused_by_name(tmp_path):
    """An activation the recurrent cells do not compute (softmax across the units) is refused
    with its name in the message, not cut off behind the list of the ones they do."""
    model = keras.Sequential([keras.Input((3, 2)), layers.LSTM(4, activation="softmax")])
    model.save(tmp_path / "m.keras")
    with pytest.raises(ConversionError, match="activation 'softmax' is not one the recurrent cells compute"):
        load_keras(tmp_path / "m.keras")


@pytest.mark.keras
def test_float64_models_convert_to_float64_and_take_either_float(tmp_path):
    """A float64 Keras model (keras.config.set_floatx) converts to float64 parameters by default
    and computes what Keras computes in float64; its floating inputs are cast on the way in, as
    Keras casts them to each layer's compute dtype, so float32 ones work too."""
    previous = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")  # (set_floatx alone is ignored once a layer has been built)
    try:
        inp = keras.Input((6, 3))
        h = layers.LSTM(4)(layers.Conv1D(3, 2, padding="same")(inp))
        gate = keras.ops.cast(keras.ops.greater(h, 0.0), "float32")  # an op's dtype is not a layer's
        model = keras.Model(inp, layers.Dense(2)(h * gate))
        rng = np.random.RandomState(8)
        model.set_weights([rng.uniform(-0.6, 0.6, w.shape) for w in model.get_weights()])
        x = rng.uniform(-1, 1, (2, 6, 3))
        expected = keras.ops.convert_to_numpy(model(x, training=False))
        model.save(tmp_path / "m.keras")
    finally:
        keras.config.set_floatx(previous[0])
        keras.config.set_dtype_policy(previous[1])
    ours = load_keras(tmp_path / "m.keras")
    assert {p.dtype for p in ours.parameters()} == {torch.float64}
    with torch.no_grad():
        # (1e-7: Keras's own float64 Dense on the torch backend is 1.5e-8 from float64 arithmetic here)
        np.testing.assert_allclose(ours(torch.as_tensor(x)).numpy(), expected, atol=1e-7, rtol=1e-7)
        np.testing.assert_allclose(ours(torch.as_tensor(x, dtype=torch.float32)).numpy(), expected, atol=1e-6)
        f32 = load_keras(tmp_path / "m.keras", dtype=torch.float32)
        assert f32(torch.as_tensor(x)).dtype == torch.float32  # a float64 input, cast to the parameters' dtype
        save_converted(ours, tmp_path / "m.pt")  # and the converted file keeps float64
        again = load_converted(tmp_path / "m.pt")
        assert {p.dtype for p in again.parameters()} == {torch.float64}
        torch.testing.assert_close(again(torch.as_tensor(x)), ours(torch.as_tensor(x)), rtol=0, atol=0)


@pytest.mark.keras
def test_bfloat16_layer_weights_load_as_their_exact_values(tmp_path):
    """Keras 3 stores a bfloat16 layer's variables as 2-byte opaque HDF5 data tagged
    dtype="bfloat16": they load widened to float32 (exact), the model computing in float32 what
    Keras computes in float32 with those values."""
    inp = keras.Input((6, 3))
    h = layers.LSTM(4, return_sequences=True, dtype="bfloat16", recurrent_initializer="glorot_uniform")(inp)
    model = keras.Model(inp, layers.Dense(2)(layers.GRU(3)(h)))
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "m.weights.h5")
    widened = [np.asarray(w).astype("float32") for w in model.get_weights()]
    inp = keras.Input((6, 3))
    h = layers.LSTM(4, return_sequences=True)(inp)
    twin = keras.Model(inp, layers.Dense(2)(layers.GRU(3)(h)))
    twin.set_weights(widened)
    x = np.random.RandomState(9).uniform(-1, 1, (2, 6, 3)).astype("float32")
    expected = keras.ops.convert_to_numpy(twin(x, training=False))
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.weights.h5", str(tmp_path / "m.keras"))):
        ours = load_keras(path, architecture=arch)
        lstm_kernel = next(p for n, p in ours.named_parameters() if "lstm" in n)
        assert lstm_kernel.dtype == torch.float32 and (lstm_kernel.detach().to(torch.bfloat16).float() == lstm_kernel).all()
        with torch.no_grad():
            np.testing.assert_allclose(ours(torch.as_tensor(x)).numpy(), expected, atol=1e-5, rtol=1e-5,
                                       err_msg=path.name)


@pytest.mark.keras
@pytest.mark.parametrize("activation", ["relu", "hard_shrink", "soft_shrink"])
@pytest.mark.parametrize("kind", ["SimpleRNN", "LSTM"])
def test_nan_inputs_stay_nan_through_piecewise_activations(kind, activation, tmp_path):
    """A NaN reaching a recurrent layer whose activations are piecewise comes out NaN wherever
    Keras's does (every comparison with NaN is false, so the branch it takes must be x). The LSTM
    uses the activation for its gates too: a sigmoid gate would carry the NaN on its own."""
    extra = {"recurrent_activation": activation} if kind == "LSTM" else {}
    model = keras.Sequential([keras.Input((4, 3)), getattr(layers, kind)(5, activation=activation,
                                                                       return_sequences=True, **extra)])
    rng = np.random.RandomState(10)
    model.set_weights([rng.uniform(-0.8, 0.8, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, (2, 4, 3)).astype("float32")
    x[0, 1, 2] = np.nan
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    assert np.isnan(expected).any() and not np.isnan(expected).all()
    model.save(tmp_path / "m.keras")
    with torch.no_grad():
        got = load_keras(tmp_path / "m.keras")(torch.as_tensor(x)).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5, equal_nan=True)


@pytest.mark.keras
def test_float_ids_reach_the_embedding_uncast(tmp_path):
    """Float ids are not cast to the parameters' dtype (Keras's Embedding casts nothing): a model
    moved to bfloat16 looks up rows 257, 511 and 998 (bfloat16 would round them to 256, 512 and
    1000), the rows Keras's float32 model returns, rounded to bfloat16."""
    model = keras.Sequential([keras.Input((3,)), layers.Embedding(1000, 2), layers.Flatten()])
    x = np.array([[257.0, 511.0, 998.0]], dtype="float32")
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras").to(torch.bfloat16)
    with torch.no_grad():
        got = ours(torch.as_tensor(x))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), torch.as_tensor(expected).bfloat16().float(), rtol=0, atol=0)


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_a_model_saved_before_it_was_built_is_refused_as_such(tmp_path, suffix):
    """Keras saves a Sequential model that never ran or was given no input shape without any
    weights (it creates them on the first call): nothing trained to convert, said so."""
    model = keras.Sequential([layers.Embedding(50, 4), layers.LSTM(3), layers.Dense(2)])
    path = tmp_path / f"unbuilt{suffix}"
    model.save(path)
    with pytest.raises(ConversionError, match="holds no weights at all: the model was saved before it was built"):
        load_keras(path)


def test_relu_slope_named_alpha_as_keras_2_0_wrote_it(tmp_path):
    """Keras 2.0's files name ReLU's negative slope `alpha` (its backend's relu(x, alpha,
    max_value)); read as negative_slope, the outputs are Keras's."""
    import h5py

    model = keras.Sequential([keras.Input((5, 3)), layers.LSTM(4, return_sequences=True),
                              layers.ReLU(negative_slope=0.2, max_value=0.5)])
    path = tmp_path / "relu.h5"
    model.save(path)
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        relu = [l for l in config["config"]["layers"] if l["class_name"] == "ReLU"][0]["config"]
        relu["alpha"] = relu.pop("negative_slope")
        f.attrs["model_config"] = json.dumps(config)
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32") * 3
    expected = keras.ops.convert_to_numpy(model(x))
    assert (expected < 0).any()
    with torch.no_grad():
        np.testing.assert_allclose(load_keras(path)(torch.as_tensor(x)).numpy(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_and_bool_inputs_of_float_layers(dtype, tmp_path):
    """Integer or bool features fed straight into layers with float weights: Keras's matmul
    promotes them (Dense, the recurrent layers, Bidirectional, TimeDistributed(Dense),
    BatchNormalization, PReLU, UnitNormalization; the means of GlobalAveragePooling1D and Average:
    float32 outputs), LayerNormalization computes in the input's dtype and casts
    to float32. The converted model failed to load on these ("expected m1 and m2 to have the same
    dtype", "mean(): could not infer output dtype") and gave LayerNormalization's result as int32."""
    rng = np.random.RandomState(11)
    seq, flat = keras.Input((5, 2), dtype=dtype), keras.Input((6,), dtype=dtype)
    outputs = [layers.Dense(3)(flat), layers.LSTM(3)(seq), layers.GRU(3)(seq), layers.SimpleRNN(3)(seq),
               layers.Bidirectional(layers.LSTM(2))(seq), layers.RNN(layers.LSTMCell(2))(seq),
               layers.TimeDistributed(layers.Dense(2))(seq), layers.BatchNormalization()(flat),
               layers.LayerNormalization()(flat), layers.UnitNormalization()(flat),
               layers.GlobalAveragePooling1D()(seq)]
    if dtype != "bool":  # (Keras's relu takes no bool; its Average adds bools as logical or)
        outputs += [layers.PReLU()(flat), layers.Average()([flat, flat])]
    model = keras.Model([seq, flat], outputs)
    model.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32") if "variance" in v.path
                       else rng.uniform(-0.8, 0.8, w.shape).astype("float32")
                       for w, v in zip(model.get_weights(), model.weights)])
    model.save(tmp_path / "m.keras")
    xs = [rng.randint(-3, 4, size=(3, 5, 2)), rng.randint(-3, 4, size=(3, 6))]
    xs = [x.astype(dtype) if dtype != "bool" else x > 0 for x in xs]
    expected = [keras.ops.convert_to_numpy(y) for y in model(xs)]
    converted = load_keras(str(tmp_path / "m.keras"))
    with torch.no_grad():
        got = converted(*[torch.from_numpy(x) for x in xs])
    assert len(got) == len(expected)
    for j, (g, e) in enumerate(zip(got, expected)):
        assert e.dtype == np.float32 and g.dtype == torch.float32, f"output {j}: {g.dtype}, Keras {e.dtype}"
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=f"output {j}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_a_model_without_weights_computes_in_float32(dtype, tmp_path):
    """A graph without weights (merges, pooling, softmax, normalisation) given float16, bfloat16
    or float64 tensors: Keras casts them to the layers' float32 and returns float32 (the converted
    model computed in the input's precision: 1e-4 to 4e-3 away in half precision, and
    UnitNormalization of a float16 input overflowed)."""
    a, b = keras.Input((5, 4), dtype=dtype), keras.Input((5, 4), dtype=dtype)
    outputs = [layers.Add()([a, b]), layers.GlobalAveragePooling1D()(a), layers.Softmax()(b),
               layers.UnitNormalization()(a), layers.Dot(axes=2)([a, b])]
    model = keras.Model([a, b], outputs)
    model.save(tmp_path / "m.keras")
    rng = np.random.RandomState(4)
    xs = [torch.from_numpy(rng.uniform(-3, 3, (2, 5, 4)).astype("float32")).to(getattr(torch, dtype))
          for _ in range(2)]
    expected = [keras.ops.convert_to_numpy(y) for y in model(xs)]
    converted = load_keras(str(tmp_path / "m.keras"))
    got = converted(*xs)
    for j, (g, e) in enumerate(zip(got, expected)):
        assert e.dtype == np.float32 and g.dtype == torch.float32, f"output {j}: {g.dtype}, Keras {e.dtype}"
        np.testing.assert_allclose(g.numpy(), e, rtol=1e-5, atol=1e-5, err_msg=f"output {j}")
    assert converted.double()(*xs)[0].dtype == torch.float64  # (.double() still moves the compute dtype)


def _quantizable(rng):
    """Embedding(mask_zero) -> LSTM -> EinsumDense (an output axis the input lacks) -> EinsumDense
    (two summed axes) and Dense, random weights; and padded ids."""
    ids = keras.Input((T,), dtype="int32")
    h = layers.Embedding(30, 8, mask_zero=True)(ids)
    h = layers.LSTM(6, return_sequences=True)(h)
    heads = layers.EinsumDense("btd,dhe->bhte", output_shape=(2, T, 4), bias_axes="he", activation="tanh")(h)
    pooled = layers.EinsumDense("bhte,hef->btf", output_shape=(T, 5), bias_axes="f")(heads)
    summed = layers.EinsumDense("btd,tde->be", output_shape=(3,))(h)
    out = layers.Dense(3)(layers.Concatenate()([layers.GlobalMaxPooling1D()(pooled), summed]))
    model = keras.Model(ids, out)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.randint(1, 30, size=(B, T)).astype("int32")
    x[1, 5:] = 0
    return model, x


QUANTIZE = [("int8", {}), ("int8", {"activation_quantizer": None}), ("int4", {}), ("int4", {"block_size": -1}),
            ("int4", {"block_size": 3}), ("int4", {"block_size": -1, "activation_quantizer": "default"}),
            ("float8", None)]


@pytest.mark.keras
@pytest.mark.parametrize("mode,options", QUANTIZE, ids=[f"{m}-{o}" for m, o in QUANTIZE])
def test_models_keras_quantized_compute_as_keras(mode, options, tmp_path):
    """A model Keras 3 quantized (model.quantize: int8 with its inputs quantized per row or weights
    only, int4 per output or in groups, float8) computes what Keras computes from the .keras file
    and from a legacy .h5 (its variables in another order), within 1e-5, where the float model is
    1e-3 or more away; saved by save_converted / save_keras, it loads back to the same numbers.
    Oracle: the quantized Keras model (which its .keras file loads back to exactly)."""
    from keras.quantizers import AbsMaxQuantizer, Int4QuantizationConfig, Int8QuantizationConfig

    model, x = _quantizable(np.random.RandomState(7))
    floats = keras.ops.convert_to_numpy(model(x))
    if options is not None:
        options = {k: AbsMaxQuantizer() if v == "default" else v for k, v in options.items()}
        config = (Int8QuantizationConfig if mode == "int8" else Int4QuantizationConfig)(**options)
    model.quantize(mode, config=None if options is None else config)
    expected = keras.ops.convert_to_numpy(model(x))
    assert np.abs(expected - floats).max() > 1e-3  # (the test tells the quantized from the float model)
    model.save(tmp_path / "q.keras")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(keras.models.load_model(tmp_path / "q.keras")(x)), expected)
    model.save(tmp_path / "q.h5")  # (Keras cannot load this .h5 back: its mask operation, float8's scalars)
    for ext in ("keras", "h5"):
        converted = load_keras(str(tmp_path / f"q.{ext}"))
        np.testing.assert_allclose(converted(torch.as_tensor(x)).detach().numpy(), expected, rtol=1e-5, atol=1e-5,
                                   err_msg=ext)
    save_converted(converted, tmp_path / "q.pt")
    np.testing.assert_allclose(load_converted(str(tmp_path / "q.pt"))(torch.as_tensor(x)).detach().numpy(), expected,
                               rtol=1e-5, atol=1e-5)
    cudnn_rnn.save_keras(load_keras(str(tmp_path / "q.keras")), tmp_path / "back.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(keras.models.load_model(tmp_path / "back.keras")(x)), expected,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.keras
@pytest.mark.parametrize("mode", ["int8", "int4", "float8"])
def test_a_quantized_layer_in_time_distributed_computes_as_keras(mode, tmp_path):
    """TimeDistributed(Dense) quantized: Keras 3's TimeDistributed runs the wrapped layer's float
    call, on its integer kernel without the scales (float8: the float kernel as it is), which the
    converted model reproduces (within 1e-5 relative of Keras's outputs, which the quantized
    product would miss by far). (Keras on torch cannot run a quantized EinsumDense there: its
    einsum of float inputs and an integer kernel fails.)"""
    rng = np.random.RandomState(3)
    inp = keras.Input((T, 6))
    h = layers.TimeDistributed(layers.Dense(4, name="d"))(inp)
    out = layers.TimeDistributed(layers.Dense(3, activation="tanh", name="e"))(h)
    model = keras.Model(inp, out)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    model.quantize(mode)
    model.save(tmp_path / "td.keras")
    x = rng.uniform(-1, 1, (B, T, 6)).astype("float32")
    expected = keras.ops.convert_to_numpy(keras.models.load_model(tmp_path / "td.keras")(x))
    np.testing.assert_allclose(load_keras(str(tmp_path / "td.keras"))(torch.as_tensor(x)).detach().numpy(), expected,
                               rtol=1e-5, atol=1e-5)


REVERSIBLE = [(True, None, None, None), (False, None, None, "bfloat16"), (True, "int8", {}, None),
              (False, "int8", {"activation_quantizer": None}, None), (False, "int4", {}, None),
              (True, "int4", {"block_size": 3}, None), (False, "int4", {"block_size": -1, "activation_quantizer": "default"},
                                                       None), (True, "int4", {"block_size": -1}, None)]


@pytest.mark.keras
@pytest.mark.parametrize("tie,mode,options,reverse_dtype", REVERSIBLE,
                         ids=[f"tie{t}-{m}-{o}-{r}" for t, m, o, r in REVERSIBLE])
def test_one_reversible_embedding_embeds_and_projects_back(tie, mode, options, reverse_dtype, tmp_path):
    """One ReversibleEmbedding called twice, looking ids up and (reverse=True) projecting an LSTM's
    outputs back to logits, as language models use it: float (its reverse product in reverse_dtype
    where given), and quantized by Keras 3 in int8 / int4 (per output or in groups, its inputs
    quantized or not; tied or with its own reverse kernel), from the .keras file and a legacy .h5;
    within 1e-6 of Keras (reverse_dtype: exactly its bfloat16 logits), and back through
    save_converted and save_keras. The quantized layer's lookups carry no mask, as in Keras."""
    from keras.quantizers import AbsMaxQuantizer, Int4QuantizationConfig, Int8QuantizationConfig

    rng = np.random.RandomState(17)
    ids = keras.Input((T,), dtype="int32")
    emb = layers.ReversibleEmbedding(20, 6, tie_weights=tie, mask_zero=True, logit_soft_cap=None if tie else 2.0,
                                     reverse_dtype=reverse_dtype)
    model = keras.Model(ids, emb(layers.LSTM(6, return_sequences=True)(emb(ids)), reverse=True))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    if mode is not None:
        floats_model = keras.ops.convert_to_numpy(model(np.ones((1, T), "int32")))
        options = {k: AbsMaxQuantizer() if v == "default" else v for k, v in options.items()}
        model.quantize(mode, config=(Int8QuantizationConfig if mode == "int8" else Int4QuantizationConfig)(**options))
        assert np.abs(keras.ops.convert_to_numpy(model(np.ones((1, T), "int32"))) - floats_model).max() > 1e-3
    x = rng.randint(1, 20, size=(B, T)).astype("int32")
    x[1, 5:] = 0
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "r.keras")
    model.save(tmp_path / "r.h5")
    for ext in ("keras", "h5"):
        converted = load_keras(str(tmp_path / f"r.{ext}"))
        got = converted(torch.as_tensor(x)).detach()
        assert str(got.dtype) == f"torch.{expected.dtype}", ext
        np.testing.assert_allclose(got.float().numpy(), expected.astype("float32"), rtol=1e-6, atol=1e-6, err_msg=ext)
    save_converted(converted, tmp_path / "r.pt")
    again = load_converted(str(tmp_path / "r.pt"))(torch.as_tensor(x)).detach().float().numpy()
    np.testing.assert_allclose(again, expected.astype("float32"), rtol=1e-6, atol=1e-6)
    cudnn_rnn.save_keras(converted, tmp_path / "back.keras")
    back = keras.ops.convert_to_numpy(keras.models.load_model(tmp_path / "back.keras")(x))
    np.testing.assert_allclose(back.astype("float32"), expected.astype("float32"), rtol=1e-6, atol=1e-6)


@pytest.mark.keras
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_reversible_embedding_projects_another_float_type_as_keras(dtype, tmp_path):
    """A reverse call on a bfloat16 / float16 tensor against the float32 table: Keras's matmul
    computes it in float32 (the types' common one); so does the converted layer, within 1e-6."""
    rng = np.random.RandomState(23)
    ids = keras.Input((T,), dtype="int32")
    emb = layers.ReversibleEmbedding(9, 4)
    model = keras.Model(ids, emb(keras.ops.cast(emb(ids), dtype), reverse=True))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.randint(0, 9, size=(B, T)).astype("int32")
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    got = load_keras(str(tmp_path / "m.keras"))(torch.as_tensor(x)).detach()
    assert got.dtype == torch.float32 and expected.dtype == np.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_a_layer_quantized_otherwise_is_refused_by_name(tmp_path):
    """A layer quantized in a mode nothing here computes (a mode name of a later Keras, written
    into an int8 Dense's policy) is refused in one line naming the layer, its mode and what
    converts."""
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, name="dense")])
    model.quantize("int8")
    model.save(tmp_path / "q.keras")
    with zipfile.ZipFile(tmp_path / "q.keras") as z:
        members = {name: z.read(name) for name in z.namelist()}
    config = json.loads(members["config.json"])
    (dense,) = [layer for layer in config["config"]["layers"] if layer["config"]["name"] == "dense"]
    dense["config"]["dtype"]["config"]["mode"] = "nf4"
    members["config.json"] = json.dumps(config).encode()
    with zipfile.ZipFile(tmp_path / "later.keras", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with pytest.raises(ConversionError, match=r"layer 'dense': the layer is quantized by Keras \(nf4\).*int8 and int4 "
                                              r"Dense, EinsumDense, Embedding.*before model.quantize\(\)"):
        load_keras(str(tmp_path / "later.keras"))


@pytest.mark.keras
def test_onnx_names_inputs_and_outputs_as_keras_names_them(tmp_path):
    """An .onnx file of a converted model names its inputs by their keys and its outputs as Keras
    names them, where torch named values inside the graph the same ("conv1d", "linear", "add",
    "softmax": layers, inputs and keys named after torch's ops): those are renamed, the graph
    passes onnx's full check and onnxruntime computes Keras's outputs fed and read by name."""
    import onnx
    import onnxruntime as ort

    import cudnn_rnn.onnx

    rng = np.random.RandomState(5)
    a, b = keras.Input((6, 4), name="add"), keras.Input((3,), name="linear")
    h = layers.LSTM(4, name="lstm")(layers.Conv1D(5, 3, name="conv1d")(a))
    out = layers.Add(name="add_1")([layers.Dense(3, name="matmul")(h), layers.Dense(3, name="linear_1")(b)])
    model = keras.Model({"x": a, "y": b}, {"softmax": layers.Softmax(name="softmax")(out), "conv1d": [h, out]})
    xa, xb = rng.uniform(-1, 1, (2, 6, 4)).astype("float32"), rng.uniform(-1, 1, (2, 3)).astype("float32")
    expected = model({"x": xa, "y": xb})
    model.save(tmp_path / "m.keras")
    converted = load_keras(str(tmp_path / "m.keras"))
    assert converted.io_names() == (["x", "y"], ["softmax", "conv1d/0", "conv1d/1"])
    cudnn_rnn.onnx.export(converted, (torch.as_tensor(xa), torch.as_tensor(xb)), tmp_path / "m.onnx")
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")), full_check=True)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    assert [o.name for o in session.get_outputs()] == ["softmax", "conv1d/0", "conv1d/1"]
    got = session.run(["conv1d/1", "softmax", "conv1d/0"], {"y": xb, "x": xa})
    for g, e in zip(got, [expected["conv1d"][1], expected["softmax"], expected["conv1d"][0]]):
        np.testing.assert_allclose(g, keras.ops.convert_to_numpy(e), rtol=1e-5, atol=1e-6)


@pytest.mark.keras
def test_inputs_as_a_dict_or_a_list_as_keras_takes_them(tmp_path):
    """A model built on dicts (keys other than the Input names, not in sorted order) takes a dict
    by those keys (by position: sorted by key, Keras's model.inputs, which the exported program
    follows) and returns a dict of its outputs by Keras's keys (output_keys: the config's
    order), each Keras's, also exported (.pt2; .onnx with its inputs and outputs named by those
    keys) and in `cudnn-rnn verify`; a model built on a list
    takes a dict by Input names, or one list; a dict without a key is refused naming it."""
    z = keras.Input((5, 4), name="zeta")
    a = keras.Input((3,), name="alpha")
    seq = layers.LSTM(6, name="lstm")(z)
    both = layers.Dense(2, name="head")(layers.Concatenate()([seq, a]))
    rng = np.random.RandomState(5)
    xz, xa = rng.uniform(-1, 1, (2, 5, 4)).astype("float32"), rng.uniform(-1, 1, (2, 3)).astype("float32")

    keyed = keras.Model({"z_in": z, "a_in": a}, {"y_head": both, "y_seq": seq})
    keyed.save(tmp_path / "keyed.keras")
    expected = {k: keras.ops.convert_to_numpy(v) for k, v in keyed({"z_in": xz, "a_in": xa}).items()}
    converted = load_keras(str(tmp_path / "keyed.keras"))
    assert converted.input_keys == ["a_in", "z_in"] and converted.output_keys == ["y_head", "y_seq"]
    got = converted({"a_in": torch.from_numpy(xa), "z_in": xz, "unused": 0})
    assert isinstance(got, dict) and list(got) == ["y_head", "y_seq"]
    for key, g in got.items():
        np.testing.assert_allclose(g.detach().numpy(), expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
    out = _cli("convert", str(tmp_path / "keyed.keras"), str(tmp_path / "keyed.pt2"), "--no-progress")
    assert out.returncode == 0, out.stderr
    exported = torch.export.load(str(tmp_path / "keyed.pt2")).module()(torch.from_numpy(xa), torch.from_numpy(xz))
    assert list(exported) == ["y_head", "y_seq"]
    for key, g in exported.items():
        np.testing.assert_allclose(g.detach().numpy(), expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
    out = _cli("verify", str(tmp_path / "keyed.keras"), "--no-progress")
    assert out.returncode == 0 and "over 2 output(s)" in out.stdout, out.stdout + out.stderr
    out = _cli("convert", str(tmp_path / "keyed.keras"), str(tmp_path / "keyed.onnx"), "--no-progress")
    assert out.returncode == 0, out.stderr
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "keyed.onnx"))  # inputs in input_keys' order, outputs in the dict's
    assert [i.name for i in session.get_inputs()] == ["a_in", "z_in"]
    assert [o.name for o in session.get_outputs()] == ["y_head", "y_seq"]
    for key, g in zip(["y_head", "y_seq"], session.run(None, {"z_in": xz, "a_in": xa})):
        np.testing.assert_allclose(g, expected[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert [t.name for t in keyed.inputs] == ["alpha", "zeta"]  # (Keras's own positional order)
    with pytest.raises(ValueError, match=r"takes a dict with the keys 'a_in', 'z_in'; the one given lacks 'a_in'"):
        converted({"z_in": xz, "alpha": xa})

    listed = keras.Model([z, a], both)
    listed.save(tmp_path / "listed.keras")
    expected = keras.ops.convert_to_numpy(listed({"alpha": xa, "zeta": xz}))
    converted = load_keras(str(tmp_path / "listed.keras"))
    assert converted.input_keys == ["zeta", "alpha"] and converted.output_keys is None
    for got in (converted({"alpha": xa, "zeta": xz}), converted([xz, xa]), converted((xz, xa)), converted(xz, xa)):
        np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.keras
def test_sharded_weights_of_a_trained_model(tmp_path):
    """A trained model's sharded weights (save_weights(.weights.json, max_shard_size=...) after
    fit): the optimizer's variables fill shards of their own, which hold no layers; the layers'
    shards convert to Keras's outputs (the optimizer's shards are not read)."""
    i = keras.Input((None, 4))
    model = keras.Model(i, layers.Dense(2)(layers.LSTM(8)(i)))
    rng = np.random.RandomState(6)
    x = rng.uniform(-1, 1, (4, 5, 4)).astype("float32")
    model.compile("adam", "mse")
    model.fit(x, np.zeros((4, 2), "float32"), epochs=1, verbose=0)
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "m.weights.json", max_shard_size=2e-6)
    weight_map = json.loads((tmp_path / "m.weights.json").read_text())["weight_map"]
    layer_shards = {n for k, names in weight_map.items() if not k.lstrip("/").startswith("optimizer") for n in names}
    assert set(weight_map["/optimizer/vars"]) - layer_shards  # (a shard of optimizer variables only)
    ours = load_keras(tmp_path / "m.weights.json", architecture=str(tmp_path / "m.keras"))
    with torch.no_grad():
        np.testing.assert_allclose(ours(x).numpy(), keras.ops.convert_to_numpy(model(x)), atol=1e-5, rtol=1e-5)
