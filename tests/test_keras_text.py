"""The layers that take strings against what Keras 3.15 on TensorFlow 2.21 computed:
TextVectorization and StringLookup (cudnn_rnn/keras/layers/text.py; tests/fixtures/make_fixtures.py's
k3_text: a .keras file whose adapted vocabularies are assets; texts with non-ASCII capitals, tabs,
no-break and em spaces, punctuation and an empty string), HashedCrossing and Hashing of strings
(preprocessing.py; k3_crossing.keras, and tf.keras 2.21's tk_crossing.h5), and the
configurations and inputs they refuse."""
import json
import os
import zipfile

import numpy as np
import pytest
import torch

from cudnn_rnn.keras import ConversionError, load_converted, load_keras, save_converted

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data")
PATH = os.path.join(DATA, "k3_text.keras")


@pytest.fixture(scope="module")
def stored():
    return np.load(os.path.join(DATA, "k3_text.npz"))


@pytest.fixture(scope="module")
def model():
    return load_keras(PATH)


def _check(out, stored):
    assert len(out) == 11
    for j, y in enumerate(out):
        expected = stored[f"output_{j}"]
        assert tuple(y.shape) == expected.shape, f"output {j}"
        assert str(y.dtype) == f"torch.{expected.dtype}", f"output {j}: {y.dtype}, Keras {expected.dtype}"
        if j in (1, 4, 5, 6, 10):  # ids
            assert y.dtype == torch.int64
            np.testing.assert_array_equal(y.numpy(), expected, err_msg=f"output {j}")
        else:
            np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=f"output {j}")


def test_text_layers_match_keras(model, stored):
    """Every output: the LSTM after the ids, the ids cut and padded to 7, bigrams as multi_hot,
    characters counted, punctuation stripped (rows padded to the longest; its vocabulary holds
    words with a line separator and a NEL, which Keras reads back as two lines each: the stored
    outputs are those of the model Keras loads from the file), no split, StringLookup as ids and
    as multi_hot, TF-IDF of both, StringLookup with three OOV indices (the word's FarmHash); the
    strings as numpy arrays, bytes and lists."""
    with torch.no_grad():
        _check(model(stored["input_0"], stored["input_1"]), stored)
        as_lists = model([list(r) for r in stored["input_0"]], [list(r) for r in stored["input_1"]])
        as_bytes = model(np.char.encode(stored["input_0"], "utf-8"), stored["input_1"].astype(object))
    _check(as_lists, stored)
    _check(as_bytes, stored)


def test_weights_file_reads_the_vocabularies_of_its_architecture(stored):
    """Keras 3's model.save_weights file keeps no vocabularies: with the .keras file as the
    architecture, the lookup layers read that file's assets (the same outputs); with the config
    alone they are refused by name."""
    weights = os.path.join(DATA, "k3_text.weights.h5")
    with torch.no_grad():
        _check(load_keras(weights, architecture=PATH)(stored["input_0"], stored["input_1"]), stored)
    with zipfile.ZipFile(PATH) as z:
        config = z.read("config.json").decode()
    with pytest.raises(ConversionError, match="vocabulary is neither in its config nor in the file"):
        load_keras(weights, architecture=config)


def test_text_model_round_trip_and_empty_batch(model, stored, tmp_path):
    """A converted .pt keeps the vocabularies; a batch of no strings gives empty outputs of
    the widths Keras's give."""
    save_converted(model, tmp_path / "m.pt")
    again = load_converted(tmp_path / "m.pt")
    with torch.no_grad():
        for a, b in zip(model(stored["input_0"], stored["input_1"]), again(stored["input_0"], stored["input_1"])):
            assert torch.equal(a, b)
        empty = model(stored["input_0"][:0], stored["input_1"][:0])
    assert [tuple(y.shape) for y in empty] == [(0, 4), (0, 7), (0, 40), (0, 60), (0, 0), (0, 3), (0, 3), (0, 5),
                                               (0, 25), (0, 4), (0, 3)]
    assert tuple(model(stored["input_0"], stored["input_1"])[4].shape) == stored["output_4"].shape


def test_farmhash_fingerprint64_is_tensorflows():
    """The Fingerprint64 that several OOV indices take, against TensorFlow's (tf.fingerprint
    farmhash64) on random byte strings of every length class: 0-16, 17-32, 33-64 bytes and one or
    more 64-byte blocks (0-69, 100, 128, 129, 200 and 1000 bytes)."""
    from cudnn_rnn.keras.layers.farmhash import fingerprint64

    stored = np.load(os.path.join(DATA, "farmhash64.npz"))
    data, offsets = stored["data"].tobytes(), np.concatenate([[0], np.cumsum(stored["lengths"])])
    for i, fp in enumerate(stored["fingerprints"]):
        s = data[offsets[i]:offsets[i + 1]]
        assert fingerprint64(s) == int.from_bytes(bytes(fp.astype(np.uint8)), "little"), f"{len(s)} bytes"


def test_text_inputs_refused_with_the_layer_named(model, stored):
    with pytest.raises(TypeError, match=r"layer 'ids' \(TextVectorization\).*takes strings .*got a "
                                        "tensor"):
        model(torch.zeros(2, 1), stored["input_1"])
    with pytest.raises(TypeError, match="takes strings .*got an array of int64"):
        model(np.zeros((2, 1), dtype=np.int64), stored["input_1"])
    with pytest.raises(TypeError, match="takes strings .*got an array of complex128"):
        model(np.zeros((2, 1), dtype=np.complex128), stored["input_1"])
    with pytest.raises(ValueError, match=r"takes a batch of strings \(\[batch\] or \[batch, 1\]\); got shape \[2, 2\]"):
        model(np.array([["a", "b"], ["c", "d"]]), stored["input_1"][:2])
    with pytest.raises(ValueError, match="a string at .* is not UTF-8"):
        model(np.array([[b"\xff"]], dtype=object), stored["input_1"][:1])


def _mutated(tmp_path, layer: str, change, drop_asset: bool = False) -> str:
    with zipfile.ZipFile(PATH) as z:
        members = {n: z.read(n) for n in z.namelist()}
    config = json.loads(members["config.json"])
    target = next(entry for entry in config["config"]["layers"] if entry["config"]["name"] == layer)
    change(target["config"])
    members["config.json"] = json.dumps(config).encode()
    if drop_asset:  # every vocabulary asset
        members = {n: d for n, d in members.items() if not n.startswith("assets/")}
    out = tmp_path / "mutated.keras"
    with zipfile.ZipFile(out, "w") as z:
        for n, d in members.items():
            z.writestr(n, d)
    return str(out)


@pytest.mark.parametrize("layer,change,message", [
    ("hashed", lambda c: c.update(salt=[1, 2, 3]), r"config salt=\[1, 2, 3\]; expected a 64-bit integer or two"),
    ("ids", lambda c: c.update(standardize="my_standardize"), "standardize='my_standardize' is not supported .*Python code"),
    ("ids", lambda c: c.update(split={"class_name": "function"}), "split=.* is not supported"),
    ("whole", lambda c: c.update(ngrams=2), "with ngrams and no split is not supported"),
    ("ids", lambda c: c.update(ragged=True), "sparse or ragged outputs is not supported"),
    ("ids", lambda c: c.update(encoding="latin-1"), "encoding='latin-1' is not supported"),
    ("lookup", lambda c: c.update(invert=True), "invert=True is not supported"),
    ("lookup", lambda c: c.update(vocabulary=["cat", "cat"]), "vocabulary holds a token twice"),
    ("lookup", lambda c: c.update(vocabulary="/data/vocab.txt"), "vocabulary is a file path"),
    ("hot", lambda c: c.update(vocabulary=[1, 2]), "is not a list of strings"),
    ("weighted", lambda c: c.update(pad_to_max_tokens=True, max_tokens=9), r"idf_weights have shape \(4,\); its 9 "),
])
def test_text_configs_refused(tmp_path, layer, change, message):
    with pytest.raises(ConversionError, match=f"layer '{layer}'.*{message}"):
        load_keras(_mutated(tmp_path, layer, change))


def test_adapted_vocabulary_must_be_in_the_file(tmp_path):
    path = _mutated(tmp_path, "chars", lambda c: None, drop_asset=True)
    with pytest.raises(ConversionError, match="layer 'ids'.*vocabulary is neither in its config nor in the file"):
        load_keras(path)


def test_text_model_is_not_exported(model, tmp_path, capsys):
    """An exported program takes tensors only: both exporters refuse a model that takes strings,
    naming the input."""
    from cudnn_rnn.cli import main

    assert main(["convert", PATH, str(tmp_path / "m.pt2"), "--no-progress"]) == 2
    assert "the model takes strings (input 0" in capsys.readouterr().err
    onnx = pytest.importorskip("cudnn_rnn.onnx")
    with pytest.raises(onnx.OnnxExportError, match="the model takes strings"):
        onnx.export(model, (), tmp_path / "m.onnx")


def test_text_model_on_another_dtype(model, stored):
    """tf_idf rows follow the model's floating dtype (model.double()); Keras 3's multi_hot and
    count rows stay int64, as its ids do."""
    double = load_keras(PATH).double()
    with torch.no_grad():
        out = double(stored["input_0"], stored["input_1"])
    assert out[8].dtype == torch.float64 and out[2].dtype == out[3].dtype == out[1].dtype == torch.int64
    np.testing.assert_array_equal(out[3].numpy(), stored["output_3"])


@pytest.mark.parametrize("name", ["k3_text", "k3_lookup"])
def test_save_keras_writes_the_vocabularies_back(name, tmp_path):
    """save_keras writes each lookup layer's vocabulary asset so that Keras reads the lines it
    read from the original file (asset_lines: Keras 3.15 on TensorFlow, given the written file,
    computes the fixture's outputs again), and the written file converts to the same model."""
    from cudnn_rnn.keras import save_keras
    from cudnn_rnn.keras.files.weights import asset_lines

    source = os.path.join(DATA, f"{name}.keras")
    model = load_keras(source)
    save_keras(model, tmp_path / "back.keras")
    with zipfile.ZipFile(source) as z:
        original = {n: z.read(n) for n in z.namelist() if n.startswith("assets/")}
    with zipfile.ZipFile(tmp_path / "back.keras") as z:
        written = {n: z.read(n) for n in z.namelist() if n.startswith("assets/")}
    assert original and set(original) <= set(written)
    for member, text in original.items():
        assert asset_lines(written[member].decode()) == asset_lines(text.decode()), member
    stored = np.load(os.path.join(DATA, f"{name}.npz"))
    inputs = [stored[k] for k in sorted(k for k in stored.files if k.startswith("input_"))]
    inputs = [x if x.dtype.kind in "USO" else torch.as_tensor(x) for x in inputs]
    with torch.no_grad():
        for a, b in zip(model(*inputs), load_keras(tmp_path / "back.keras")(*inputs)):
            assert torch.equal(a, b)


def _crossing(name):
    ext = "keras" if name.startswith("k3") else "h5"
    return load_keras(os.path.join(DATA, f"{name}.{ext}")), np.load(os.path.join(DATA, f"{name}.npz"))


@pytest.mark.parametrize("name", ["k3_crossing", "tk_crossing"])
def test_hashed_crossing_and_string_hashing_match_keras(name):
    """HashedCrossing of a string with an int64 feature (bins, one-hot rows, 2^40 bins), of an
    int32 with an int64 feature, and Hashing of strings (with a string mask_value, one-hot), as
    Keras 3.15 on TensorFlow 2.21 (.keras) and tf.keras 2.21 (.h5) computed them: bins exactly,
    the LSTM after an Embedding of the bins and the Dense after the one-hot rows within 1e-5;
    strings of every FarmHash length class and non-ASCII, integers up to the int64 extremes; the
    strings as a numpy array of str, of UTF-8 bytes, and as lists, the integers as tensors and as
    numpy arrays; a cross and a Hashing whose config says dtype="int32" give int32 bins, the others
    int64."""
    model, stored = _crossing(name)
    numbers, small = torch.from_numpy(stored["input_1"]), torch.from_numpy(stored["input_2"])
    words = stored["input_0"]
    with torch.no_grad():
        runs = [model(words, numbers, small), model(np.char.encode(words, "utf-8"), numbers, small),
                model([list(r) for r in words], numbers, small),
                model(words, stored["input_1"], stored["input_2"])]  # (integers as numpy arrays)
    for out in runs:
        assert len(out) == 11
        for j, y in enumerate(out):
            expected = stored[f"output_{j}"]
            assert tuple(y.shape) == expected.shape, f"output {j}"
            if expected.dtype.kind == "i":
                assert y.dtype == torch.from_numpy(expected).dtype, f"output {j}"  # (int32 where the layer says)
                np.testing.assert_array_equal(y.numpy(), expected, err_msg=f"output {j}")
            else:
                np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5, err_msg=f"output {j}")
    assert len(np.unique(stored["output_0"])) > 4 and stored["output_2"].max() > 1 << 32  # (bins spread)
    assert stored["output_8"].max() > 1 << 62
    assert stored["output_9"].dtype == np.int32 and stored["output_10"].dtype == np.int32
    assert stored["output_0"].dtype == np.int64


def test_hashed_crossing_docstring_example():
    """Keras's HashedCrossing docstring: ['A', 'B', 'A', 'B', 'A'] crossed with [101, 101, 101,
    102, 102] into 5 bins is [1, 4, 1, 1, 3]; as one_hot, those rows; a scalar string Hashing with
    its mask_value is bin 0."""
    from cudnn_rnn.keras.layers.preprocessing import HashedCrossing, Hashing

    feat1, feat2 = np.array(["A", "B", "A", "B", "A"]), np.array([101, 101, 101, 102, 102])
    (bins,), _ = HashedCrossing(5, "int", torch.int64)([feat1, feat2], [None, None])
    assert bins.tolist() == [1, 4, 1, 1, 3]
    (hot,), _ = HashedCrossing(5, "one_hot", torch.float32)([feat1, torch.as_tensor(feat2)], [None, None])
    assert torch.equal(hot, torch.eye(5)[[1, 4, 1, 1, 3]])
    assert Hashing(7, "cat", "int").apply(np.array("cat")).item() == 0


def test_hashed_crossing_round_trip_and_bad_inputs(tmp_path):
    """A converted .pt computes the same; a float feature, features of different shapes or of
    rank 2 wider than 1, and a tensor given to a Hashing with a string mask_value are refused
    with the input named."""
    from cudnn_rnn.keras.layers.preprocessing import HashedCrossing, Hashing

    model, stored = _crossing("k3_crossing")
    numbers, small = torch.from_numpy(stored["input_1"]), torch.from_numpy(stored["input_2"])
    save_converted(model, tmp_path / "m.pt")
    with torch.no_grad():
        for a, b in zip(model(stored["input_0"], numbers, small),
                        load_converted(tmp_path / "m.pt")(stored["input_0"], numbers, small)):
            assert torch.equal(a, b)
        empty = model(stored["input_0"][:0], numbers[:0], small[:0])
    assert [tuple(y.shape) for y in empty] == [(0, 1), (0, 5), (0, 1), (0, 1), (0, 1), (0, 7), (0, 3), (0, 2), (0, 1),
                                                  (0, 1), (0, 1)]
    cross = HashedCrossing(5, "int", torch.int64)
    with pytest.raises(TypeError, match="HashedCrossing input 1 must hold integers or strings; got torch.float32"):
        cross([numbers, numbers.float()], [None, None])
    with pytest.raises(ValueError, match=r"HashedCrossing input 1 has shape \(11, 1\); input 0 has \(12, 1\)"):
        cross([numbers, small[:11]], [None, None])
    with pytest.raises(ValueError, match=r"must have shape \(\), \(batch,\) or \(batch, 1\); got \(6, 2\)"):
        cross([numbers.reshape(6, 2), small.reshape(6, 2)], [None, None])
    with pytest.raises(ValueError, match="two or more features; got 1"):
        cross([numbers], [None])
    with pytest.raises(TypeError, match="HashedCrossing input 0 must hold integers or strings; got torch.float64"):
        cross([np.array([[1.5]]), small[:1]], [None, None])
    with pytest.raises(TypeError, match=r"HashedCrossing input 1 takes strings; the element at \(0, 0\) is complex"):
        cross([small[:1], [[1j]]], [None, None])
    with pytest.raises(TypeError, match="string mask_value 'cat' takes strings; got a tensor"):
        Hashing(7, "cat", "int").apply(numbers)


@pytest.mark.parametrize("name", ["k3_scalar_inputs", "tk_scalar_inputs"])
def test_inputs_of_one_value_per_example(name):
    """Input(shape=()) (batch_shape [None]: one value per example, keras.io's structured-data
    models) given as a dict, as Keras 3.15 on TensorFlow 2.21 (.keras) and tf.keras 2.21 (.h5)
    computed them: a float reshaped to a column, strings through a StringLookup and integers
    through an IntegerLookup without out-of-vocabulary indices (the check run on load takes a
    value of their vocabularies: anything else gives -1, which the Embedding after them refuses),
    sentences through TextVectorization; a dict of outputs keyed as Keras keys them."""
    ext = "keras" if name.startswith("k3") else "h5"
    model = load_keras(os.path.join(DATA, f"{name}.{ext}"))
    stored = np.load(os.path.join(DATA, f"{name}.npz"))
    keys = ["code", "elevation", "soil", "text"]  # (sorted, as Keras's model.inputs lists them)
    assert model.input_keys == keys and model.output_keys == ["cover", "aux"]
    assert [shape for _, shape in model.input_specs] == [(None,)] * 4
    given = {k: stored[f"input_{i}"] for i, k in enumerate(keys)}
    with torch.no_grad():
        for out in (model(given), model(*[given[k] for k in keys])):
            assert list(out) == model.output_keys
            for j, y in enumerate(out.values()):
                np.testing.assert_allclose(y.numpy(), stored[f"output_{j}"], rtol=1e-5, atol=1e-6,
                                           err_msg=f"output {model.output_keys[j]}")


@pytest.mark.parametrize("name", ["k3_feature_space", "k3_feature_space_dict"])
def test_feature_space_models_match_keras(name, tmp_path):
    """Models built on keras.utils.FeatureSpace (Keras 3.15 on TensorFlow 2.21; .keras), whose
    graphs hold Keras's own TFDConcat and TFDIdentity beside the preprocessing layers: normalized,
    rescaled and discretized floats, integer and string categoricals, integer and string hashing
    and a cross into Dense layers; and output_mode="dict" (a float as it is, a rescaled float,
    string ids, one-hot integers); on rows holding values the adaptation never saw, as Keras
    computed them (float outputs within 1e-5, ids exactly); and after save_converted."""
    path = os.path.join(DATA, f"{name}.keras")
    stored = np.load(os.path.join(DATA, f"{name}.npz"))
    given = {k[len("input_"):]: stored[k] for k in stored.files if k.startswith("input_")}
    model = load_keras(path)
    assert model.input_keys == sorted(given)
    save_converted(model, tmp_path / "fs.pt")
    for m in (model, load_converted(tmp_path / "fs.pt")):
        with torch.no_grad():
            out = m(given)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        assert len(out) == len([k for k in stored.files if k.startswith("output_")])
        for j, y in enumerate(out):
            expected = stored[f"output_{j}"]
            assert y.dtype == torch.from_numpy(expected).dtype, (j, y.dtype, expected.dtype)
            np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-6, err_msg=f"output {j}")


def test_feature_space_class_names_from_another_module_are_refused(tmp_path):
    """TFDConcat is converted as FeatureSpace's where the file records FeatureSpace's module; a
    class of that name from another module is the model's own, refused with a builder offered."""
    src = os.path.join(DATA, "k3_feature_space.keras")
    config = json.loads(zipfile.ZipFile(src).read("config.json"))
    for layer in config["config"]["layers"]:
        if layer["class_name"] == "TFDConcat":
            layer["module"] = "my_project.layers"
    bad = tmp_path / "own_concat.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.namelist():
            zout.writestr(item, json.dumps(config) if item == "config.json" else zin.read(item))
    with pytest.raises(ConversionError, match=r"TFDConcat of module 'my_project.layers' is not supported .*"
                                              r"custom_layers=\{'TFDConcat': builder\}"):
        load_keras(bad)


@pytest.mark.parametrize("name", ["k3_salted_hashing", "tk_salted_hashing"])
def test_salted_hashing_matches_keras(name, tmp_path):
    """Hashing with a salt (TensorFlow's to_hash_bucket_strong: SipHash-2-4 keyed by the salt),
    as Keras 3.15 on TensorFlow 2.21 (.keras) and tf.keras 2.21 (.h5) computed it: strings of 0 to
    300 bytes and non-ASCII, one salt word or two (one negative), int64 values at both extremes,
    string and integer mask values, one-hot rows exactly; an Embedding of the bins into an LSTM
    within 1e-5; Keras 3's StringLookup and IntegerLookup (oov_method="farmhash") whose several OOV
    indices take the salted hash, exactly; and after save_converted."""
    ext = "keras" if name.startswith("k3") else "h5"
    model = load_keras(os.path.join(DATA, f"{name}.{ext}"))
    stored = np.load(os.path.join(DATA, f"{name}.npz"))
    save_converted(model, tmp_path / "salted.pt")
    for m in (model, load_converted(tmp_path / "salted.pt")):
        with torch.no_grad():
            out = m(stored["input_0"], torch.from_numpy(stored["input_1"]), stored["input_2"])
        assert len(out) == (8 if ext == "keras" else 6)
        for j, y in enumerate(out):
            expected = stored[f"output_{j}"]
            if j != 5:
                assert torch.equal(y, torch.from_numpy(expected)), j
            else:
                np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("salt", ["[1, 2, 3]", "1.5", "[1, true]", "9223372036854775808"])
def test_hashing_salt_out_of_range_is_refused(salt, tmp_path):
    """A salt that is not one or two 64-bit integers (TensorFlow's key words) is refused naming it."""
    src = os.path.join(DATA, "k3_salted_hashing.keras")
    config = json.loads(zipfile.ZipFile(src).read("config.json"))
    for layer in config["config"]["layers"]:
        if layer["config"].get("name") == "one":
            layer["config"]["salt"] = json.loads(salt)
    bad = tmp_path / "salt.keras"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.namelist():
            zout.writestr(item, json.dumps(config) if item == "config.json" else zin.read(item))
    with pytest.raises(ConversionError, match=r"layer 'one'.*config salt=.*expected a 64-bit integer or two of them"):
        load_keras(bad)


def test_salted_string_hashes_of_mixed_lengths_keep_their_rows():
    """Strings of very different lengths are hashed in groups of like length (no group padded to
    the longest string of the call): each row's hash is the one it has alone, in its place."""
    from cudnn_rnn.keras.layers.preprocessing import string_siphash

    words = np.array([["a" * n] for n in (0, 300, 7, 5000, 8, 17, 64, 1, 129, 16)], dtype=object)
    together = string_siphash(words, (3, -9))
    alone = torch.stack([string_siphash(np.array([w], dtype=object), (3, -9))[0] for w in words[:, 0]])
    assert together.shape == (10, 1) and torch.equal(together[:, 0], alone)
    assert len(set(together[:, 0].tolist())) == 10
