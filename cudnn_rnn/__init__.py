"""Keras-exact recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional, ConvLSTM1D/2D/3D) for PyTorch, run
in C++."""
import torch  # noqa: F401  (loads libtorch, which _C links against)

from ._compat import load_extension

_C = load_extension()  # the native extension, or one ImportError saying how to rebuild it

from . import ops  # noqa: E402
from .explain import Explanation, explain
from .keras import ConversionError, load_keras, save_keras
from .conv_lstm import ConvLSTM1D, ConvLSTM2D, ConvLSTM3D
from .layers import GRU, LSTM, Bidirectional, SimpleRNN, from_torch, to_torch

__version__ = "0.1.0"


def set_cudnn_algorithm(name: str) -> None:
    """The cuDNN RNN algorithm to use: "standard" (the default), "auto" (PERSIST_STATIC_SMALL_H
    for float16/float32 with hidden size <= 128 (<= 256 for SimpleRNN) and no mask, else
    STANDARD), "persist_static" or "persist_static_small_h" (where their constraints hold).
    A persistent algorithm cuDNN refuses for a configuration falls back to STANDARD."""
    _C.set_cudnn_algorithm(name)


def cudnn_algorithm() -> str:
    return _C.cudnn_algorithm()


def cudnn_fallback_count() -> int:
    """How many calls on CUDA tensors ran on the generic CUDA backend instead of cuDNN (a
    silent fallback would be a bug; explain() says why a layer cannot use cuDNN)."""
    return int(_C.cudnn_fallback_count())


def empty_cpu_cache() -> None:
    """Frees the large CPU buffers the CPU backend keeps for reuse between calls (at most
    CUDNN_RNN_CPU_CACHE_MB, default 512 MiB, sit idle; 0 disables the cache)."""
    _C.empty_cpu_cache()


def build_info() -> dict:
    """What the native extension was compiled with (CUDA / cuDNN versions, or 'no')."""
    return dict(_C.build_info())


__all__ = ["LSTM", "GRU", "SimpleRNN", "Bidirectional", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D", "explain", "Explanation", "from_torch", "to_torch",
           "build_info", "set_cudnn_algorithm", "cudnn_algorithm", "cudnn_fallback_count", "empty_cpu_cache", "ops", "load_keras", "save_keras", "ConversionError"]
