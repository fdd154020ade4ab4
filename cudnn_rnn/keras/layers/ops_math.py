"""keras.ops's updates (keras.src.ops.core: slice_update, scatter_update, scatter,
saturate_cast), Fourier transforms and segment reductions (keras.src.ops.math) and matrix
decompositions (keras.src.ops.linalg). Each entry of MATH_OPS is a builder (config, context) ->
(function, description); the function takes the call's arguments by the names Keras's `call`
gives them. A complex result comes out as Keras gives it: a (real, imaginary) pair of float
tensors."""
from __future__ import annotations

import builtins
import math
from typing import Callable, Dict

import torch

from .op_args import dtype_arg, fixed
from .values import MAX_SIZE, Values


_MAX_RESULT = 1 << 26  # values of a result whose size a config or a constant sets


def _index_tensor(value, like: torch.Tensor) -> torch.Tensor:
    """An index argument (a recorded list or a tensor) as int64 beside `like`."""
    return torch.as_tensor(value, device=like.device).to(torch.int64)


def index_tuple(indices, like: torch.Tensor) -> tuple:
    """[..., k] indices (each row one element's or slice's position in the first k axes) as the k
    index tensors of advanced indexing."""
    return tuple(_index_tensor(indices, like).unbind(-1))


def put(inputs, indices, updates, accumulate: bool):
    """inputs with updates written to (accumulate: added at) the positions of indices
    (keras.ops.scatter_update, tf.tensor_scatter_nd_update / _add)."""
    out = inputs.clone()
    out.index_put_(index_tuple(indices, inputs), torch.as_tensor(updates, device=inputs.device).to(inputs.dtype),
                   accumulate=accumulate)
    return out


def _slice_update(inputs, start_indices, updates):
    """inputs with updates written from start_indices on (one start per axis)."""
    updates = torch.as_tensor(updates, device=inputs.device)
    starts = [int(s) for s in start_indices]
    if len(starts) != updates.dim():
        raise ValueError(f"slice_update: {len(starts)} start indices for updates of rank {updates.dim()}")
    out = inputs.clone()
    out[tuple(builtins.slice(s, s + n) for s, n in zip(starts, updates.shape))] = updates.to(inputs.dtype)
    return out


_SCATTER_REDUCE = {"max": "amax", "min": "amin", "mul": "prod"}


def _scatter_update(cfg, ctx):
    reduction = Values(cfg, ctx).str("reduction", None, choices=("add", "max", "min", "mul"))

    def scatter_update(inputs, indices, updates):
        if reduction in (None, "add"):
            return put(inputs, indices, updates, reduction == "add")
        # Keras applies the index rows one at a time, in order; scatter_reduce_ does the same
        # over the first k axes as one (each row's flat position), the rest of each slice alike
        # (the sizes and strides from the shape's numbers, which torch.export keeps symbolic)
        rows = _index_tensor(indices, inputs)
        k, rest = rows.shape[-1], inputs.shape[rows.shape[-1]:]
        strides = [1] * k
        for j in range(k - 2, -1, -1):
            strides[j] = strides[j + 1] * inputs.shape[j + 1]
        sizes, strides = (torch.stack([torch.as_tensor(v, device=rows.device) for v in values])
                          for values in (inputs.shape[:k], strides))
        rows = torch.where(rows < 0, rows + sizes, rows)  # negative positions count from the end
        src = torch.as_tensor(updates, device=inputs.device).to(inputs.dtype).reshape((-1,) + rest)
        index = (rows * strides).sum(-1).reshape((-1,) + (1,) * len(rest)).expand(src.shape)
        out = inputs.clone(memory_format=torch.contiguous_format)
        out.flatten(0, k - 1).scatter_reduce_(0, index, src, _SCATTER_REDUCE[reduction])
        return out
    return scatter_update, f"reduction={reduction}"


def _scatter(cfg, ctx):
    shape = tuple(Values(cfg, ctx).int_list("shape", lo=1, hi=MAX_SIZE))
    if math.prod(shape) > MAX_SIZE:
        raise ctx.error(f"config shape={list(shape)}: more than {MAX_SIZE} elements")

    def scatter(indices, values):
        values = torch.as_tensor(values)
        index = _index_tensor(indices, values)
        # values at repeated indices add up
        return put(torch.zeros(shape, dtype=values.dtype, device=values.device), index,
                   values.reshape(index.shape[:-1] + shape[index.shape[-1]:]), True)
    return scatter, f"shape={shape}"


def _limits(dtype: torch.dtype):
    if dtype == torch.bool:
        return 0, 1
    info = torch.finfo(dtype) if dtype.is_floating_point else torch.iinfo(dtype)
    return info.min, info.max


def _saturate_cast(cfg, ctx):
    dtype = dtype_arg(cfg, ctx)
    if dtype is None:
        raise ctx.error("config has no dtype")

    bounds = {}  # per input dtype

    def bounds_for(in_dtype):
        # The bounds in x's dtype, nudged toward zero where they left the target's range as
        # Keras compares them: both in x's dtype, so float32's bound for int32 rounds to 2^31,
        # is kept, and casts to -2^31 (Keras's result on x86 too).
        (in_lo, in_hi), (out_lo, out_hi) = _limits(in_dtype), _limits(dtype)

        def bound(value, limit, outside):
            b, lim = torch.tensor(value).to(in_dtype), torch.tensor(limit).to(in_dtype)
            return (torch.nextafter(b, torch.zeros_like(b)) if outside(b, lim) else b).item()
        return bound(builtins.max(in_lo, out_lo), out_lo, torch.lt), bound(builtins.min(in_hi, out_hi), out_hi, torch.gt)

    def saturate_cast(x):
        if x.dtype not in bounds:
            bounds[x.dtype] = bounds_for(x.dtype)
        lo, hi = bounds[x.dtype]
        return torch.clamp(x, lo, hi).to(dtype)
    return saturate_cast, f"dtype={dtype}"


def _segment(kind: str):
    """segment_sum / max / min / prod over the first axis: ids outside [0, num_segments) are
    dropped; an empty segment holds 0 (sum), 1 (prod) or the extreme (max: -inf for floats, the
    lowest integer; min: +inf or the highest), as Keras's JAX and torch backends give. (Its
    TensorFlow backend fills the dtype's lowest / highest finite value and raises on such ids.)"""
    def build(cfg, ctx):
        count = Values(cfg, ctx).int("num_segments", None, lo=1)

        def segment(data, segment_ids):
            ids = _index_tensor(segment_ids, data)
            n = count if count is not None else int(ids.max()) + 1 if ids.numel() else 0
            if (n + 1) * data[0].numel() > _MAX_RESULT:
                raise ValueError(f"segment_{kind} into {n} segments: more than {_MAX_RESULT} values")
            ids = torch.where((ids >= 0) & (ids < n), ids, n)  # n: dropped
            index = ids.reshape((-1,) + (1,) * (data.dim() - 1)).expand_as(data)
            if kind == "sum":
                out = torch.zeros((n + 1,) + tuple(data.shape[1:]), dtype=data.dtype, device=data.device)
                return out.scatter_add(0, index, data)[:n]
            lo, hi = (-torch.inf, torch.inf) if data.is_floating_point() else _limits(data.dtype)
            fill = {"max": lo, "min": hi, "prod": 1}[kind]
            out = torch.full((n + 1,) + tuple(data.shape[1:]), fill, dtype=data.dtype, device=data.device)
            return out.scatter_reduce(0, index, data, {"max": "amax", "min": "amin", "prod": "prod"}[kind])[:n]
        return segment, f"num_segments={count}"
    return build


def _complex(x) -> torch.Tensor:
    if not isinstance(x, (list, tuple)) or len(x) != 2:
        raise ValueError("expected a (real, imaginary) pair of tensors")
    real, imag = (torch.as_tensor(t) for t in x)
    if real.shape != imag.shape or not real.is_floating_point() or not imag.is_floating_point():
        raise ValueError("expected a (real, imaginary) pair of float tensors of one shape")
    return torch.complex(real, imag.to(real.dtype))


def _pair(z: torch.Tensor) -> list:
    return [z.real, z.imag]


def _fft_length(cfg, ctx):
    return Values(cfg, ctx).int("fft_length", None, lo=1, hi=1 << 16)


def _stft(cfg, ctx):
    """Short-time Fourier transform of the last axis, as Keras on TensorFlow computes it: frames of
    sequence_length samples every sequence_stride, a Hann or Hamming window (or none) centred in
    fft_length, the signal reflected by fft_length // 2 at each end where center; [real,
    imaginary], [..., frames, bins]."""
    v = Values(cfg, ctx)
    length, stride = v.int("sequence_length", lo=1, hi=1 << 16), v.int("sequence_stride", lo=1, hi=1 << 16)
    n_fft, center = v.int("fft_length", lo=1, hi=1 << 16), v.bool("center", True)
    window = v.str("window", None, choices=("hann", "hamming"))
    if n_fft < length:
        raise ctx.error(f"config fft_length={n_fft} is shorter than sequence_length={length}")

    def stft(x):
        if x.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"stft takes float32 or float64 signals, got {x.dtype}")
        # a - b cos(2 pi n / N): N the length where it is even (periodic), one less where it is
        # odd, as TensorFlow's windows are (Keras's torch backend makes odd ones periodic too)
        a, b = {"hann": (0.5, 0.5), "hamming": (0.54, 0.46), None: (1.0, 0.0)}[window]
        n = torch.arange(length, dtype=x.dtype, device=x.device)
        win = a - b * torch.cos(2 * math.pi * n / (length - length % 2)) if length > 1 else torch.ones_like(n)
        z = torch.stft(x.reshape(-1, x.shape[-1]), n_fft=n_fft, hop_length=stride, win_length=length, window=win,
                       center=center, return_complex=True)
        z = z.reshape(x.shape[:-1] + z.shape[-2:]).transpose(-2, -1)
        return _pair(z)
    return stft, f"sequence_length={length} sequence_stride={stride} fft_length={n_fft} window={window}"


def _lstsq(cfg, ctx):
    rcond = Values(cfg, ctx).float("rcond", None, lo=0.0)

    def lstsq(a, b):
        # Through pinv (the same minimum-norm solution and cut-off) off the CPU, which has no SVD
        # driver, and in an exported program (lstsq's residuals have a shape the data decides).
        via_pinv = a.device.type != "cpu" or torch.compiler.is_compiling() or torch.compiler.is_exporting()
        if rcond is None:
            return torch.linalg.pinv(a) @ b if via_pinv else torch.linalg.lstsq(a, b).solution
        if via_pinv:
            return torch.linalg.pinv(a, rtol=rcond) @ b
        return torch.linalg.lstsq(a, b, rcond=rcond, driver="gelsd").solution
    return lstsq, f"rcond={rcond}"


def _svd(cfg, ctx):
    v = Values(cfg, ctx)
    full, uv = v.bool("full_matrices", True), v.bool("compute_uv", True)

    def svd(x):
        return list(torch.linalg.svd(x, full_matrices=full)) if uv else torch.linalg.svdvals(x)
    return svd, f"full_matrices={full} compute_uv={uv}"


def _lu_factor(x):
    """LU in one matrix and the row swaps as LAPACK records them, counted from 0 (Keras's JAX and
    torch backends; its TensorFlow backend gives the permutation instead, of one matrix only). A
    singular matrix gives LAPACK's factors, not an error."""
    lu, pivots, _ = torch.linalg.lu_factor_ex(x)
    return [lu, (pivots - 1).to(torch.int32)]


MATH_OPS: Dict[str, Callable] = {
    # keras.ops.core
    "SliceUpdate": fixed(_slice_update), "ScatterUpdate": _scatter_update, "Scatter": _scatter,
    "SaturateCast": _saturate_cast,
    # keras.ops.math
    "SegmentSum": _segment("sum"), "SegmentMax": _segment("max"), "SegmentMin": _segment("min"),
    "SegmentProd": _segment("prod"),
    "FFT": fixed(lambda x: _pair(torch.fft.fft(_complex(x)))),
    "FFT2": fixed(lambda x: _pair(torch.fft.fft2(_complex(x)))),
    "IFFT2": fixed(lambda x: _pair(torch.fft.ifft2(_complex(x)))),
    "RFFT": lambda cfg, ctx: ((lambda x, n=_fft_length(cfg, ctx): _pair(torch.fft.rfft(x, n=n, dim=-1))), "rfft"),
    "STFT": _stft,
    "IRFFT": lambda cfg, ctx: ((lambda x, n=_fft_length(cfg, ctx): torch.fft.irfft(_complex(x), n=n, dim=-1)), "irfft"),
    # keras.ops.linalg
    "Eigh": fixed(lambda x: list(torch.linalg.eigh(x))), "SVD": _svd, "Lstsq": _lstsq,
    "CholeskyInverse": lambda cfg, ctx: ((lambda x, u=Values(cfg, ctx).bool("upper", False):
                                          torch.cholesky_inverse(x, upper=u)), "cholesky_inverse"),
    "LuFactor": fixed(_lu_factor),
    # (singular values above tol, or by default above max(m, n) * eps * the largest)
    "MatrixRank": lambda cfg, ctx: ((lambda x, tol=Values(cfg, ctx).float("tol", None, lo=0.0):
                                     torch.linalg.matrix_rank(x, atol=tol).to(torch.int32)), "matrix_rank"),
}
