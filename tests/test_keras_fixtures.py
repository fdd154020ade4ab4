"""Checkpoints written by real Keras 3 (on TensorFlow 2.21; k3jax_* on JAX 0.10.2), tf.keras 2.21
(its .h5, .keras, SavedModel directories and TensorFlow weights checkpoints) and tf_keras's CuDNN
layers (made by
tests/fixtures/make_fixtures.py) load without TensorFlow or Keras and reproduce the outputs those
frameworks computed, within 1e-5."""
import json
import os

import numpy as np
import pytest
import torch

import cudnn_rnn
from cudnn_rnn.keras import ConversionError, load_converted, load_keras, save_converted
from cudnn_rnn.keras.graph.model import layer_name

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data")

CASES = [
    ("k3_sequential", "k3_sequential.keras", None),
    ("k3_sequential", "k3_sequential.h5", None),
    ("k3_sequential", "k3_sequential.weights.h5", "k3_sequential.keras"),
    ("k3_functional", "k3_functional.keras", None),
    ("k3_functional", "k3_functional.h5", None),
    ("tfk_sequential", "tfk_sequential.h5", None),
    ("tfk_sequential", "tfk_sequential.keras", None),
    ("tfk_sequential", "tfk_sequential_weights.h5", "tfk_sequential.json"),
    ("tfk_functional", "tfk_functional.h5", None),
    ("tfk_cudnn", "tfk_cudnn.h5", None),
    ("tfk_nested", "tfk_nested.h5", None),
    ("tfk_sequential_of_models", "tfk_sequential_of_models.h5", None),  # Keras 2.2's form: the first model declares
    ("tfk_tf_op_layer", "tfk_tf_op_layer.h5", None),  # tf.keras 2.0-2.3's TensorFlowOpLayer (raw graph nodes)
    ("tfk_tf_op_layer_free", "tfk_tf_op_layer_free.h5", None),  # its Reshape holding a free time axis to 10 steps
    ("tfk_bicubic", "tfk_bicubic.h5", None),
    ("tfk_bicubic", "tfk_bicubic.keras", None),
    ("k3_bicubic", "k3_bicubic.h5", None),
    ("k3jax_image", "k3jax_image.h5", None),
    ("k3_clahe", "k3_clahe.h5", None),
    ("k3jax_clahe", "k3jax_clahe.h5", None),
    ("tfk_frame_cnn", "tfk_frame_cnn.h5", None),
    ("tfk_frame_cnn", "tfk_frame_cnn.keras", None),
    ("k3_frame_cnn", "k3_frame_cnn.h5", None),
    ("k3_frame_cnn", "k3_frame_cnn.keras", None),
    ("tfk_rnn_cells", "tfk_rnn_cells.h5", None),
    ("tfk_rnn_cells", "tfk_rnn_cells.keras", None),
    ("tfk_attention", "tfk_attention.h5", None),
    ("tfk_attention", "tfk_attention.keras", None),
    ("tfk_conv_lstm", "tfk_conv_lstm.h5", None),
    ("tfk_conv_lstm", "tfk_conv_lstm.keras", None),
    ("tfk_tf_ops", "tfk_tf_ops.h5", None),
    ("tfk_layers", "tfk_layers.h5", None),
    ("tfk_layers", "tfk_layers.keras", None),
    ("k3_lookup", "k3_lookup.keras", None),
    ("k3_unroll", "k3_unroll.keras", None),
    ("k3_unroll", "k3_unroll.h5", None),
    ("tfk_unroll", "tfk_unroll.h5", None),
    ("k3_reversed_slices", "k3_reversed_slices.keras", None),
    ("tfk_stacked_states", "tfk_stacked_states.h5", None),
    ("tfk_stacked_states", "tfk_stacked_states.weights.h5", "tfk_stacked_states.json"),
    ("tfk_stacked_states", "tfk_stacked_states.weights.h5", "tfk_stacked_states.h5"),
    ("tfk_masks", "tfk_masks.h5", None),
    ("tfk_masks", "tfk_masks.keras", None),
    ("tfk_more_tf_ops", "tfk_more_tf_ops.h5", None),
    ("tfk_more_tf_ops", "tfk_more_tf_ops.keras", None),
    ("tfk_unit_norm", "tfk_unit_norm.h5", None),
    ("tfk_int_inputs", "tfk_int_inputs.h5", None),
    ("tfk_random_crop", "tfk_random_crop.h5", None),
    ("k3_applications_layers", "k3_applications_layers.keras", None),
    ("k3_applications_layers", "k3_applications_layers.h5", None),
    ("tfk_applications_layers", "tfk_applications_layers.h5", None),
    ("tfk_applications_layers", "tfk_applications_layers.keras", None),
    ("k3_operations", "k3_operations.keras", None),
    ("k3_operations", "k3_operations.h5", None),
    ("k3_updates_transforms", "k3_updates_transforms.keras", None),
    ("k3_updates_transforms", "k3_updates_transforms.h5", None),
    ("k3_resampling", "k3_resampling.keras", None),
    ("tfk_pinned_batch", "tfk_pinned_batch.h5", None),
    ("tfk_tf_calls", "tfk_tf_calls.h5", None),
    ("tfk_tf_calls", "tfk_tf_calls.keras", None),
    ("tfk_tf_gathers_losses", "tfk_tf_gathers_losses.h5", None),
    ("tfk_tf_gathers_losses", "tfk_tf_gathers_losses.keras", None),
    # tf.keras 2's TensorFlow formats: SavedModel directories (with and without traced
    # functions), a file at a SavedModel's top, a weights checkpoint by prefix and by .index
    ("tfk_saved_model", "tfk_saved_model", None),
    ("tfk_saved_model", "tfk_saved_model/keras_metadata.pb", None),
    ("tfk_frame_cnn_saved_model", "tfk_frame_cnn_saved_model", None),
    ("tfk_frame_cnn_saved_model", "tfk_frame_cnn_saved_model_pre25", None),  # TensorFlow < 2.5's layout
    ("tfk_frame_cnn_saved_model", "tfk_frame_cnn_ckpt/ckpt", "tfk_frame_cnn_saved_model"),
    ("tfk_frame_cnn_saved_model", "tfk_frame_cnn_ckpt/ckpt.index", "tfk_frame_cnn_saved_model"),
    # tf.train.CheckpointManager of Checkpoint(step=..., model=..., optimizer=...) after training
    ("tfk_step_ckpt", "tfk_step_ckpt/ckpt-1", "tfk_step_ckpt.json"),
    ("tfk_layer_names", "tfk_layer_names.h5", None),
    ("tfk_causal_separable", "tfk_causal_separable.h5", None),  # SeparableConv1D(padding="causal")
    ("tfk_attention_axes", "tfk_attention_axes.h5", None),  # MultiHeadAttention over other axes
    ("k3_nested_dicts", "k3_nested_dicts.keras", None),
    ("tfk_nested_dicts", "tfk_nested_dicts.h5", None),
    ("k3_quantized", "k3_quantized.keras", None),  # int8 / int4 / float8 layers Keras's quantize() rewrote
    ("tfk_locally_connected", "tfk_locally_connected.h5", None),  # LocallyConnected1D / 2D (implementations 1, 2)
    ("tfk_time_major", "tfk_time_major.h5", None),  # time_major=True layers; BatchNormalization(renorm=True)
    ("tfk_lookup_saved_model", "tfk_lookup_saved_model", None),  # constructor vocabularies in a SavedModel
    ("tfk_stateful_saved_model", "tfk_stateful_saved_model", None),  # from the states it kept (its first call)
    # older Keras 3 releases' files (tests/fixtures/make_older_keras_fixtures.py): keras.ops
    # arguments recorded in the call (3.0-3.10), int4 kernels packed along the summed axis (3.11-3.13)
    ("k3.9.2_ops_call_args", "k3.9.2_ops_call_args.keras", None),
    ("k3.13.2_int4_row_packed", "k3.13.2_int4_row_packed.keras", None),
    # tf.keras 2.13's .keras / .weights.h5 numbering (a class's weighted layers counted twice)
    ("tfk2.13.1_numbering", "tfk2.13.1_numbering.keras", None),
    ("tfk2.13.1_numbering", "tfk2.13.1_numbering.weights.h5", "tfk2.13.1_numbering.keras"),
]

# Outputs in which Keras computes NaN on purpose: tf.keras 2's masked GlobalAveragePooling1D
# multiplies an infinity at a masked step by 0
EXPECTED_NAN = {("tfk_masks", 3)}


def _architecture(name):
    if name is None:
        return None
    path = os.path.join(DATA, name)
    if name.endswith(".json"):
        with open(path) as f:
            return f.read()
    return path


def _flat(out) -> list:
    """Outputs nested in dicts and lists, flat in their own order (make_fixtures.py stores them so)."""
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _flat(v)]
    return [out]


@pytest.mark.parametrize("fixture,filename,architecture", CASES, ids=[c[1] for c in CASES])
def test_fixture_matches_keras(fixture, filename, architecture):
    data = np.load(os.path.join(DATA, f"{fixture}.npz"))
    inputs = [data[k] if data[k].dtype.kind in "US" else torch.as_tensor(data[k])  # (strings as numpy arrays)
              for k in sorted(k for k in data.files if k.startswith("input_"))]
    expected = [data[k] for k in sorted((k for k in data.files if k.startswith("output_")), key=lambda s: int(s.split("_")[1]))]
    model = load_keras(os.path.join(DATA, filename), architecture=_architecture(architecture))
    with torch.no_grad():
        out = model(*inputs)
    if isinstance(out, dict):  # a model built with a dict of outputs: keyed as Keras keys them
        assert list(out) == model.output_keys
    out = _flat(out)
    assert len(out) == len(expected)
    for i, (a, b) in enumerate(zip(out, expected)):
        assert tuple(a.shape) == b.shape, f"output {i}"
        if b.dtype.kind in "iub":  # integer and bool outputs in Keras's dtype
            assert str(a.dtype) == f"torch.{b.dtype}", f"output {i} of {filename}: {a.dtype}, Keras {b.dtype}"
        a, nan = a.numpy(), np.isnan(b)
        if (fixture, i) in EXPECTED_NAN:  # NaN where Keras computes NaN, and only there
            assert nan.any() and (np.isnan(a) == nan).all(), f"output {i} of {filename}: NaN at other places"
            a, b = a[~nan], b[~nan]
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=f"output {i} of {filename}")


def test_stateful_layers_continue_from_the_states_a_saved_model_kept(tmp_path):
    """A tf.keras 2.21 SavedModel of stateful layers (LSTM, Bidirectional GRU, RNN over stacked
    LSTM / LSTM / GRU cells, ConvLSTM2D, a GRU in a nested Sequential) keeps the states they had
    when saved: tf.keras's loaded model starts from them, and so does the converted one (its
    first call, the fixture test), carries them on (its second call), and reset_states() starts
    it over as Keras's does. The kept states follow .double(), and a model save_converted wrote
    reloads starting from them."""
    path = os.path.join(DATA, "tfk_stateful_saved_model")
    data = np.load(path + ".npz")
    inputs = [torch.as_tensor(data["input_0"]), torch.as_tensor(data["input_1"])]
    model = load_keras(path)
    assert sorted(model.keras_states) == ["bidirectional", "conv_lstm2d", "inner/gru_1", "lstm", "rnn"]
    with torch.no_grad():
        for tag in ("output", "second"):
            for j, got in enumerate(model(*inputs)):
                np.testing.assert_allclose(got.numpy(), data[f"{tag}_{j}"], rtol=1e-5, atol=1e-6, err_msg=f"{tag} {j}")
        model.reset_states()
        for j, got in enumerate(model(*inputs)):
            np.testing.assert_allclose(got.numpy(), data[f"fresh_{j}"], rtol=1e-5, atol=1e-6, err_msg=f"fresh {j}")
        double = load_keras(path).double()
        for j, got in enumerate(double(*[x.double() for x in inputs])):
            assert got.dtype == torch.float64
            np.testing.assert_allclose(got.numpy(), data[f"output_{j}"], rtol=1e-5, atol=1e-6, err_msg=f"double {j}")
        save_converted(load_keras(path), tmp_path / "m.pt")
        for j, got in enumerate(load_converted(str(tmp_path / "m.pt"))(*inputs)):
            np.testing.assert_allclose(got.numpy(), data[f"output_{j}"], rtol=1e-5, atol=1e-6, err_msg=f"reloaded {j}")


def test_convert_exports_a_stateful_saved_model_from_zero_states(tmp_path, capsys):
    """`cudnn-rnn convert` of a SavedModel whose stateful layers kept states says the program
    starts every call from zero states, and it does (the kept states are not traced in): the
    program computes tf.keras's outputs after reset_states(), within 1e-6."""
    from cudnn_rnn.cli import main

    path = os.path.join(DATA, "tfk_stateful_saved_model")
    data = np.load(path + ".npz")
    assert main(["convert", "--no-progress", path, str(tmp_path / "m.pt2")]) == 0
    assert "start every call from zero states" in capsys.readouterr().err
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    for j, got in enumerate(program(torch.as_tensor(data["input_0"]), torch.as_tensor(data["input_1"]))):
        np.testing.assert_allclose(got.detach().numpy(), data[f"fresh_{j}"], rtol=1e-5, atol=1e-6, err_msg=f"{j}")


def test_saved_states_that_do_not_fit_the_layer_are_refused():
    """Kept states that do not fit their layer (an LSTM's c state of 5 units where it has 4; both
    for a batch of 3 where the inputs declare 2; a state missing from a stack of cells) are
    refused naming the layer and what was expected."""
    from cudnn_rnn.keras.files.containers import open_keras_file
    from cudnn_rnn.keras.load import _saved_states

    path = os.path.join(DATA, "tfk_stateful_saved_model")
    model = load_keras(path)
    kept = open_keras_file(path).layer_states
    assert [p for p, _ in kept["lstm"]] == ["states/0", "states/1"]
    wider = dict(kept, lstm=[(p, a if p == "states/0" else np.zeros((2, 5), np.float32)) for p, a in kept["lstm"]])
    with pytest.raises(ConversionError, match=r"layer 'lstm'.*saved states do not fit the layer: its saved states have "
                                              r"shapes \[\(2, 4\), \(2, 5\)\]; expected \[2, units\]"):
        _saved_states(model, wider, path)
    other_batch = dict(kept, lstm=[(p, np.zeros((3, 4), np.float32)) for p, _ in kept["lstm"]])
    with pytest.raises(ConversionError, match=r"layer 'lstm'.*\[\(3, 4\), \(3, 4\)\]; expected \[2, units\]"):
        _saved_states(model, other_batch, path)
    cut = dict(kept, rnn=[(p, a) for p, a in kept["rnn"] if p != "states/1/1"])
    with pytest.raises(ConversionError, match=r"layer 'rnn'.*cells 0-1 are stateful; the SavedModel keeps"):
        _saved_states(model, cut, path)


@pytest.mark.parametrize("name", ["k3_nested_dicts.keras", "tfk_nested_dicts.h5"])
def test_outputs_nest_as_keras_nests_them(name):
    """A model built on dicts, holding a model built on dicts (Keras 3.15 on TensorFlow 2.21,
    tf.keras 2.21): the outer model returns {"q": tensor, "p": [tensor, tensor]} as Keras does,
    takes its inputs as a dict by key (by position: in sorted key order, Keras's model.inputs);
    the inner model, called on a dict in another key order,
    takes them by key, and its outputs are numbered by sorted key as Keras numbers them (an outer
    layer reading the wrong one would not run: the widths differ)."""
    model = load_keras(os.path.join(DATA, name))
    data = np.load(os.path.join(DATA, name.split(".")[0] + ".npz"))
    assert model.input_keys == ["k1", "k2"] and model.output_keys == ["q", "p"]  # (inputs by sorted key)
    assert model.io_names() == (["k1", "k2"], ["q", "p/0", "p/1"])  # (what an .onnx file names them)
    with torch.no_grad():
        out = model({"k2": data["input_1"], "k1": data["input_0"]})
    assert set(out) == {"q", "p"} and isinstance(out["q"], torch.Tensor) and isinstance(out["p"], list)
    for j, got in enumerate([out["q"], *out["p"]]):
        np.testing.assert_allclose(got.numpy(), data[f"output_{j}"], rtol=1e-5, atol=1e-6, err_msg=f"output {j}")


def test_layer_names_each_their_own_module(tmp_path):
    """Keras names a ModuleDict cannot hold as they are ("a.b" beside "a_b", "d.", "a-b.c", and
    "keys", "to", "training", its own attributes; tf.keras 2.21 allows them): each layer keeps its
    own module, found by its Keras name (model.layer), through save_converted / load_converted."""
    model = load_keras(os.path.join(DATA, "tfk_layer_names.h5"))
    names = ["to", "training", "a.b", "a_b", "a-b.c", "keys", "d."]
    modules = [model.layer(n) for n in names]
    assert len({id(m) for m in modules}) == len(names)
    assert model.layer("a.b").kernel.shape == (3, 2) and model.layer("a_b").kernel.shape == (3, 3)
    assert sorted(layer_name(k) for k in model.layers) == sorted(names + ["x"])
    save_converted(model, tmp_path / "m.pt")
    again = load_converted(tmp_path / "m.pt")
    x = torch.from_numpy(np.load(os.path.join(DATA, "tfk_layer_names.npz"))["input_0"])
    for a, b in zip(model(x), again(x)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_architecture_as_a_json_file():
    """A weights-only legacy file with the architecture model.to_json() wrote, given as the JSON
    file's path (the Keras 2 pairing of model.json and save_weights)."""
    data = np.load(os.path.join(DATA, "tfk_sequential.npz"))
    model = load_keras(os.path.join(DATA, "tfk_sequential_weights.h5"),
                       architecture=os.path.join(DATA, "tfk_sequential.json"))
    assert model.keras_version.startswith("2.")
    with torch.no_grad():
        out = model(torch.as_tensor(data["input_0"]))
    np.testing.assert_allclose(out.numpy(), data["output_0"], atol=1e-5, rtol=1e-5)


def test_numpy_inputs_as_keras_takes_them():
    """A converted model takes numpy arrays as Keras does, as tensors of each Input's dtype:
    float32, float64 and big-endian arrays give the outputs of the float32 tensors, an integer
    array given to a float input those of its values as floats; integer ids too."""
    data = np.load(os.path.join(DATA, "k3_functional.npz"))
    arrays = [data[k] for k in sorted(k for k in data.files if k.startswith("input_"))]
    model = load_keras(os.path.join(DATA, "k3_functional.keras"))
    with torch.no_grad():
        expected = model(*[torch.as_tensor(a) for a in arrays])
        for got in (model(*arrays), model(*[a.astype(np.float64) for a in arrays]),
                    model(*[a.astype(">f4") for a in arrays])):
            for a, b in zip(got, expected):
                assert a.dtype == torch.float32 and torch.equal(a, b)
        whole = [np.round(a * 4).astype(np.int64) for a in arrays]
        for a, b in zip(model(*whole), model(*[torch.as_tensor(w, dtype=torch.float32) for w in whole])):
            assert torch.equal(a, b)
    data = np.load(os.path.join(DATA, "k3_lookup.npz"))
    model = load_keras(os.path.join(DATA, "k3_lookup.keras"))
    arrays = [data[k] for k in sorted(k for k in data.files if k.startswith("input_"))]
    with torch.no_grad():
        for a, b in zip(model(*arrays), model(*[torch.as_tensor(x) for x in arrays])):
            assert torch.equal(a, b)


def test_lookup_vocabulary_from_an_unzipped_model_directory(tmp_path):
    """Keras 3's unzipped model directory (model.save(dir, zipped=False): the archive's members as
    files) gives the same model, its lookup vocabularies read from assets/."""
    import zipfile

    data = DATA
    with zipfile.ZipFile(os.path.join(data, "k3_lookup.keras")) as z:
        assert any(n.startswith("assets/") for n in z.namelist())
        z.extractall(tmp_path / "unzipped")
    stored = np.load(os.path.join(data, "k3_lookup.npz"))
    xs = [torch.as_tensor(stored["input_0"]), torch.as_tensor(stored["input_1"])]
    model = load_keras(tmp_path / "unzipped")
    assert model.keras_version == "3.15.1"
    with torch.no_grad():
        out = model(*xs)
    for i, y in enumerate(out):
        np.testing.assert_allclose(y.numpy(), stored[f"output_{i}"], rtol=1e-5, atol=1e-5)
    (tmp_path / "unzipped" / "model.weights.h5").unlink()
    with pytest.raises(cudnn_rnn.keras.ConversionError, match="unzipped: has no model.weights.h5"):
        load_keras(tmp_path / "unzipped")


def test_backend_argument_for_files_that_do_not_record_it():
    """A Keras 3 .keras file records no backend: backend="tensorflow" (the CLI's --backend) gives
    TensorFlow's bicubic resizes, the numbers Keras on TensorFlow computed; without it torch's
    cubic is off. A backend that contradicts the file's record is refused."""
    from cudnn_rnn.cli import main

    data = np.load(os.path.join(DATA, "k3_bicubic.npz"))
    x, expected = torch.as_tensor(data["input_0"]), data["output_0"]
    path = os.path.join(DATA, "k3_bicubic.keras")
    with torch.no_grad():
        default = load_keras(path)(x).numpy()
        model = load_keras(path, backend="tensorflow")
        assert model.keras_backend == "tensorflow"
        np.testing.assert_allclose(model(x).numpy(), expected, atol=1e-5, rtol=1e-5)
    assert load_keras(path).keras_backend is None and np.abs(default - expected).max() > 1e-3
    with pytest.raises(cudnn_rnn.keras.ConversionError, match="records that Keras on tensorflow wrote it; backend='jax'"):
        load_keras(os.path.join(DATA, "k3_bicubic.h5"), backend="jax")
    with pytest.raises(ValueError, match="backend must be one of tensorflow, jax, torch; got 'theano'"):
        load_keras(path, backend="theano")
    assert main(["inspect", path, "--backend", "tensorflow", "--no-progress"]) == 0


def test_clahe_backend_of_a_keras_file():
    """ContrastLimitedAdaptiveHistogramEqualization in a .keras file Keras on TensorFlow wrote:
    with backend="tensorflow" the equalized image and the LSTM after it are TensorFlow's numbers;
    read as the torch backend's (the default), the padding and the clip limit differ, and so do
    the numbers (that default is checked against Keras's torch backend in
    test_keras_layer_library.py)."""
    data = np.load(os.path.join(DATA, "k3_clahe.npz"))
    x = torch.as_tensor(data["input_0"])
    path = os.path.join(DATA, "k3_clahe.keras")
    with torch.no_grad():
        out = load_keras(path, backend="tensorflow")(x)
        default = load_keras(path)(x)
    for i, y in enumerate(out):
        np.testing.assert_allclose(y.numpy(), data[f"output_{i}"], atol=1e-5, rtol=1e-5)
    assert np.abs(default[1].numpy() - data["output_1"]).max() > 1e-2


def test_converted_file_keeps_the_backend(tmp_path):
    """A converted .pt of a file TensorFlow's Keras wrote rebuilds its bicubic resizes as
    TensorFlow's (the backend is kept beside the config)."""
    from cudnn_rnn.keras import load_converted, save_converted

    data = np.load(os.path.join(DATA, "tfk_bicubic.npz"))
    model = load_keras(os.path.join(DATA, "tfk_bicubic.h5"))
    assert model.keras_backend == "tensorflow"
    save_converted(model, tmp_path / "m.pt")
    back = load_converted(tmp_path / "m.pt")
    assert back.keras_backend == "tensorflow"
    with torch.no_grad():
        out = back(torch.as_tensor(data["input_0"]))
    np.testing.assert_allclose(out.numpy(), data["output_0"], atol=1e-5, rtol=1e-5)


def test_converted_model_repr_gives_its_size():
    model = load_keras(os.path.join(DATA, "tfk_sequential.h5"))
    text = repr(model)
    params = sum(p.numel() for p in model.parameters())
    assert f"{len(model.layers)} layers, {params:,} parameters, inputs " in text and "from Keras 2." in text, text[:300]


def test_recurrent_layers_of_a_whole_model():
    """recurrent_layers takes a converted model as well as one of its modules: the cudnn_rnn
    layers of every module, in the model's layer order."""
    from cudnn_rnn.keras import recurrent_layers

    model = load_keras(os.path.join(DATA, "k3_functional.keras"))
    per_module = [layer for module in model.layers.values() for layer in recurrent_layers(module)]
    found = recurrent_layers(model)
    assert len(found) >= 2 and [id(l) for l in found] == [id(l) for l in per_module]
    assert all(isinstance(l, (cudnn_rnn.LSTM, cudnn_rnn.GRU, cudnn_rnn.SimpleRNN, cudnn_rnn.Bidirectional))
               for l in found)


def test_stochastic_depth_drops_whole_samples_in_training_only():
    """keras.applications' StochasticDepth (rate 0.25 in the fixture) is the identity at inference;
    in training each sample's branch is either dropped or scaled by 1 / (1 - rate), as Keras draws it."""
    model = load_keras(os.path.join(DATA, "k3_applications_layers.keras"))
    depth = next(m for m in model.layers.values() if type(m).__name__ == "StochasticDepth")
    x = torch.rand(256, 3, 6) + 0.5
    (y,), _ = depth([x], [None])
    assert torch.equal(y, x)
    depth.train()
    torch.manual_seed(0)
    (y,), _ = depth([x], [None])
    ratio = (y / x).flatten(1)
    dropped = (ratio == 0).all(dim=1)
    scaled = torch.isclose(ratio, torch.tensor(1 / 0.75)).all(dim=1)
    assert bool((dropped | scaled).all())
    assert 32 <= int(dropped.sum()) <= 96  # 64 expected


@pytest.mark.parametrize("aux_shape,message", [
    ((3, 1, 4), r"^layer 'max_pooling1d' \(MaxPooling1D\) on input of shape \(3, 1, 6\): .*too small"),
    ((3, 6, 5), r"^layer 'conv1d' \(Conv1D\) on input of shape \(3, 6, 5\): .*4 channels"),
])
def test_a_layer_that_cannot_run_on_its_input_is_named(aux_shape, message):
    """An input the model cannot run on (too short for a pooling window, the wrong number of
    features) fails with torch's own error type, its message naming the layer and the shapes."""
    model = load_keras(os.path.join(DATA, "k3_functional.keras"))
    with pytest.raises(RuntimeError, match=message):
        model(torch.zeros(3, 6, 4), torch.zeros(aux_shape))


@pytest.mark.parametrize("bad", [-1, 200])
def test_ids_outside_an_embedding_are_named(bad):
    """Token ids outside an Embedding's [0, input_dim) (Keras on TensorFlow refuses them too) fail
    with one error naming the layer, the range and the id."""
    model = load_keras(os.path.join(DATA, "..", "..", "..", "examples", "sentiment.h5"))
    assert model.input_vocabularies() == [200]
    ids = torch.ones(2, 7, dtype=torch.long)
    ids[1, 3] = bad
    with pytest.raises(IndexError, match=rf"^layer 'embedding' \(Embedding\) on input of shape \(2, 7\): "
                                         rf"Embedding: ids must be in \[0, 200\) \(input_dim\); got {bad}$"):
        model(ids)


def test_convert_says_the_lengths_the_program_admits(capsys):
    """What `cudnn-rnn convert` says a .pt2 takes comes from the program's own guards (torch.export
    can admit fewer lengths than it was asked for): each free input's lower bound, read back."""
    from cudnn_rnn.cli import _program_lengths, _say_inputs

    class Two(torch.nn.Module):
        def forward(self, x, y):
            return x.sum(1), y.sum(1)

    batch = torch.export.Dim("batch", min=1)
    example = (torch.randn(2, 9, 3), torch.randn(2, 9, 3))
    program = torch.export.export(Two(), example, dynamic_shapes=(
        {0: batch, 1: torch.export.Dim("t0", min=2)}, {0: batch, 1: torch.export.Dim("t1", min=5)}))
    lowest = _program_lengths(program, [0, 1])
    assert lowest == {0: 2, 1: 5}
    _say_inputs([0, 1], 2, example, lowest)
    assert "the program takes float32 [batch, time, 3]; float32 [batch, time >= 5, 3]" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["k3_lookup", "k3_updates_transforms"])
def test_layers_that_read_their_data_export(name, tmp_path):
    """Layers whose eager code read the data while torch.export traced it, through `cudnn-rnn
    convert` to .pt2: the lookup and CategoryEncoding one-hot rows (their index check), corrcoef
    (torch.cov's check of its normalisation factor) and lstsq (its residuals' shape, which the
    data decides). The program computes the eager model's outputs (which equal Keras's: above)."""
    from cudnn_rnn.cli import main

    src = os.path.join(DATA, f"{name}.keras")
    assert main(["convert", "--no-progress", src, str(tmp_path / "m.pt2")]) == 0
    program = torch.export.load(str(tmp_path / "m.pt2")).module()
    model, stored = load_keras(src), np.load(os.path.join(DATA, f"{name}.npz"))
    xs = [torch.from_numpy(stored[f"input_{i}"]) for i in range(len(model.input_specs))]
    with torch.no_grad():
        want = model(*xs)
        # (the program takes what convert says: int64 ids, bool masks)
        got = program(*[x.to(e.dtype) for x, e in zip(xs, model.example_inputs())])
    assert len(got) == len(want) > 5
    for j, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"output {j}")


def test_a_layer_export_cannot_trace_is_named(tmp_path, monkeypatch, capsys):
    """A layer whose computation torch.export cannot trace (here the one-hot encoding made to read
    its indices again) makes `cudnn-rnn convert` fail in one line naming the layer, no traceback."""
    from cudnn_rnn.cli import main
    from cudnn_rnn.keras.layers import preprocessing

    encode = preprocessing.encode_categorical

    def reading(indices, mode, depth, dtype):
        if bool((indices.long() >= depth).any()):
            raise ValueError("out of range")
        return encode(indices, mode, depth, dtype)

    monkeypatch.setattr(preprocessing, "encode_categorical", reading)
    src = os.path.join(DATA, "k3_lookup.keras")
    for ext in ("pt2", "onnx"):
        assert main(["convert", "--no-progress", src, str(tmp_path / f"m.{ext}")]) == 2
        err = capsys.readouterr().err
        assert f"m.{ext}: cannot be exported" in err and "layer '" in err and "convert to .pt" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err


def test_integer_outputs_keep_keras_dtypes():
    """tf.keras's integer outputs in their dtypes: TensorFlow's reductions and cumulative sums of
    uint8 / int8 / int32 in the input's dtype, Discretization's bins in int64 (Keras 3's: int32)."""
    model, stored = load_keras(os.path.join(DATA, "tfk_int_inputs.h5")), np.load(os.path.join(DATA, "tfk_int_inputs.npz"))
    with torch.no_grad():
        out = model(*[torch.from_numpy(stored[f"input_{i}"]) for i in range(6)])
    kinds = [(str(y.dtype), str(stored[f"output_{j}"].dtype)) for j, y in enumerate(out)]
    integer = [(ours, theirs) for ours, theirs in kinds if theirs[0] in "iu"]
    assert len(integer) == 8
    assert all(ours == f"torch.{theirs}" for ours, theirs in integer), integer


def test_quantized_layers_serve_as_keras_computes_them(tmp_path):
    """k3_quantized (int8 / int4 / float8 layers from Keras's quantize()) exported by torch.export,
    compiled by torch.compile (which would drop float8's bfloat16 rounding of the bias, done on the
    bits for it) and exported to ONNX (run by onnxruntime): Keras's stored outputs within 1e-5."""
    import onnxruntime

    import cudnn_rnn.onnx

    model = load_keras(os.path.join(DATA, "k3_quantized.keras")).eval()
    stored = np.load(os.path.join(DATA, "k3_quantized.npz"))
    x, want = torch.from_numpy(stored["input_0"]).long(), stored["output_0"]
    with torch.no_grad():
        got = {"export": torch.export.export(model, (x,)).module()(x), "compile": torch.compile(model)(x)}
    cudnn_rnn.onnx.export(model, (x,), str(tmp_path / "q.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "q.onnx"))
    got["onnx"] = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    for how, y in got.items():
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5, err_msg=how)


def test_keras_313_int4_layers_save_as_converted_not_as_keras_315(tmp_path):
    """A model holding Keras 3.11-3.13's int4 layers (packed along the summed axis) reloads from
    save_converted to the same outputs; save_keras, which writes Keras 3.15's format (whose int4
    layout differs), refuses it in one line naming the layer."""
    import cudnn_rnn

    model = load_keras(os.path.join(DATA, "k3.13.2_int4_row_packed.keras"))
    stored = np.load(os.path.join(DATA, "k3.13.2_int4_row_packed.npz"))
    save_converted(model, tmp_path / "m.pt")
    with torch.no_grad():
        got = load_converted(str(tmp_path / "m.pt"))(torch.from_numpy(stored["input_0"]))
    for j, y in enumerate(got):
        np.testing.assert_allclose(y.numpy(), stored[f"output_{j}"], rtol=1e-5, atol=1e-5, err_msg=f"output {j}")
    with pytest.raises(ConversionError, match=r"layers/dense holds an int4 layer as Keras 3.11-3.13 packed it"):
        cudnn_rnn.save_keras(model, tmp_path / "m.keras")


def test_bidirectional_reading_backwards_exports_to_onnx(tmp_path):
    """tfk_unroll's outputs (tf.keras 2.21: unrolled masked layers, among them a Bidirectional whose
    forward LSTM has go_backwards=True) from its .onnx export in onnxruntime, within 1e-5 of
    the outputs tf.keras stored."""
    import onnxruntime

    import cudnn_rnn.onnx

    model = load_keras(os.path.join(DATA, "tfk_unroll.h5")).eval()
    stored = np.load(os.path.join(DATA, "tfk_unroll.npz"))
    xs = (torch.from_numpy(stored["input_0"]).long(), torch.from_numpy(stored["input_1"]))
    cudnn_rnn.onnx.export(model, xs, str(tmp_path / "m.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"))
    got = session.run(None, {i.name: x.numpy() for i, x in zip(session.get_inputs(), xs)})
    assert len(got) == 5
    for j, y in enumerate(got):
        np.testing.assert_allclose(y, stored[f"output_{j}"], rtol=1e-5, atol=1e-5, err_msg=f"output {j}")


def test_inspect_names_each_layers_quantization(capsys):
    """`cudnn-rnn inspect` says how Keras quantized each layer (its dtype policy's mode)."""
    from cudnn_rnn.cli import main

    assert main(["inspect", os.path.join(DATA, "k3_quantized.keras"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    for row in ("emb  ", "Embedding (int4/4)", "EinsumDense (int8)", "Dense (float8)", "Dense (int4/3)", "lstm  "):
        assert row in out, out
    assert "LSTM (" not in out


def _edited_quantized(tmp_path, layer: str, edit) -> str:
    """k3_quantized.keras with one layer's config changed by `edit` (a malformed file)."""
    import json
    import zipfile

    src, dst = os.path.join(DATA, "k3_quantized.keras"), str(tmp_path / "edited.keras")
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for info in z.infolist():
            data = z.read(info.filename)
            if info.filename == "config.json":
                config = json.loads(data)
                edit(next(l for l in config["config"]["layers"] if l["config"].get("name") == layer)["config"])
                data = json.dumps(config).encode()
            out.writestr(info, data)
    return dst


@pytest.mark.parametrize("layer,edit,message", [
    ("g3", lambda c: c["quantization_config"]["config"].update(block_size=0), r"block_size 0 is not a positive"),
    ("g3", lambda c: c["quantization_config"]["config"].update(activation_quantizer={
        "class_name": "AbsMaxQuantizer", "config": {"value_range": [-127, 127]}}), r"int4 in groups with an inputs"),
    ("heads", lambda c: c["quantization_config"]["config"]["activation_quantizer"]["config"].update(
        value_range=[-300, 127]), r"is not an int8 range"),
    ("heads", lambda c: c["quantization_config"]["config"].update(activation_quantizer={"class_name": "Mine"}),
     r"inputs quantizer 'Mine' is not Keras's AbsMaxQuantizer"),
    ("emb", lambda c: c["dtype"]["config"].update(mode="float8"), r"quantized by Keras \(float8\), which is not"),
    ("out", lambda c: c["dtype"]["config"].update(mode="gptq/4/-1"), r"quantized by Keras \(gptq/4/-1\)"),
])
def test_a_malformed_quantized_layer_is_refused_by_name(tmp_path, layer, edit, message):
    """Quantization configs Keras writes no such way, or that do not convert, are refused in one
    ConversionError naming the layer."""
    with pytest.raises(ConversionError, match=rf"layer '{layer}'.*{message}"):
        load_keras(_edited_quantized(tmp_path, layer, edit))


@pytest.mark.parametrize("edit,message", [
    (lambda node, layer: node.update(op="Unique"), r"the TensorFlow op Unique \(a TensorFlowOpLayer\) is not supported"),
    (lambda node, layer: layer["config"].update(constants={"7": 1}), "constants are not numbered among its node's inputs"),
    (lambda node, layer: node["attr"].update(DstT={"type": "DT_STRING"}), "TensorFlowOpLayer Cast: Cast to .* is not "
                                                                         "supported"),
    (lambda node, layer: node["attr"].update(DstT={"i": 3}), r"attribute DstT is \{'i': 3\}; expected a 'type' value"),
])
def test_tf_op_layer_refusals_name_the_op(edit, message, tmp_path):
    """A TensorFlowOpLayer whose op is not one converted here, whose constants are not among its
    node's inputs, or whose Cast goes to a dtype not converted, is refused naming it."""
    import shutil

    import h5py

    path = tmp_path / "edited.h5"
    shutil.copy(os.path.join(DATA, "tfk_tf_op_layer.h5"), path)
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["model_config"])
        layer = next(l for l in config["config"]["layers"] if l["config"].get("name") == "Cast")
        edit(layer["config"]["node_def"], layer)
        f.attrs["model_config"] = json.dumps(config)
    with pytest.raises(ConversionError, match=message):
        load_keras(path)
