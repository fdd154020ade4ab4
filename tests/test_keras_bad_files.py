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


def test_config_disagrees_with_weights(tmp_path):
    p = tmp_path / "u.keras"

    def edit(name, data):
        if name != "config.json":
            return data
        cfg = json.loads(data)
        for layer in cfg["config"]["layers"]:
            if layer["class_name"] == "Embedding":
                layer["config"]["output_dim"] = 9
        return json.dumps(cfg).encode()

    _rewrite_zip(KERAS, p, edit)
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
        cfg["config"]["layers"][2]["class_name"] = "ConvLSTM1D"
        return json.dumps(cfg).encode()

    _rewrite_zip(KERAS, p, edit)
    with pytest.raises(ConversionError, match=r"layer 'lstm': layer class ConvLSTM1D is not supported \(at sequential/lstm"):
        load_keras(p)


def test_weights_only_needs_architecture():
    with pytest.raises(ConversionError, match="holds weights only; pass architecture="):
        load_keras(os.path.join(DATA, "k3_sequential.weights.h5"))


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
