import getpass
import os
import sys
import tempfile

# torch.compile's kernel cache (/tmp/torchinductor_<user>) is not keyed on ATen's instruction-set
# level: kernels compiled under ATEN_CPU_CAPABILITY=avx2 and then reused at the AVX-512 level gave
# a plain Linear-ReLU-Linear model wrong outputs and corrupted the heap (torch 2.14.1, Intel Xeon;
# a fresh cache gave the right ones). Each level gets a cache of its own unless the caller chose one.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    tempfile.gettempdir(),
    f"torchinductor_{getpass.getuser()}_cudnn_rnn_{os.environ.get('ATEN_CPU_CAPABILITY', 'default').lower()}"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")
# Keras, the oracle, computes on the CPU in full float32. On a machine with a GPU its torch backend
# would place every layer on CUDA, where torch runs convolutions in TF32 (cudnn.allow_tf32 is on by
# default): a ConvLSTM2D then differs from float32 by about 5e-4 (NVIDIA H100, torch 2.11).
os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")

# NaN never passes for agreement: numpy's assert_allclose counts NaN == NaN by default, so two
# oracles that both compute NaN (a BatchNormalization given a negative variance, say) would
# "agree". Every comparison in the suite is strict unless it says equal_nan=True itself.
_assert_allclose = np.testing.assert_allclose


def _assert_allclose_strict(actual, desired, *args, equal_nan=False, **kwargs):
    return _assert_allclose(actual, desired, *args, equal_nan=equal_nan, **kwargs)


np.testing.assert_allclose = _assert_allclose_strict


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine has none")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
