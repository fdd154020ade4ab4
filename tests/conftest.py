import os
import sys

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("KERAS_BACKEND", "torch")

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
