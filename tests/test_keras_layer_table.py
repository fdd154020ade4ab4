"""docs/keras-layers.md places every class keras.layers has (converted, converted inside RNN, or
refused with a reason) and is what scripts/keras_layer_table.py writes from the registry."""
import importlib.util
import os

import pytest

from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _table_module():
    spec = importlib.util.spec_from_file_location("keras_layer_table", os.path.join(ROOT, "scripts",
                                                                                    "keras_layer_table.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.keras
def test_every_keras_layer_class_is_placed():
    unplaced = [name for name, _, status, _ in _table_module().rows() if status is None]
    assert not unplaced, f"keras.layers classes neither converted nor refused with a reason: {unplaced}"


@pytest.mark.keras
def test_the_committed_table_is_current():
    module = _table_module()
    with open(module.PAGE) as f:
        committed = f.read()
    assert committed == module.page(), "docs/keras-layers.md is stale: run scripts/keras_layer_table.py"


def test_a_refused_class_is_named_with_its_reason(tmp_path):
    from cudnn_rnn.keras import ConversionError, load_keras

    config = {"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [None, 4], "name": "in"}},
        {"class_name": "TFSMLayer", "config": {"name": "lookup", "trainable": True}}]}}
    path = tmp_path / "w.weights.h5"
    import h5py
    with h5py.File(path, "w") as f:
        f.create_group("layers")
    with pytest.raises(ConversionError, match=r"TFSMLayer \(at s/lookup: it wraps a TensorFlow SavedModel.*custom_layers"):
        load_keras(path, architecture=config)
