"""Keras-exact recurrent layers (LSTM, GRU, SimpleRNN, Bidirectional, ConvLSTM1D/2D/3D) for PyTorch, run
in C++."""
from typing import Optional

import torch  # noqa: F401  (loads libtorch, which _C links against)

from ._compat import load_extension

_C = load_extension()  # the native extension, or one ImportError saying how to rebuild it

from . import ops  # noqa: E402
from .explain import Explanation, explain
from .keras import ConversionError, load_keras, save_keras
from .conv_lstm import ConvLSTM1D, ConvLSTM2D, ConvLSTM3D
from .layers import GRU, LSTM, Bidirectional, SimpleRNN, from_torch, to_torch
from .quantization import Int8Linear, int8_available, quantize_dynamic

__version__ = "0.1.0"


def set_cudnn_algorithm(name: str) -> None:
    """Chooses the cuDNN RNN algorithm, process-wide.

    Args:
        name (str): ``"auto"`` (the default: PERSIST_STATIC_SMALL_H for an LSTM in float16 /
            float32 with hidden size <= 128 and no mask; else STANDARD), ``"standard"``,
            ``"persist_static"`` or ``"persist_static_small_h"`` (where their constraints hold:
            hidden size <= 128, or <= 256 for SimpleRNN). A persistent algorithm cuDNN refuses
            for a configuration falls back to STANDARD. On an H200 (cuDNN 9.19) the persistent
            GRU and SimpleRNN kernels gave float32 weight gradients up to 8e-5 away from the
            CPU backend's (STANDARD: within 2e-5), which is why ``"auto"`` leaves them out. On an H200 (cuDNN 9.19), ``"auto"`` ran an LSTM with B=1, T=50,
            H=128 4.4x faster forward and 1.8x faster forward+backward than ``"standard"``.

    Example:
        >>> cudnn_rnn.set_cudnn_algorithm("standard")
        >>> cudnn_rnn.cudnn_algorithm()
        'standard'
        >>> cudnn_rnn.set_cudnn_algorithm("auto")
    """
    _C.set_cudnn_algorithm(name)


def cudnn_algorithm() -> str:
    """The cuDNN RNN algorithm :func:`set_cudnn_algorithm` chose.

    Returns:
        str: ``"auto"`` unless set otherwise.
    """
    return _C.cudnn_algorithm()


def cudnn_fallback_count() -> int:
    """How many calls on CUDA tensors ran on the generic CUDA backend instead of cuDNN since the
    process started (:func:`explain` says why a layer cannot use cuDNN).

    Returns:
        int: the count (0 in a CPU-only build).
    """
    return int(_C.cudnn_fallback_count())


def empty_cache() -> None:
    """Frees what the package keeps between calls, on the CPU and on CUDA devices.

    That is :func:`empty_cpu_cache`'s buffers and packed weights, and the packed cuDNN weight
    spaces that inference on a GPU keeps while the weight tensors are unchanged
    (``CUDNN_RNN_CUDA_WEIGHT_CACHE=0`` disables them). Call it after writing weights in a way the
    version counter does not see (through ``.data``, DLPack or another library).

    Example:
        >>> cudnn_rnn.empty_cache()
    """
    _C.empty_cpu_cache()
    _C.empty_cuda_cache()


def empty_cpu_cache() -> None:
    """Frees what the CPU backend keeps between calls.

    That is its idle large buffers (at most ``CUDNN_RNN_CPU_CACHE_MB``, default 512 MiB; 0
    disables the pool) and the packed forms of the weights it multiplies by, kept while the weight
    tensors are unchanged as their version counters say (``CUDNN_RNN_CPU_WEIGHT_CACHE=0``
    disables them). Call it after writing weights in a way the version counter does not see
    (through ``.data``).

    Example:
        >>> cudnn_rnn.empty_cpu_cache()
    """
    _C.empty_cpu_cache()


def set_cpu_plan(gemm: Optional[str] = None, split: Optional[str] = None) -> None:
    """Forces how the CPU backend runs its time loops, process-wide (for measurement and
    reproducibility; each choice is deterministic on its own).

    Args:
        gemm (str, optional): the float32 GEMM engine: ``"packed"`` (the extension's AVX-512 /
            AVX2 kernel), ``"brgemm"`` (oneDNN's micro-kernel), ``"blas"`` (MKL), or ``"auto"``
            (the machine's default, as the environment variable CUDNN_RNN_CPU_GEMM would set it).
            ``None`` leaves it as it is.
        split (str, optional): how each step is split across threads: ``"units"`` (unit blocks,
            a barrier a step), ``"rows"`` (batch-row groups, no barrier; the packed or BLAS
            engine, or int8 inference) or ``"auto"`` (the cost model: rows where the recurrent
            kernel fits a quarter of L2, or from 4 rows a thread (12 on cores with full-width
            AVX-512) up to 8 L2). ``None`` leaves it as it is.

    Example:
        >>> cudnn_rnn.set_cpu_plan(split="units")
        >>> cudnn_rnn.set_cpu_plan(gemm="auto", split="auto")  # back to the defaults
    """
    for name, value in (("gemm", gemm), ("split", split)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None; got {type(value).__name__}")
    _C.set_cpu_plan(gemm or "", split or "")


def build_info() -> dict:
    """What the native extension was built with and what it runs on this machine.

    Returns:
        dict: in words, the torch it was built against and the running one, the CUDA and cuDNN
        versions (or ``"no"``), the CUDA architectures, OpenMP, and the CPU paths this machine
        takes (cell-loop instruction set, float32 GEMM engine, bfloat16 GEMMs).

    Example:
        >>> cudnn_rnn.build_info()["cpu_cell_loops"] in ("avx512", "avx2", "baseline")
        True
    """
    from ._compat import _built_against

    info = {"torch_running": torch.__version__}
    built = _built_against() or {}
    info.update({k: v for k, v in (("torch_built_against", built.get("torch")),
                                   ("cuda_arches", built.get("cuda_arches")),
                                   ("openmp", built.get("openmp"))) if v is not None})
    native = dict(_C.build_info())
    if native.get("cuda", "no").isdigit():  # CUDART_VERSION, CUDNN_VERSION as numbers
        v = int(native["cuda"])
        native["cuda"] = f"{v // 1000}.{v % 1000 // 10}"
        for key in ("cudnn", "cudnn_runtime"):
            if native.get(key, "").isdigit():
                v = int(native[key])
                native[key] = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    info.update(native)
    info["cpu_cell_loops"] = _C.cpu_loops_isa()
    info["cpu_float32_gemms"] = _C.cpu_gemm_engine()
    info["cpu_packed_gemm_build"] = _C.cpu_packed_gemm_isa()
    info["cpu_bfloat16_gemms"] = {"onednn": "bfloat16 (oneDNN brgemm, AMX)",
                                  "avx512_bf16": "bfloat16 (AVX512_BF16 kernel)"}.get(
        _C.cpu_bf16_gemm_kernel(), "float32 (no AMX / AVX512_BF16)")
    return info


__all__ = ["LSTM", "GRU", "SimpleRNN", "Bidirectional", "quantize_dynamic", "set_cpu_plan", "Int8Linear", "int8_available", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D", "explain", "Explanation", "from_torch", "to_torch",
           "build_info", "set_cudnn_algorithm", "cudnn_algorithm", "cudnn_fallback_count", "empty_cpu_cache", "empty_cache", "ops", "load_keras", "save_keras", "ConversionError"]
