"""A model with a layer of its own class (here a Bahdanau-style attention pooling with its own
weights and a Dense sub-layer, as seq2seq code on GitHub writes it): load_keras names the missing
class and where it is, and with custom_layers={"AttentionPooling": builder} the model converts
whole and matches Keras 3 itself, in every Keras 3 format; save_converted / load_converted take the
same builders."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)
from keras import layers

from cudnn_rnn.keras import ConversionError, load_converted, load_keras, save_converted
import cudnn_rnn

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, T = 3, 6


@keras.saving.register_keras_serializable(package="cudnn_rnn_tests")
class AttentionPooling(layers.Layer):
    """score_t = v . tanh(W h_t + b) (W, b in a Dense sub-layer), masked softmax over time, then
    the weighted sum of h_t scaled by a learned gain."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.supports_masking = True
        self.proj = layers.Dense(units, activation="tanh")

    def build(self, input_shape):
        self.proj.build(input_shape)
        self.v = self.add_weight(shape=(self.units,), name="v")
        self.gain = self.add_weight(shape=(), name="gain")

    def call(self, h, mask=None):
        score = keras.ops.sum(self.proj(h) * self.v, axis=-1)
        if mask is not None:
            score = keras.ops.where(mask, score, -1e9)
        alpha = keras.ops.softmax(score, axis=-1)
        return self.gain * keras.ops.sum(h * alpha[..., None], axis=1)

    def compute_mask(self, inputs, mask=None):
        return None

    def get_config(self):
        return {**super().get_config(), "units": self.units}


class TorchAttentionPooling(nn.Module):
    def __init__(self, config, weights):
        super().__init__()
        # Keras order: own variables (v, gain), then the Dense sub-layer's (kernel, bias)
        v, gain, kernel, bias = (torch.as_tensor(w) for w in weights)
        assert kernel.shape[1] == config["units"]
        self.v, self.gain = nn.Parameter(v), nn.Parameter(gain)
        self.kernel, self.bias = nn.Parameter(kernel), nn.Parameter(bias)

    def forward(self, h, mask=None):
        score = (torch.tanh(h @ self.kernel + self.bias) * self.v).sum(-1)
        if mask is not None:
            score = torch.where(mask, score, torch.full_like(score, -1e9))
        return self.gain * (h * torch.softmax(score, -1)[..., None]).sum(1)


BUILDERS = {"AttentionPooling": TorchAttentionPooling}


def _model(seed=0):
    rng = np.random.RandomState(seed)
    inp = keras.Input((T,), dtype="int32")
    h = layers.Embedding(10, 4, mask_zero=True)(inp)
    h = layers.Bidirectional(layers.LSTM(3, return_sequences=True))(h)
    out = layers.Dense(2)(AttentionPooling(5, name="attend")(h))
    model = keras.Model(inp, out, name="tagger")
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.randint(1, 10, size=(B, T)).astype("int32")
    x[1, 4:] = 0
    x[2, :2] = 0
    return model, x


@pytest.mark.keras
def test_custom_layer_builder_converts_the_model_whole(tmp_path):
    model, x = _model()
    expected = keras.ops.convert_to_numpy(model(x))
    model.save(tmp_path / "m.keras")
    model.save(tmp_path / "m.h5")
    model.save_weights(tmp_path / "m.weights.h5")
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.h5", None),
                       (tmp_path / "m.weights.h5", str(tmp_path / "m.keras"))):
        ours = load_keras(path, architecture=arch, custom_layers=BUILDERS)
        with torch.no_grad():
            y = ours(torch.as_tensor(x)).numpy()
        np.testing.assert_allclose(y, expected, atol=1e-5, rtol=1e-5, err_msg=path.name)
    assert isinstance(ours.layers["attend"].module, TorchAttentionPooling)

    save_converted(ours, tmp_path / "m.pt")
    again = load_converted(tmp_path / "m.pt", custom_layers=BUILDERS)
    torch.testing.assert_close(again(torch.as_tensor(x)), ours(torch.as_tensor(x)), rtol=0, atol=0)
    with pytest.raises(ConversionError, match="not supported: AttentionPooling"):
        load_converted(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="layer 'attend' \\(AttentionPooling\\) was built by a custom_layers builder"):
        cudnn_rnn.save_keras(ours, tmp_path / "back.keras")


@pytest.mark.keras
def test_missing_classes_are_all_named_with_their_places(tmp_path):
    model, _ = _model()
    model.save(tmp_path / "m.keras")
    with pytest.raises(ConversionError) as info:
        load_keras(tmp_path / "m.keras")
    message = str(info.value)
    assert "layer 'attend': layer class not supported: AttentionPooling (at tagger/attend)" in message, message
    assert "custom_layers={'AttentionPooling': builder}" in message
    out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "inspect", str(tmp_path / "m.keras")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and "not supported: AttentionPooling (at tagger/attend)" in out.stderr, out.stderr


@pytest.mark.keras
def test_builder_failures_and_wrong_returns_name_the_class(tmp_path):
    model, x = _model()
    model.save(tmp_path / "m.keras")

    def broken(config, weights):
        raise KeyError("units2")

    with pytest.raises(ConversionError, match=r"the custom_layers builder for AttentionPooling failed \(KeyError"):
        load_keras(tmp_path / "m.keras", custom_layers={"AttentionPooling": broken})
    with pytest.raises(ConversionError, match="returned list; expected a torch.nn.Module"):
        load_keras(tmp_path / "m.keras", custom_layers={"AttentionPooling": lambda c, w: w})
    with pytest.raises(TypeError, match="custom_layers must map class names"):
        load_keras(tmp_path / "m.keras", custom_layers={"AttentionPooling": "not callable"})
    # a module computing the wrong shape is caught by the trial run, as any config / weights mismatch
    with pytest.raises(ConversionError, match="does not run on inputs of its declared shape"):
        load_keras(tmp_path / "m.keras", custom_layers={"AttentionPooling": lambda c, w: nn.Linear(2, 2)})


@pytest.mark.keras
def test_registered_names_and_configs_without_trainable(tmp_path):
    """The key may be the registered name ("package>Class") for a .keras file too; a legacy .h5
    layer whose get_config skipped super() (no `trainable`) is still a layer, not a Keras op."""
    model, x = _model()
    model.save(tmp_path / "m.keras")
    expected = keras.ops.convert_to_numpy(model(x))
    ours = load_keras(tmp_path / "m.keras", custom_layers={"cudnn_rnn_tests>AttentionPooling": TorchAttentionPooling})
    with torch.no_grad():
        np.testing.assert_allclose(ours(torch.as_tensor(x)).numpy(), expected, atol=1e-5, rtol=1e-5)
    model.save(tmp_path / "m.h5")
    import h5py
    import json as _json

    with h5py.File(tmp_path / "m.h5", "r+") as f:
        config = _json.loads(f.attrs["model_config"])
        layer = next(l for l in config["config"]["layers"] if "AttentionPooling" in l["class_name"])
        layer["config"] = {"name": layer["config"]["name"], "units": layer["config"]["units"]}
        f.attrs["model_config"] = _json.dumps(config)
    ours = load_keras(tmp_path / "m.h5", custom_layers=BUILDERS)
    with torch.no_grad():
        np.testing.assert_allclose(ours(torch.as_tensor(x)).numpy(), expected, atol=1e-5, rtol=1e-5)


class TorchDense(nn.Module):
    def __init__(self, config, weights):
        super().__init__()
        self.kernel, self.bias = (nn.Parameter(torch.as_tensor(w)) for w in weights)
        assert config["activation"] == "tanh"

    def forward(self, x):
        return torch.tanh(x @ self.kernel + self.bias)


def test_custom_class_named_like_the_layers_group_in_tf_keras_213():
    """tf.keras 2.13 wrote a .keras file's weights under _layer_checkpoint_dependencies/<snake-case
    class>: a class whose name holds "layers" (HiddenLayers, group hidden_layers) keeps that part of
    its path (fixture from tests/fixtures/make_older_keras_fixtures.py, section
    tf_keras_213_custom_class; its outputs are tf.keras 2.13.1's)."""
    data = os.path.join(ROOT, "tests", "fixtures", "data")
    stored = np.load(os.path.join(data, "tfk2.13.1_custom_class.npz"))
    ours = load_keras(os.path.join(data, "tfk2.13.1_custom_class.keras"), custom_layers={"HiddenLayers": TorchDense})
    with torch.no_grad():
        out = ours(torch.as_tensor(stored["input_0"])).numpy()
    np.testing.assert_allclose(out, stored["output_0"], atol=1e-6, rtol=1e-5)
