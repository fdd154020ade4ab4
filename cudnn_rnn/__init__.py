"""Keras-exact recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional) for PyTorch, run in C++."""
import torch  # noqa: F401  (loads libtorch, which _C links against)

from . import _C, ops
from .explain import Explanation, explain
from .keras import ConversionError, load_keras, save_keras
from .layers import GRU, LSTM, Bidirectional, SimpleRNN
from .torch_conversion import from_torch, to_torch

__version__ = "0.1.0"


def build_info() -> dict:
    """What the native extension was compiled with (CUDA / cuDNN versions, or 'no')."""
    return dict(_C.build_info())


__all__ = ["LSTM", "GRU", "SimpleRNN", "Bidirectional", "explain", "Explanation", "from_torch", "to_torch",
           "build_info", "ops", "load_keras", "save_keras", "ConversionError"]
