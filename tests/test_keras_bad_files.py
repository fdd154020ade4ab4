"""Malformed, truncated, inconsistent or hostile Keras files raise one ConversionError naming
the file (and the layer, where there is one) and what was expected."""
import io
import json
import os
import shutil
import zipfile

import h5py
import numpy as np
import pytest

from cudnn_rnn.keras import ConversionError, load_keras

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data")
KERAS = os.path.join(DATA, "k3_sequential.keras")
LEGACY = os.path.join(DATA, "tfk_sequential.h5")


def _rewrite_zip(src, dst, edit):
    """Copies a .keras archive, letting edit(name, data) change or drop (None) members."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = edit(item.filename, zin.read(item.filename))
            if data is not None:
                zout.writestr(item.filename, data)


def _weights_h5_bytes(edit):
    with zipfile.ZipFile(KERAS) as z:
        data = z.read("model.weights.h5")
    buf = io.BytesIO(data)
    with h5py.File(buf, "r+") as f:
        edit(f)
    return buf.getvalue()


def test_missing_file(tmp_path):
    with pytest.raises(ConversionError, match=r"nope.keras: cannot be opened"):
        load_keras(tmp_path / "nope.keras")


def test_not_a_keras_file(tmp_path):
    p = tmp_path / "model.keras"
    p.write_bytes(b"\x80\x04 a pickle, say")
    with pytest.raises(ConversionError, match="is neither a .keras zip archive nor an HDF5 file"):
        load_keras(p)


@pytest.mark.parametrize("keep", [0.3, 0.7])
def test_truncated_zip(tmp_path, keep):
    p = tmp_path / "t.keras"
    data = open(KERAS, "rb").read()
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ConversionError, match="t.keras"):
        load_keras(p)


@pytest.mark.parametrize("keep", [0.2, 0.6, 0.95])
def test_truncated_h5(tmp_path, keep):
    p = tmp_path / "t.h5"
    data = open(LEGACY, "rb").read()
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ConversionError, match="t.h5"):
        load_keras(p)


def test_member_outside_archive(tmp_path):
    p = tmp_path / "evil.keras"
    shutil.copy(KERAS, p)
    with zipfile.ZipFile(p, "a") as z:
        z.writestr("../../etc/evil", b"x")
    with pytest.raises(ConversionError, match=r"zip member '../../etc/evil' points outside the archive"):
        load_keras(p)


def test_zip_bomb(tmp_path):
    p = tmp_path / "bomb.keras"
    with zipfile.ZipFile(KERAS) as zin, zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            zout.writestr(item.filename, b"\0" * (64 << 20) if item.filename == "model.weights.h5" else data)
    with pytest.raises(ConversionError, match="would expand to .*zip bomb"):
        load_keras(p)


def test_duplicated_member(tmp_path):
    p = tmp_path / "twice.keras"
    shutil.copy(KERAS, p)
    with pytest.warns(UserWarning), zipfile.ZipFile(p, "a") as z:
        z.writestr("config.json", b"{}")
    with pytest.raises(ConversionError, match="holds 'config.json' more than once"):
        load_keras(p)


def test_config_not_json(tmp_path):
    p = tmp_path / "c.keras"
    _rewrite_zip(KERAS, p, lambda n, d: b"{not json" if n == "config.json" else d)
    with pytest.raises(ConversionError, match="config.json is not valid JSON"):
        load_keras(p)


def test_missing_weights_member(tmp_path):
    p = tmp_path / "w.keras"
    _rewrite_zip(KERAS, p, lambda n, d: None if n == "model.weights.h5" else d)
    with pytest.raises(ConversionError, match="the archive has no model.weights.h5"):
        load_keras(p)


def test_missing_dataset(tmp_path):
    p = tmp_path / "m.keras"
    data = _weights_h5_bytes(lambda f: f.__delitem__("layers/lstm/cell/vars/2"))
    _rewrite_zip(KERAS, p, lambda n, d: data if n == "model.weights.h5" else d)
    with pytest.raises(ConversionError, match=r"layer 'lstm': layers/lstm/cell/vars holds 2 weight\(s\); the config implies 3"):
        load_keras(p)


def test_wrong_weight_shape(tmp_path):
    p = tmp_path / "s.keras"

    def edit(f):
        del f["layers/lstm/cell/vars/1"]
        f["layers/lstm/cell/vars"].create_dataset("1", data=np.zeros((5, 24), np.float32))

    data = _weights_h5_bytes(edit)
    _rewrite_zip(KERAS, p, lambda n, d: data if n == "model.weights.h5" else d)
    with pytest.raises(ConversionError, match=r"layer 'lstm': LSTM\(units=6\) weights have shapes .*\(5, 24\).* the config implies"):
        load_keras(p)


def _edit_layers(src, dst, class_name, edit_layer):
    """Copies a .keras archive with edit_layer(entry) applied to every `class_name` layer entry of
    its config."""
    def edit(name, data):
        if name != "config.json":
            return data
        cfg = json.loads(data)
        for layer in cfg["config"]["layers"]:
            if layer["class_name"] == class_name:
                edit_layer(layer)
        return json.dumps(cfg).encode()

    _rewrite_zip(src, dst, edit)


def _set_layer_config(src, dst, class_name, **values):
    """Copies a .keras archive with `values` set in the config of every `class_name` layer."""
    _edit_layers(src, dst, class_name, lambda layer: layer["config"].update(values))


def test_config_disagrees_with_weights(tmp_path):
    p = tmp_path / "u.keras"
    _set_layer_config(KERAS, p, "Embedding", output_dim=9)
    with pytest.raises(ConversionError, match=r"layer 'embedding': weight .* has shape \(20, 8\); the config implies \(20, 9\)"):
        load_keras(p)


def test_absurd_declared_size(tmp_path):
    p = tmp_path / "big.keras"

    def edit(f):
        del f["layers/embedding/vars/0"]
        f["layers/embedding/vars"].create_dataset("0", shape=(1 << 20, 1 << 12), dtype=np.float32)  # 16 GB, never written

    data = _weights_h5_bytes(edit)
    _rewrite_zip(KERAS, p, lambda n, d: data if n == "model.weights.h5" else d)
    with pytest.raises(ConversionError, match=r"weight layers/embedding/vars/0 declares \(1048576, 4096\)"):
        load_keras(p)


def test_unsupported_layer(tmp_path):
    p = tmp_path / "x.keras"

    def edit(name, data):
        if name != "config.json":
            return data
        cfg = json.loads(data)
        cfg["config"]["layers"][2]["class_name"] = "MyAttention"
        return json.dumps(cfg).encode()

    _rewrite_zip(KERAS, p, edit)
    with pytest.raises(ConversionError, match=r"layer 'lstm': layer class not supported: MyAttention \(at "
                                              r"sequential/lstm\)\. .* custom_layers=\{'MyAttention': builder\}"):
        load_keras(p)


APPLICATIONS = os.path.join(DATA, "k3_applications_layers.keras")
APPLICATIONS_H5 = os.path.join(DATA, "tfk_applications_layers.h5")


def test_applications_class_names_of_other_modules_are_refused(tmp_path):
    """LayerScale and CustomScaleLayer convert as keras.applications defines them; a class of the
    same name from another module is the user's own, and its builder decides."""
    p = tmp_path / "own.keras"
    _edit_layers(APPLICATIONS, p, "LayerScale", lambda layer: layer.update(module="my_models.blocks"))
    with pytest.raises(ConversionError, match=r"layer class LayerScale of module 'my_models.blocks' is not "
                                              r"supported .* custom_layers=\{'LayerScale': builder\}"):
        load_keras(p)


@pytest.mark.parametrize("class_name,key", [("LayerScale", "axis"), ("Custom>CustomScaleLayer", "offset")])
def test_applications_class_names_with_other_configs_are_refused(tmp_path, class_name, key):
    """Legacy .h5 files record no module: a config with keys the application's class has not is
    refused, not converted as the application's class."""
    p = tmp_path / "own.h5"
    shutil.copy(APPLICATIONS_H5, p)
    with h5py.File(p, "r+") as f:
        cfg = json.loads(f.attrs["model_config"])
        for layer in cfg["config"]["layers"]:
            if layer["class_name"] == class_name:
                layer["config"][key] = 1
        f.attrs["model_config"] = json.dumps(cfg)
    with pytest.raises(ConversionError, match=rf"config has keys \['{key}'\] that keras.applications' "
                                              rf"{class_name.split('>')[-1]} has not"):
        load_keras(p)


def test_weights_only_needs_architecture():
    with pytest.raises(ConversionError, match="holds weights only; pass architecture="):
        load_keras(os.path.join(DATA, "k3_sequential.weights.h5"))


def test_json_model_config_given_as_the_model(tmp_path):
    """model.to_json()'s file holds no weights: as the model it is refused with what to do; as an
    architecture it must be a UTF-8 Keras model config."""
    arch = os.path.join(DATA, "tfk_sequential.json")
    with pytest.raises(ConversionError, match=r"tfk_sequential.json: holds a model config \(JSON\) and no weights: "
                                              r"load the weights file with this as its architecture"):
        load_keras(arch)
    weights = os.path.join(DATA, "tfk_sequential_weights.h5")
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"class_name": "Sequential", "config": {"name": "\xff"}}')
    with pytest.raises(ConversionError, match="bad.json: looks like a JSON model config but is not UTF-8 text"):
        load_keras(weights, architecture=bad)
    bad.write_text('{"config": {"layers": []}}')
    with pytest.raises(ConversionError, match=r"bad.json: the JSON does not describe a Keras model \(no class_name\)"):
        load_keras(weights, architecture=bad)
    bad.write_text('{"class_name": "Sequential", "config": ')
    with pytest.raises(ConversionError, match="bad.json: the model config is not valid JSON"):
        load_keras(weights, architecture=bad)


def test_legacy_weight_names_point_nowhere(tmp_path):
    p = tmp_path / "l.h5"
    shutil.copy(LEGACY, p)
    with h5py.File(p, "r+") as f:
        group = f["model_weights"][f["model_weights"].attrs["layer_names"][1]]
        names = [n if isinstance(n, bytes) else str(n).encode() for n in group.attrs["weight_names"]]
        names[0] = b"nowhere/kernel:0"
        group.attrs["weight_names"] = np.array(names, dtype="S")
    with pytest.raises(ConversionError, match="weight_names lists 'nowhere/kernel:0'"):
        load_keras(p)


def test_tf_keras_2_13_weights_tree_is_found(tmp_path):
    """tf.keras 2.13-2.15 wrote the .keras weights tree under `_layer_checkpoint_dependencies`
    instead of `layers` (Keras 3's loader renames the path the same way). A Keras 3 fixture with
    its tree renamed so must load to the same outputs."""
    def edit(f):
        f.move("layers", "_layer_checkpoint_dependencies")

    data = _weights_h5_bytes(edit)
    p = tmp_path / "tf213.keras"
    _rewrite_zip(KERAS, p, lambda n, d: data if n == "model.weights.h5" else d)
    expected = np.load(os.path.join(DATA, "k3_sequential.npz"))
    import torch

    with torch.no_grad():
        out = load_keras(p)(torch.as_tensor(expected["input_0"]))
    np.testing.assert_allclose(out.numpy(), expected["output_0"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tree", ["_layer_checkpoint_dependencies", "layers"])
def test_weights_tree_written_on_windows_is_found(tmp_path, tree):
    """tf.keras 2.13-2.15 on Windows joined the .keras weights tree's paths with os.path.join:
    each object's group sits at the root, named `_layer_checkpoint_dependencies\\lstm\\cell`,
    with its `vars` below it. A fixture rewritten so must load to the same outputs."""
    from fuzz_checkpoints import windows_tree

    p = tmp_path / "windows.keras"
    windows_tree(KERAS, str(p), tree)
    with zipfile.ZipFile(p) as z, h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as f:
        assert "layers" not in f and f"{tree}\\lstm\\cell" in f and "vars/0" in f[f"{tree}\\lstm\\cell"]
    expected = np.load(os.path.join(DATA, "k3_sequential.npz"))
    import torch

    with torch.no_grad():
        out = load_keras(p)(torch.as_tensor(expected["input_0"]))
    np.testing.assert_allclose(out.numpy(), expected["output_0"], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------
# hostile files: each class the parser boundary closes (keras/untrusted.py, keras/isolation.py)
# ------------------------------------------------------------------------------------------------
def _keras_with_weights(tmp_path, edit, name="h.keras"):
    p = tmp_path / name
    data = _weights_h5_bytes(edit)
    _rewrite_zip(KERAS, p, lambda n, d: data if n == "model.weights.h5" else d)
    return p


def _canary(tmp_path):
    canary = tmp_path / "secret.bin"
    canary.write_bytes(np.full(4096, 31337.0, np.float32).tobytes())
    return canary


def test_external_raw_storage_is_refused(tmp_path):
    canary = _canary(tmp_path)

    def edit(f):
        shape = f["layers/lstm/cell/vars/2"].shape
        del f["layers/lstm/cell/vars/2"]
        f["layers/lstm/cell/vars"].create_dataset("2", shape=shape, dtype="f4", external=[(str(canary), 0, 4 * shape[0])])

    with pytest.raises(ConversionError, match="keeps its data in external files"):
        load_keras(_keras_with_weights(tmp_path, edit))


def test_external_link_is_refused(tmp_path):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(24, np.float32)

    def edit(f):
        del f["layers/lstm/cell/vars/2"]
        f["layers/lstm/cell/vars"]["2"] = h5py.ExternalLink(str(other), "/x")

    with pytest.raises(ConversionError, match="external link to another file"):
        load_keras(_keras_with_weights(tmp_path, edit))


@pytest.mark.parametrize("source", ["present", "missing"])
def test_virtual_dataset_is_refused(tmp_path, source):
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.full(24, 31337.0, np.float32)

    def edit(f):
        del f["layers/lstm/cell/vars/2"]
        layout = h5py.VirtualLayout(shape=(24,), dtype="f4")
        layout[...] = h5py.VirtualSource(str(other) if source == "present" else "/nonexistent.h5", "x", shape=(24,))
        f["layers/lstm/cell/vars"].create_virtual_dataset("2", layout, fillvalue=0)

    with pytest.raises(ConversionError, match="virtual dataset"):
        load_keras(_keras_with_weights(tmp_path, edit))


@pytest.mark.parametrize("target", ["/layers/lstm", "/nowhere"])
def test_soft_links_are_refused(tmp_path, target):
    def edit(f):
        f["layers/lstm/cell/vars"]["loop"] = h5py.SoftLink(target)

    with pytest.raises(ConversionError, match="is a soft link"):
        load_keras(_keras_with_weights(tmp_path, edit))


def test_hard_link_cycle_is_refused(tmp_path):
    def edit(f):
        f["layers/lstm/cell"]["loop"] = f["layers/lstm"]

    with pytest.raises(ConversionError, match="already reached by another link"):
        load_keras(_keras_with_weights(tmp_path, edit))


def test_declared_but_unwritten_legacy_dataset(tmp_path):
    """(65536, 32768) floats declared in a small file: refused before anything is allocated."""
    p = tmp_path / "big.h5"
    shutil.copy(LEGACY, p)
    with h5py.File(p, "r+") as f:
        group = f["model_weights"]
        text = lambda n: n.decode() if isinstance(n, bytes) else str(n)  # noqa: E731
        layer = [text(n) for n in group.attrs["layer_names"] if len(group[text(n)].attrs["weight_names"])][0]
        first = text(group[layer].attrs["weight_names"][0])
        del group[layer][first]
        group[layer].create_dataset(first, shape=(65536, 32768), dtype="f4")
    with pytest.raises(ConversionError, match=r"declares \(65536, 32768\)"):
        load_keras(p)


def _patch_header(data: bytes, field_offset: int, fmt: str, value) -> bytes:
    import struct

    out = bytearray(data)
    for sig, shift in ((b"PK\x03\x04", 0), (b"PK\x01\x02", 2)):
        at = out.find(sig)
        while at >= 0:
            struct.pack_into(fmt, out, at + field_offset + shift, value)
            at = out.find(sig, at + 4)
    return bytes(out)


def test_zip_header_that_understates_the_size(tmp_path):
    """A deflated member of 256 MiB whose headers say 4 KiB: reading stops at the limit."""
    p = tmp_path / "lie.keras"
    with zipfile.ZipFile(KERAS) as zin, zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            zout.writestr(item.filename, b"\0" * (256 << 20) if item.filename == "model.weights.h5" else zin.read(item))
    p.write_bytes(_patch_header(p.read_bytes(), 22, "<I", 4096))
    with pytest.raises(ConversionError, match="decompresses beyond|cannot be read"):
        load_keras(p)


@pytest.mark.parametrize("field,value,message", [(6, 0x1, "is encrypted"), (8, 99, "compression method 99")])
def test_zip_flags_and_methods(tmp_path, field, value, message):
    p = tmp_path / "z.keras"
    p.write_bytes(_patch_header(open(KERAS, "rb").read(), field, "<H", value))
    with pytest.raises(ConversionError, match=message):
        load_keras(p)


def _keras_with_config(tmp_path, edit_text):
    p = tmp_path / "c.keras"
    _rewrite_zip(KERAS, p, lambda n, d: edit_text(d.decode()).encode("utf-8", "surrogatepass") if n == "config.json" else d)
    return p


@pytest.mark.parametrize("edit,message", [
    (lambda t: '{"a": ' * 5000 + "1" + "}" * 5000, "nests deeper"),
    (lambda t: t.replace('"lstm"', '"\\ud800"', 1), "lone surrogate"),
    (lambda t: t.replace('"units": 6', '"units": 1' + "0" * 5000, 1), "not valid JSON"),
    (lambda t: t.replace('"units": 6', '"units": 1e999', 1), r"units='inf'"),
    (lambda t: t.replace('"units": 6', '"units": "6"', 1), r"units='6'"),
    (lambda t: t.replace('"class_name": "LSTM"', '"class_name": 5', 1), "malformed layer entry"),
    (lambda t: t.replace('"return_sequences": false', '"return_sequences": [1]', 1), "return_sequences"),
    (lambda t: t.replace('"return_sequences": false', '"return_sequences": "yes"', 1), "return_sequences='yes'"),
    (lambda t: t.replace('"return_sequences": false', '"return_sequences": NaN', 1), "return_sequences='nan'"),
])
def test_config_values_of_the_wrong_type_or_range(tmp_path, edit, message):
    p = _keras_with_config(tmp_path, edit)
    assert p.read_bytes() != open(KERAS, "rb").read()
    with pytest.raises(ConversionError, match=message):
        load_keras(p)


def test_numbers_given_for_flags_are_read_by_truth(tmp_path):
    """Keras tests its flags by truth, and a file keeps what the user passed (a public checkpoint
    has stateful=-1): numbers read as Python reads them give Keras's outputs."""
    def edit(t):
        assert '"go_backwards": true' in t and '"return_sequences": true' in t
        return t.replace('"go_backwards": true', '"go_backwards": -1').replace('"return_sequences": true',
                                                                               '"return_sequences": 2')

    p = _keras_with_config(tmp_path, edit)
    expected = np.load(os.path.join(DATA, "k3_sequential.npz"))
    import torch

    with torch.no_grad():
        out = load_keras(p)(torch.as_tensor(expected["input_0"]))
    np.testing.assert_allclose(out.numpy(), expected["output_0"], atol=1e-5, rtol=1e-5)


def test_dense_bias_of_the_wrong_shape(tmp_path):
    def edit(f):
        dense = [k for k in f["layers"] if k.startswith("dense")][0]
        del f[f"layers/{dense}/vars/1"]
        f[f"layers/{dense}/vars"].create_dataset("1", data=np.float32(0.5))

    with pytest.raises(ConversionError, match=r"Dense weights have shapes .*\(\)"):
        load_keras(_keras_with_weights(tmp_path, edit))


def test_duplicated_layer_names_are_refused_quickly_and_briefly(tmp_path):
    import time

    p = tmp_path / "dup.h5"
    shutil.copy(LEGACY, p)
    with h5py.File(p, "r+") as f:
        names = list(f["model_weights"].attrs["layer_names"])
        dup = np.array(names * (20000 // len(names)), dtype="S")
        del f["model_weights"].attrs["layer_names"]
        for i, chunk in enumerate(np.array_split(dup, 20)):  # Keras's chunked form for long lists
            f["model_weights"].attrs[f"layer_names{i}"] = chunk
    start = time.perf_counter()
    with pytest.raises(ConversionError, match="more than once") as info:
        load_keras(p)
    assert time.perf_counter() - start < 5.0
    assert len(str(info.value)) < 500


def _looping_h5(tmp_path):
    """The legacy fixture with zeroed bytes in the global heap that holds model_config: libhdf5
    loops forever on them."""
    data = bytearray(open(LEGACY, "rb").read())
    at = data.find(b"GCOL")
    data[at + 16:at + 80] = b"\0" * 64
    p = tmp_path / "loop.h5"
    p.write_bytes(bytes(data))
    return p


def test_corrupted_global_heap_does_not_hang(tmp_path):
    with pytest.raises(ConversionError, match="global heap collection .* corrupted"):
        load_keras(_looping_h5(tmp_path))


def test_parser_time_limit(tmp_path, monkeypatch):
    """Whatever else loops inside the parser is stopped by the helper's time limit."""
    from cudnn_rnn.keras.files import isolation, untrusted

    monkeypatch.setenv("CUDNN_RNN_PARSE_TIMEOUT", "1")
    isolation.shutdown()
    monkeypatch.setattr(untrusted, "_parse_zip", lambda *a: time_sleep(60))
    try:
        with pytest.raises(ConversionError, match="did not finish within 1 s"):
            load_keras(KERAS)
    finally:
        isolation.shutdown()


def time_sleep(seconds):
    import time

    time.sleep(seconds)


def test_parser_crash_is_contained(tmp_path, monkeypatch):
    """A crash inside libhdf5 kills the helper, not the caller."""
    import signal

    from cudnn_rnn.keras.files import isolation, untrusted

    isolation.shutdown()
    monkeypatch.setattr(untrusted, "_parse_zip", lambda *a: os.kill(os.getpid(), signal.SIGSEGV))
    try:
        with pytest.raises(ConversionError, match=r"parser process died \(signal 11\)"):
            load_keras(KERAS)
    finally:
        isolation.shutdown()
    monkeypatch.undo()
    assert load_keras(KERAS) is not None  # a new helper serves the next load


def test_converted_file_with_an_expanded_tensor(tmp_path):
    import torch

    from cudnn_rnn.keras import load_converted, save_converted

    p = tmp_path / "m.pt"
    save_converted(load_keras(KERAS), p)
    data = torch.load(p, weights_only=True)
    key = sorted(data["state_dict"])[0]
    data["state_dict"][key] = torch.zeros(1).expand(1 << 16, 1 << 16)  # 16 GiB if materialised
    torch.save(data, p)
    with pytest.raises(ConversionError, match="repeats or overruns its storage"):
        load_converted(p)


def test_converted_file_with_malformed_kept_states(tmp_path):
    """A converted file's kept states (keras_states) that are not [path, float tensor] pairs, or
    that do not fit their layer, are refused naming what is wrong."""
    import torch

    from cudnn_rnn.keras import load_converted, save_converted

    stateful = os.path.join(os.path.dirname(KERAS), "tfk_stateful_saved_model")
    p = tmp_path / "m.pt"
    save_converted(load_keras(stateful), p)
    data = torch.load(p, weights_only=True)
    assert [pair[0] for pair in data["keras_states"]["lstm"]] == ["states/0", "states/1"]
    for bad, message in ((["states/0", torch.zeros(2, 4)], "not a list of \\[path, tensor\\] pairs"),
                         ([["states/0", torch.zeros(2, 4, dtype=torch.int64)]], "is not a float tensor"),
                         ([["states/0", torch.zeros(2, 4)], ["states/1", torch.zeros(2, 7)]],
                          "layer 'lstm'.*saved states do not fit the layer")):
        changed = dict(data, keras_states=dict(data["keras_states"], lstm=bad))
        torch.save(changed, p)
        with pytest.raises(ConversionError, match=message):
            load_converted(p)


def test_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe.keras"
    os.mkfifo(fifo)
    with pytest.raises(ConversionError, match="is not a regular file"):
        load_keras(fifo)


def test_directories_and_saved_models_are_named(tmp_path):
    """A directory that is not a SavedModel, and a SavedModel (or a file at its top) whose
    keras_metadata.pb is not a SavedMetadata message, get one error saying what they are."""
    saved = tmp_path / "saved"
    (saved / "variables").mkdir(parents=True)
    for name in ("saved_model.pb", "keras_metadata.pb"):
        (saved / name).write_bytes(b"\x08\x01")
    with pytest.raises(ConversionError, match=r"saved: keras_metadata.pb: a node has wire type 0; expected a length"):
        load_keras(saved)
    for name in ("saved_model.pb", "keras_metadata.pb"):
        with pytest.raises(ConversionError, match=r"saved: keras_metadata.pb: a node has wire type 0"):
            load_keras(saved / name)
    (saved / "keras_metadata.pb").write_bytes(b"\x0a\x05\x2a\x09")
    with pytest.raises(ConversionError, match=r"saved: keras_metadata.pb: a field's length runs past its message"):
        load_keras(saved)
    (saved / "keras_metadata.pb").write_bytes(b"")
    with pytest.raises(ConversionError, match=r"saved: keras_metadata.pb describes no root object"):
        load_keras(saved)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "model.keras").write_bytes(b"")
    with pytest.raises(ConversionError, match=r"folder: is a directory; expected a Keras file: .* \(it holds model\.keras\)"):
        load_keras(folder)


def test_sharded_weight_maps_are_checked(tmp_path):
    """A sharded-weights map (Keras 3's .weights.json) names shards beside it, each a Keras 3
    weights file; anything else is refused by name, and nothing is read from elsewhere."""
    shard = os.path.join(DATA, "k3_sequential.weights.h5")
    arch = os.path.join(DATA, "k3_sequential.keras")
    shutil.copy(shard, tmp_path / "w_00000.weights.h5")
    shutil.copy(os.path.join(DATA, "tfk_sequential_weights.h5"), tmp_path / "legacy.weights.h5")

    def refused(weight_map, match):
        (tmp_path / "w.weights.json").write_text(json.dumps(weight_map))
        with pytest.raises(ConversionError, match=match):
            load_keras(tmp_path / "w.weights.json", architecture=arch)

    refused({"weight_map": {"/layers/lstm/vars": ["../w_00000.weights.h5"]}}, "names the shard '../w_00000.weights.h5'")
    refused({"weight_map": {"/layers/lstm/vars": [shard]}}, "names the shard .*; expected a .weights.h5 file name")
    refused({"weight_map": {"/layers/lstm/vars": ["w.h5"]}}, "names the shard 'w.h5'")
    refused({"weight_map": {}}, "names no shards")
    refused({"weight_map": {"a": "a\u0000.weights.h5"}}, r"names the shard 'a\\x00\.weights\.h5'")
    refused({"weight_map": {"a": [f"s{i}.weights.h5" for i in range(10_001)]}}, "names more than 10000 shards")
    os.symlink(shard, tmp_path / "link.weights.h5")
    refused({"weight_map": {"a": ["link.weights.h5"]}}, r"shard link.weights.h5 lies outside .* \(a link to")
    refused({"metadata": {}}, "is not a Keras sharded-weights map")
    refused([1, 2], "is not a Keras sharded-weights map")
    refused({"weight_map": {"a": ["missing.weights.h5"]}}, r"missing.weights.h5: cannot be opened")
    refused({"weight_map": {"a": ["legacy.weights.h5"]}}, "shard legacy.weights.h5 is not a Keras 3 weights file")
    shutil.copy(shard, tmp_path / "w_00001.weights.h5")
    refused({"weight_map": {"a": ["w_00000.weights.h5"], "b": ["w_00001.weights.h5"]}},
            r"shard w_00001.weights.h5 holds layers/.* again")
    (tmp_path / "w.weights.json").write_text(json.dumps({"weight_map": {"a": ["w_00000.weights.h5"]}}))
    load_keras(tmp_path / "w.weights.json", architecture=arch)  # (the one shard holds every weight)


@pytest.mark.parametrize("name", ["k3_functional.keras", "tfk_sequential.h5", "tfk_cudnn.h5"])
def test_in_process_parsing_gives_the_same_model(name, monkeypatch, tmp_path):
    """CUDNN_RNN_PARSE_IN_PROCESS=1 (and platforms without fork) parse in the caller: same result,
    and the same checks (the known libhdf5 loop is named before libhdf5 reaches it)."""
    import torch

    isolated = load_keras(os.path.join(DATA, name))
    monkeypatch.setenv("CUDNN_RNN_PARSE_IN_PROCESS", "1")
    inline = load_keras(os.path.join(DATA, name))
    assert list(isolated.state_dict()) == list(inline.state_dict())
    for a, b in zip(isolated.state_dict().values(), inline.state_dict().values()):
        assert torch.equal(a, b)
    with pytest.raises(ConversionError, match="global heap collection .* corrupted"):
        load_keras(_looping_h5(tmp_path))


def test_a_helper_killed_from_outside_is_replaced():
    import signal

    from cudnn_rnn.keras.files import isolation

    load_keras(KERAS)
    helper = isolation._HELPER
    assert helper is not None and helper.pid  # Linux: the parse runs in the forked helper
    os.kill(helper.pid, signal.SIGKILL)
    assert load_keras(KERAS) is not None
    assert isolation._HELPER.pid != helper.pid


def test_normalization_weights_that_would_broadcast(tmp_path):
    """LayerNormalization gamma/beta of shape (1,) agree with each other but not with the input."""
    p = tmp_path / "ln.keras"
    data = open(os.path.join(DATA, "k3_functional.keras"), "rb").read()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        h5 = z.read("model.weights.h5")
    buf = io.BytesIO(h5)
    with h5py.File(buf, "r+") as f:
        group = f["layers/layer_normalization/vars"]
        for key in list(group):
            del group[key]
            group.create_dataset(key, data=np.ones(1, np.float32))
    _rewrite_zip(os.path.join(DATA, "k3_functional.keras"), p,
                 lambda n, d: buf.getvalue() if n == "model.weights.h5" else d)
    with pytest.raises(ConversionError, match=r"does not run on inputs of its declared shape.*weights have shape \(1,\)"):
        load_keras(p)


def _declare_time(src, dst, steps):
    """Copies a .keras archive whose inputs are declared `steps` long."""
    def declare(layer):
        c = layer["config"]
        key = "batch_shape" if "batch_shape" in c else "batch_input_shape"
        c[key] = [None, steps] + c[key][2:]

    _edit_layers(src, dst, "InputLayer", declare)


_HUGE_TRIAL = """
import re, resource, sys
import cudnn_rnn
from cudnn_rnn.keras import load_keras
vm = int(re.search(r"VmSize:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) << 10
resource.setrlimit(resource.RLIMIT_AS, (vm + (4 << 30), resource.RLIM_INFINITY))  # a regression fails, not the machine
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = load_keras(sys.argv[1])
print("loaded", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10, "MiB")
"""


def test_huge_declared_shape_is_checked_without_allocating_it(tmp_path):
    """The attention fixture with its inputs declared 32768 steps long: run on inputs of that
    shape, its attention scores are 2 x 32768^2 floats (8 GiB), from a file of a few hundred KB.
    load_keras's trial run may not allocate that in the caller's process: it checks the shapes on
    fake tensors instead, and the model loads."""
    import subprocess
    import sys
    p = tmp_path / "long.keras"
    _declare_time(os.path.join(DATA, "tfk_attention.keras"), p, 32768)
    run = subprocess.run([sys.executable, "-c", _HUGE_TRIAL, str(p)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    grown = int(run.stdout.split()[-2])
    assert grown < 1024, run.stdout


def test_trial_on_fake_tensors_still_checks(tmp_path, monkeypatch):
    """With every tensor over the trial's limit, the check runs on fake tensors: the same model
    loads (same outputs), and a config the weights cannot run is still refused."""
    import torch
    from cudnn_rnn.keras import load as load_module
    x = torch.randint(1, 20, (3, 6))
    real = load_keras(KERAS)
    monkeypatch.setattr(load_module, "TRIAL_TENSOR_BYTES", 64)
    faked = load_keras(KERAS)
    with torch.no_grad():
        assert torch.equal(faked(x), real(x))

    p = tmp_path / "flat.keras"
    _set_layer_config(KERAS, p, "LSTM", return_sequences=False)  # the Bidirectional after it needs sequences
    with pytest.raises(ConversionError, match=r"layer 'bidirectional': the converted model does not run on inputs of "
                                              r"its declared shape .*: the layer raised ValueError: x must have shape"):
        load_keras(p)


def test_bytes_path(tmp_path):
    import torch
    x = torch.randint(1, 20, (2, 6))
    with torch.no_grad():
        assert torch.equal(load_keras(os.fsencode(KERAS))(x), load_keras(KERAS)(x))
    with pytest.raises(ConversionError, match=r"nope.keras: cannot be opened"):
        load_keras(os.fsencode(tmp_path / "nope.keras"))


def test_keras_1_file_is_named_as_such(tmp_path):
    p = tmp_path / "old.h5"
    shutil.copy(LEGACY, p)
    with h5py.File(p, "r+") as f:
        f.attrs["keras_version"] = b"1.2.2"
    with pytest.raises(ConversionError, match=r"old.h5: was saved by Keras 1.2.2; Keras 1 files are not supported"):
        load_keras(p)


def _opaque_weight(f, size, tag, attr):
    """Replaces the LSTM's bias (24 float32 values) with 24 HDF5 opaque elements of `size` bytes,
    tagged `tag`, with a dtype attribute `attr` (None: none)."""
    del f["layers/lstm/cell/vars/2"]
    tid = h5py.h5t.create(h5py.h5t.OPAQUE, size)
    tid.set_tag(tag)
    dsid = h5py.h5d.create(f["layers/lstm/cell/vars"].id, b"2", tid, h5py.h5s.create_simple((24,)))
    dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.full(24 * size, 0x41, np.uint8).view(f"V{size}"), mtype=tid)
    if attr is not None:
        h5py.AttributeManager(h5py.Dataset(dsid))["dtype"] = attr


@pytest.mark.parametrize("size,tag,attr,message", [
    (8, b"NUMPY:V2", "bfloat16", "non-numeric dtype"),     # a tag claiming 2-byte elements over 8-byte ones
    (2, b"NUMPY:V2", None, "non-numeric dtype"),           # 2-byte opaque without Keras's bfloat16 tag
    (2, b"NUMPY:V2", "float16", "non-numeric dtype"),
    (4, b"NUMPY:V4", "bfloat16", "non-numeric dtype"),
])
def test_opaque_weights_other_than_keras_bfloat16_are_refused(tmp_path, size, tag, attr, message):
    """Keras 3's bfloat16 variables (2-byte opaque data tagged dtype="bfloat16") load; any other
    opaque dataset is refused before a byte of it is read into a buffer sized for something else
    (h5py takes an opaque type's numpy dtype from its tag, which the file writes)."""
    with pytest.raises(ConversionError, match=message):
        load_keras(_keras_with_weights(tmp_path, lambda f: _opaque_weight(f, size, tag, attr)))


def test_keras_bfloat16_weight_loads_as_its_values(tmp_path):
    """The tagged 2-byte opaque form itself: each 16-bit pattern is the top half of a float32."""
    def edit(f):
        _opaque_weight(f, 2, b"NUMPY:V2", "bfloat16")

    model = load_keras(_keras_with_weights(tmp_path, edit))
    bias = next(p for n, p in model.named_parameters() if n.endswith("bias") and "lstm" in n)
    expected = np.full(24, 0x4141 << 16, np.uint32).view(np.float32)   # 12.0625 each
    np.testing.assert_array_equal(bias.detach().numpy(), expected)


TF_OPS = os.path.join(DATA, "tfk_more_tf_ops.keras")


OPERATIONS = os.path.join(DATA, "k3_operations.keras")


@pytest.mark.parametrize("src,old,new,message", [
    # tf.keras's constant first argument belongs to recorded TensorFlow calls only
    (TF_OPS, '[["input_1", 0, 0, {}]]', '[["_CONSTANT_VALUE", -1, 2.0, {}]]', r"constant input 2.0 to a GRU layer"),
    (TF_OPS, '"_CONSTANT_VALUE", -1, 2.0', '"_CONSTANT_VALUE", -1, "' + "x" * 60 + '"', "too long"),
    (TF_OPS, '"_CONSTANT_VALUE", -1, 2.0', '"_CONSTANT_VALUE", -1, {"a": 1}', "not supported"),
    (TF_OPS, '"indices": [3, 0, 2]', '"indices": [3, 0, 99]', "does not run"),
    # constant tensor arguments (Keras writes their values): numbers of a known dtype only
    (OPERATIONS, '"value": [5, 0, 2], "dtype": "int64"', '"value": [5, "a", 2], "dtype": "int64"', "is not an array of numbers"),
    (OPERATIONS, '"value": [5, 0, 2], "dtype": "int64"', '"value": [[5, 0], [2]], "dtype": "int64"', "is not an array of numbers"),
    (OPERATIONS, '"value": [5, 0, 2], "dtype": "int64"', '"value": [5, 0, 2], "dtype": "complex64"', "expected one of"),
    (OPERATIONS, '"value": [5, 0, 2], "dtype": "int64"', '"value": [5, 0, 99], "dtype": "int64"', "does not run"),
    (OPERATIONS, '"value": [0.0, 0.1', '"value": [NaN, 0.1', "not finite"),
    (OPERATIONS, '"value": [5, 0, 2], "dtype": "int64"', '"value": ' + str([[0] * 1100] * 1000) + ', "dtype": "int64"', "too large"),
    # a keyword argument the operation does not take
    (OPERATIONS, '"kwargs": {"weights": {', '"kwargs": {"bogus": 1, "weights": {', r"keyword arguments \['bogus', 'weights'\]"),
])
def test_hostile_call_arguments(tmp_path, src, old, new, message):
    """Recorded calls' arguments as a hostile file writes them: each refused naming the file."""
    p = tmp_path / "c.keras"

    def edit(name, data):
        if name != "config.json":
            return data
        text = data.decode()
        assert old in text
        return text.replace(old, new, 1).encode()

    _rewrite_zip(src, p, edit)
    with pytest.raises(ConversionError, match=message) as e:
        load_keras(p)
    assert str(p) in str(e.value)
