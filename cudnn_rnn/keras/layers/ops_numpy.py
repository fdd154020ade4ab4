"""keras.ops's NumPy-like operations (keras.src.ops.numpy and keras.src.ops.core) beyond the
arithmetic, reductions and reshapes of ops.py: elementwise functions, NaN-aware and order
statistics, padding, splitting, stacking, gathering, sorting and products. Each entry of
NUMPY_OPS is a builder (config, context) -> (function, description); the function takes the
call's arguments by the names Keras's `call` gives them and computes what keras.ops computes:
NumPy's semantics, Keras's result dtypes (an integer or boolean input to a floating function
gives float32; indices come out int32)."""
from __future__ import annotations

import math
from typing import Callable, Dict

import torch

from .op_args import (all_axes, along, axes_arg, axis_or_none, dtype_arg, fixed, floating, gather, in_summable_dtype,
                      one_axis, reduction, summable, whole_reduction)
from .values import MAX_SIZE, Values


def _both(fn, cast=floating):
    """fn of two arguments (tensors or recorded numbers), each made a tensor in the dtype both
    promote to (a Python number takes the tensor's dtype, as Keras converts weak types)."""
    def call(x1, x2):
        a, b = torch.as_tensor(x1), torch.as_tensor(x2)
        if not isinstance(x1, torch.Tensor):
            a = a.to(b.dtype if b.is_floating_point() or not isinstance(x1, float) else torch.float32)
        if not isinstance(x2, torch.Tensor):
            b = b.to(a.dtype if a.is_floating_point() or not isinstance(x2, float) else torch.float32)
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
        return fn(cast(a), cast(b))
    return call


def _same(x):
    return x


def _cbrt(x):
    x = floating(x)
    return torch.sign(x) * torch.abs(x) ** (1.0 / 3.0)


def _divide_no_nan(x1, x2):
    safe = torch.where(x2 == 0, torch.ones_like(x2), x2)
    return torch.where(x2 == 0, torch.zeros_like(x1), x1 / safe)


def _isclose(cfg, ctx):
    equal_nan = Values(cfg, ctx).bool("equal_nan", False)

    def isclose(x1, x2, rtol=1e-5, atol=1e-8):
        a, b = torch.as_tensor(x1), torch.as_tensor(x2)
        dtype = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(dtype), b.to(dtype)
        if not dtype.is_floating_point:
            return a == b
        return torch.isclose(a, b, rtol=float(rtol), atol=float(atol), equal_nan=equal_nan)
    return isclose, f"equal_nan={equal_nan}"


def _nan_to_num(cfg, ctx):
    v = Values(cfg, ctx)
    nan, posinf, neginf = v.float("nan", 0.0), v.float("posinf", None), v.float("neginf", None)
    return (lambda x: torch.nan_to_num(x, nan=nan, posinf=posinf, neginf=neginf)), f"nan={nan}"


# -- reductions ---------------------------------------------------------------------------------

def _nan_extreme(fill: float, pick):
    """nanmax / nanmin: NaN ignored, NaN where a slice holds nothing else (integers: max / min)."""
    def one(x, a, k):
        if not x.is_floating_point():
            return pick(x, dim=a, keepdim=k)
        out = pick(torch.where(torch.isnan(x), torch.full_like(x, fill), x), dim=a, keepdim=k)
        return torch.where(torch.isnan(x).all(dim=a, keepdim=k), torch.full_like(out, math.nan), out)
    return one


def _nanvar(x, dims, keepdims):
    valid = ~torch.isnan(x)
    mean = torch.nansum(x, dim=dims, keepdim=True) / valid.sum(dim=dims, keepdim=True)
    centered = torch.where(valid, x - mean, torch.zeros_like(x)).square()
    return centered.sum(dim=dims, keepdim=keepdims) / valid.sum(dim=dims, keepdim=keepdims)


def _quantile_of(x, q, axis, method, keepdims, nan):
    """NumPy's quantile over `axis` (a tuple: those axes together), q a number or a list: the
    sorted values read at q * (n - 1) as torch.quantile reads them, computed from a sort and a
    gather (torch.quantile fixes the length in an export). nan: NaN left out (n per slice; all
    NaN gives NaN); else a slice holding NaN gives NaN."""
    x = floating(x)
    q = torch.as_tensor(q, dtype=x.dtype, device=x.device)
    dims = all_axes(axis, x)
    others = [d for d in range(x.dim()) if d not in dims]
    y = x.permute(*others, *dims).reshape([x.shape[d] for d in others] + [-1])
    ordered = torch.sort(y, dim=-1).values  # NaN last
    missing = torch.isnan(y)
    count = (~missing).sum(-1, keepdim=True) if nan else None
    last = (count - 1).to(x.dtype) if nan else torch.full_like(y[..., :1], y.shape[-1] - 1)
    ranks = q.reshape(-1).double() * last.double()  # [..., Q] (in float64, as torch.quantile rounds them)
    below, above = ranks.floor(), ranks.ceil()
    if method == "lower":
        above = below
    elif method == "higher":
        below = above
    elif method == "nearest":
        below = above = ranks.round()

    def at(rank):
        return torch.gather(ordered, -1, rank.clamp(min=0).long().expand(*ordered.shape[:-1], rank.shape[-1]))
    low, high = at(below), at(above)
    weight = torch.full_like(ranks, 0.5) if method == "midpoint" else ranks - below
    out = torch.lerp(low, high, weight.to(x.dtype).expand_as(low))
    empty = (count == 0) if nan else missing.any(-1, keepdim=True)
    out = torch.where(empty, torch.full_like(out, math.nan), out)
    out = out.movedim(-1, 0) if q.dim() > 0 else out.squeeze(-1)
    if keepdims:
        lead = 1 if q.dim() > 0 else 0
        for d in sorted(dims):
            out = out.unsqueeze(d + lead)
    return out


def _quantile(scale: float, nan: bool, reads_method: bool = True):
    """Quantile (q in [0, 1]) and Percentile (q in [0, 100]: scale 100), and their NaN-aware forms.
    reads_method False: Keras's recorded Quantile interpolates linearly whatever its method says
    (keras.src.ops.numpy.Quantile.call passes none to the backend, on every backend), and so does
    the converted one."""
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        axis, keepdims = axes_arg(cfg, ctx), v.bool("keepdims", False)
        method = v.str("method", "linear", choices=("linear", "lower", "higher", "midpoint", "nearest"))
        method = method if reads_method else "linear"

        def quantile(x, q):
            q = torch.as_tensor(q, dtype=torch.float64) / scale
            return _quantile_of(x, q, axis, method, keepdims, nan)
        return quantile, f"axis={axis} method={method}"
    return build


def _median(nan: bool):
    def build(cfg, ctx):
        axis, keepdims = axes_arg(cfg, ctx), Values(cfg, ctx).bool("keepdims", False)
        return (lambda x: _quantile_of(x, 0.5, axis, "linear", keepdims, nan)), f"axis={axis}"
    return build


def _average(cfg, ctx):
    axis = axis_or_none(cfg, ctx)

    def average(x, weights=None):
        x = floating(x)
        if weights is None:
            return x.mean() if axis is None else x.mean(dim=axis)
        w = torch.as_tensor(weights, dtype=x.dtype, device=x.device)
        if axis is None:
            return (x * w).sum() / w.sum()
        if w.dim() == 1 and x.dim() > 1:  # NumPy: 1-D weights lie along `axis`
            shape = [1] * x.dim()
            shape[axis] = -1
            w = w.reshape(shape)
            return (x * w).sum(dim=axis) / w.sum()
        return (x * w).sum(dim=axis) / w.expand_as(x).sum(dim=axis)
    return average, f"axis={axis}"


def _count_nonzero(cfg, ctx):
    axis = axes_arg(cfg, ctx)
    return (lambda x: torch.count_nonzero(torch.as_tensor(x), dim=axis).to(torch.int32)), f"axis={axis}"


# -- shapes -------------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "symmetric", "edge", "wrap")


def _pad(cfg, ctx):
    v = Values(cfg, ctx)
    width = cfg.get("pad_width")
    if isinstance(width, int) and not isinstance(width, bool):
        width = [[width, width]]
    if not isinstance(width, list) or not 0 < len(width) <= 8 or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(e, int) and not isinstance(e, bool) and 0 <= e <= MAX_SIZE
                                                        for e in p) for p in width):
        raise ctx.error(f"config pad_width={str(width)[:60]!r}; expected a [before, after] pair of "
                        "non-negative integers per axis")
    mode = v.str("mode", "constant", choices=_PAD_MODES)

    def pad(x, constant_values=None):
        pairs = width * x.dim() if len(width) == 1 else width
        if len(pairs) != x.dim():
            raise ValueError(f"Pad pad_width has {len(pairs)} pairs for an input of rank {x.dim()}")
        if mode == "constant":
            flat = [e for p in reversed(pairs) for e in p]
            return torch.nn.functional.pad(x, flat, value=0.0 if constant_values is None else float(constant_values))
        if constant_values is not None:
            raise ValueError("Pad constant_values is given with mode " + mode)
        for d, (lo, hi) in enumerate(pairs):
            x = _pad_axis(x, d, lo, hi, mode)
        return x
    return pad, f"pad_width={width} mode={mode}"


def _pad_axis(x, d, lo, hi, mode):
    """One axis padded as numpy.pad pads it (reflect without the edge, symmetric with it)."""
    if lo == hi == 0:
        return x
    n = x.shape[d]
    if mode == "edge":
        idx = torch.arange(-lo, n + hi, device=x.device).clamp(0, n - 1)
    elif mode == "wrap":
        idx = torch.arange(-lo, n + hi, device=x.device) % n
    else:
        period = 2 * n - 2 if mode == "reflect" else 2 * n
        if period <= 0:
            idx = torch.zeros(n + lo + hi, dtype=torch.long, device=x.device)
        else:
            i = torch.arange(-lo, n + hi, device=x.device) % period
            idx = torch.where(i < n, i, period - i - (0 if mode == "reflect" else 1))
    return x.index_select(d, idx)


def _shape_list(cfg, ctx, key):
    return Values(cfg, ctx).int_list(key, lo=-1, hi=MAX_SIZE)


def _split(kind: str):
    """Split / ArraySplit (axis from config), Hsplit / Vsplit / Dsplit (NumPy's axes): a number of
    sections (Split: equal) or the indices to split before."""
    def build(cfg, ctx):
        sections = cfg.get("indices_or_sections")
        if isinstance(sections, list):
            sections = Values(cfg, ctx).int_list("indices_or_sections", lo=-MAX_SIZE, hi=MAX_SIZE)
        else:
            sections = Values(cfg, ctx).int("indices_or_sections", lo=1, hi=1 << 16)
        axis = one_axis(cfg, ctx, 0) if kind in ("split", "array") else None

        def split(x):
            a = axis if axis is not None else {"v": 0, "d": 2}.get(kind, 1 if x.dim() > 1 else 0)
            if kind != "array" and isinstance(sections, int) and x.shape[a] % sections:
                raise ValueError(f"an axis of {x.shape[a]} does not split into {sections} equal sections")
            return list(torch.tensor_split(x, sections, dim=a))
        return split, f"{kind} {sections}"
    return build


def _take(cfg, ctx):
    axis = axis_or_none(cfg, ctx)

    def take(x, indices):
        flat, a = along(torch.as_tensor(x), axis)
        a %= flat.dim()
        idx = torch.as_tensor(indices, device=flat.device).long()
        return gather(flat, torch.where(idx < 0, idx + flat.shape[a], idx), a)
    return take, f"axis={axis}"


def _take_along_axis(cfg, ctx):
    axis = axis_or_none(cfg, ctx)

    def take(x, indices):
        idx = torch.as_tensor(indices, device=x.device).long()
        if axis is None:
            x, idx, a = x.reshape(-1), idx.reshape(-1), 0
        else:
            a = axis % x.dim()
            shape = list(torch.broadcast_shapes(tuple(s if d != a else 1 for d, s in enumerate(x.shape)),
                                                tuple(s if d != a else 1 for d, s in enumerate(idx.shape))))
            x = x.expand(*[s if d != a else x.shape[a] for d, s in enumerate(shape)])
            idx = idx.expand(*[s if d != a else idx.shape[a] for d, s in enumerate(shape)])
        idx = torch.where(idx < 0, idx + x.shape[a], idx)
        return torch.gather(x, a, idx)
    return take, f"axis={axis}"


def _sort(indices: bool):
    def build(cfg, ctx):
        axis = axis_or_none(cfg, ctx, default=-1)

        def sort(x):
            x = torch.as_tensor(x)
            x, a = along(x, axis)
            if indices:
                return torch.argsort(x.to(torch.uint8) if x.dtype == torch.bool else x, dim=a, stable=True).to(torch.int32)
            return torch.sort(x, dim=a).values  # (the values: any sort; ONNX takes no stable one)
        return sort, f"axis={axis}"
    return build


def _tensordot(cfg, ctx):
    axes = cfg.get("axes", 2)
    if isinstance(axes, list):
        if len(axes) != 2:
            raise ctx.error(f"config axes={str(axes)[:60]!r}; expected an integer or two lists of axes")
        axes = [Values({"a": a if isinstance(a, list) else [a]}, ctx).int_list("a", lo=-8, hi=8) for a in axes]
    else:
        axes = Values(cfg, ctx).int("axes", 2, lo=0, hi=8)
    return (lambda x1, x2: _promoted(torch.tensordot, x1, x2, dims=axes)), f"axes={axes}"


def _promoted(fn, x1, x2, **kw):
    """fn on the two tensors in their promoted dtype, computed in floating point (torch's
    products take no integers) and returned in that dtype, as Keras does."""
    x1, x2 = torch.as_tensor(x1), torch.as_tensor(x2)
    dtype = torch.promote_types(x1.dtype, x2.dtype)
    compute = dtype if dtype.is_floating_point else torch.float32
    return fn(x1.to(compute), x2.to(compute), **kw).to(dtype)


def _dot(x1, x2):
    if x1.dim() == 0 or x2.dim() == 0:
        return x1 * x2
    return torch.matmul(x1, x2)


def _cross(cfg, ctx):
    v = Values(cfg, ctx)
    a, b, c = (v.int(k, -1, lo=-8, hi=8) for k in ("axisa", "axisb", "axisc"))
    axis = cfg.get("axis")
    if axis is not None:
        a = b = c = v.int("axis", lo=-8, hi=8)

    def cross(x1, x2):
        x1, x2 = torch.movedim(x1, a, -1), torch.movedim(x2, b, -1)
        if x1.shape[-1] == 2 or x2.shape[-1] == 2:
            raise ValueError("Cross of 2-vectors is not supported")
        x1, x2 = torch.broadcast_tensors(x1, x2)
        return torch.movedim(_promoted(torch.linalg.cross, x1, x2, dim=-1), -1, c)
    return cross, f"axes={a},{b},{c}"


def _diff(cfg, ctx):
    v = Values(cfg, ctx)
    n, axis = v.int("n", 1, lo=0, hi=1 << 16), v.int("axis", -1, lo=-8, hi=8)
    return (lambda a: torch.diff(a, n=n, dim=axis) if n else a), f"n={n} axis={axis}"


def _append(cfg, ctx):
    axis = axis_or_none(cfg, ctx)

    def append(x1, x2):
        x1, x2 = torch.as_tensor(x1), torch.as_tensor(x2)
        dtype = torch.promote_types(x1.dtype, x2.dtype)
        if axis is None:
            return torch.cat([x1.reshape(-1).to(dtype), x2.reshape(-1).to(dtype)])
        return torch.cat([x1.to(dtype), x2.to(dtype)], dim=axis)
    return append, f"axis={axis}"


def _full_like(cfg, ctx):
    dtype = dtype_arg(cfg, ctx)

    def full_like(x, fill_value):
        fill = torch.as_tensor(fill_value, device=x.device)
        return torch.zeros_like(x, dtype=dtype or x.dtype) + fill.to(dtype or x.dtype)
    return full_like, f"dtype={dtype}"


def _slice(cfg, ctx):
    shape = _shape_list(cfg, ctx, "shape")

    def slice_(inputs, start_indices):
        start = [int(s) for s in (start_indices.tolist() if isinstance(start_indices, torch.Tensor) else start_indices)]
        if len(start) != inputs.dim() or len(shape) != inputs.dim():
            raise ValueError(f"Slice of a rank-{inputs.dim()} input with start {start} and shape {shape}")
        for d, (s, n) in enumerate(zip(start, shape)):
            size = inputs.shape[d] - s if n == -1 else n
            inputs = inputs.narrow(d, s, size)
        return inputs
    return slice_, f"shape={shape}"


def _select(condlist, choicelist, default=0):
    out = torch.as_tensor(default)
    for c, v in reversed(list(zip(condlist, choicelist))):
        v = torch.as_tensor(v)
        out = torch.where(torch.as_tensor(c).bool(), v, out.to(v.dtype) if not isinstance(default, torch.Tensor) else out)
    return out


def _digitize(x, bins):
    x = torch.as_tensor(x)
    bins = torch.as_tensor(bins, device=x.device)
    return torch.bucketize(x.to(torch.uint8) if x.dtype == torch.bool else x, bins.to(x.dtype)
                           if x.is_floating_point() else bins, right=True).to(torch.int32)


def _k(name: str, fn):
    """An operation with one integer config argument `name` (Tril / Triu k, Diag offsets)."""
    def build(cfg, ctx):
        k = Values(cfg, ctx).int(name, 0, lo=-MAX_SIZE, hi=MAX_SIZE)
        return (lambda x: fn(x, k)), f"{name}={k}"
    return build


def _diagonal_of(fn):
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        offset, a1, a2 = v.int("offset", 0, lo=-MAX_SIZE, hi=MAX_SIZE), v.int("axis1", 0, lo=-8, hi=8), \
            v.int("axis2", 1, lo=-8, hi=8)
        return (lambda x: fn(torch.diagonal(x, offset=offset, dim1=a1, dim2=a2))), f"offset={offset} axes={a1},{a2}"
    return build


def _trace_sum(d):
    """The diagonal's sum, in Keras's dtype (small integers and booleans summed as int32)."""
    d = summable(d)
    return d.sum(-1).to(d.dtype)


def _roll(cfg, ctx):
    v = Values(cfg, ctx)
    shift = cfg.get("shift")
    shift = v.int_list("shift") if isinstance(shift, list) else v.int("shift", lo=-MAX_SIZE, hi=MAX_SIZE)
    axis = axes_arg(cfg, ctx)
    return (lambda x: torch.roll(x, shift, dims=axis)), f"shift={shift} axis={axis}"


def _rot90(cfg, ctx):
    v = Values(cfg, ctx)
    k = v.int("k", 1, lo=-MAX_SIZE, hi=MAX_SIZE)
    axes = v.int_list("axes", lo=-8, hi=8) if "axes" in cfg else [0, 1]
    if len(axes) != 2 or axes[0] == axes[1]:
        raise ctx.error(f"config axes={axes}; expected two different axes")
    return (lambda array: torch.rot90(array, k, [a % array.dim() for a in axes])), f"k={k} axes={axes}"


def _broadcast_to(cfg, ctx):
    shape = _shape_list(cfg, ctx, "shape")
    return (lambda x: torch.broadcast_to(x, shape)), f"shape={shape}"


def _stacked(fn):
    return lambda xs: fn([torch.as_tensor(x) for x in xs])


def _nan_arg(fill: float, pick):
    """nanargmax / nanargmin: NaN ignored; -1 where a slice is all NaN."""
    def build(cfg, ctx):
        axis, keepdims = axis_or_none(cfg, ctx), Values(cfg, ctx).bool("keepdims", False)

        def arg(x):
            x = torch.as_tensor(x)
            x, a = along(x, axis)
            k = keepdims and axis is not None
            if not x.is_floating_point():
                return pick(x, dim=a, keepdim=k).to(torch.int32)
            found = pick(torch.where(torch.isnan(x), torch.full_like(x, fill), x), dim=a, keepdim=k).to(torch.int32)
            return torch.where(torch.isnan(x).all(dim=a, keepdim=k), torch.full_like(found, -1), found)
        return arg, f"axis={axis}"
    return build


def _nan_cumulative(fill: float, fn):
    """nancumsum / nancumprod: NaN counted as `fill` (0 for the sum, 1 for the product)."""
    def build(cfg, ctx):
        axis, dtype = axis_or_none(cfg, ctx), dtype_arg(cfg, ctx)

        def cumulative(x):
            x = torch.as_tensor(x)
            if x.is_floating_point():
                x = torch.where(torch.isnan(x), torch.full_like(x, fill), x)
            x = x.to(dtype) if dtype is not None else summable(x)
            return fn(x.reshape(-1), 0) if axis is None else fn(x, axis)
        return cumulative, f"axis={axis}"
    return build


def _trapezoid(cfg, ctx):
    v = Values(cfg, ctx)
    axis, dx = v.int("axis", -1, lo=-8, hi=8), v.float("dx", 1.0)
    points = cfg.get("x")
    if points is not None:
        if not isinstance(points, list) or not 0 < len(points) <= MAX_SIZE or not all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) for p in points):
            raise ctx.error(f"config x={str(points)[:60]!r}; expected a list of sample points")
        points = torch.tensor(points, dtype=torch.float64)

    def trapezoid(y):
        y = floating(y)
        if points is not None:
            return torch.trapezoid(y, x=points.to(y.dtype), dim=axis)
        return torch.trapezoid(y, dx=dx, dim=axis)
    return trapezoid, f"axis={axis}"


def _isin(cfg, ctx):
    v = Values(cfg, ctx)
    unique, invert = v.bool("assume_unique", False), v.bool("invert", False)

    def isin(x1, x2):
        a, b = torch.as_tensor(x1), torch.as_tensor(x2, device=torch.as_tensor(x1).device)
        dtype = torch.promote_types(a.dtype, b.dtype)
        if dtype == torch.bool:
            dtype = torch.int32
        return torch.isin(a.to(dtype), b.to(dtype), assume_unique=unique, invert=invert)
    return isin, f"invert={invert}"


def _searchsorted(cfg, ctx):
    side = Values(cfg, ctx).str("side", "left", choices=("left", "right"))

    def searchsorted(sorted_sequence, values):
        seq = torch.as_tensor(sorted_sequence)
        if seq.dim() != 1:
            raise ValueError(f"SearchSorted needs a 1-D sorted sequence, not shape {tuple(seq.shape)}")
        vals = torch.as_tensor(values, device=seq.device)
        dtype = torch.promote_types(seq.dtype, vals.dtype)
        return torch.searchsorted(seq.to(dtype), vals.to(dtype), side=side).to(torch.int32)
    return searchsorted, f"side={side}"


def _vander(cfg, ctx):
    v = Values(cfg, ctx)
    n = v.int("N", None, lo=0, hi=1 << 16)
    increasing = v.bool("increasing", False)
    return (lambda x: torch.vander(x, N=n, increasing=increasing)), f"N={n} increasing={increasing}"


def _real_angle(x):
    """numpy.angle of real numbers: pi where negative, else 0 (NaN stays NaN)."""
    x = floating(x)
    return torch.where(x < 0, torch.full_like(x, math.pi), torch.zeros_like(x)) + x * 0


def _allclose(cfg, ctx):
    v = Values(cfg, ctx)
    rtol, atol, equal_nan = v.float("rtol", 1e-5, lo=0.0), v.float("atol", 1e-8, lo=0.0), v.bool("equal_nan", False)
    close, _ = _isclose({"equal_nan": equal_nan}, ctx)
    return (lambda x1, x2: close(x1, x2, rtol, atol).all()), f"rtol={rtol} atol={atol} equal_nan={equal_nan}"


def _nextafter(a, b):
    """In float64, then in the dtype the two promote to (float32 for integers: _both), as Keras
    computes it: a float32 neighbour rounds back to x1."""
    return torch.nextafter(a.to(torch.float64), b.to(torch.float64)).to(a.dtype)


def _corrcoef(x):
    """torch.corrcoef's arithmetic (each row a variable: the covariance over the columns, scaled
    by the rows' standard deviations, clipped to [-1, 1]; a single variable's c / c), written out
    so that it exports: torch.cov's check of its normalisation factor reads the data."""
    x = torch.as_tensor(x)
    if x.dtype == torch.bool:
        x = x.to(torch.float32)
    elif x.dtype == torch.int64:
        x = x.to(torch.float64)
    elif not (x.is_floating_point() or x.is_complex()):
        x = x.to(torch.get_default_dtype())
    if x.dim() > 2:
        raise ValueError(f"corrcoef takes a 1-D or 2-D input; got shape {tuple(x.shape)}")
    rows = x.reshape(1, -1) if x.dim() < 2 else x
    centered = rows - rows.mean(dim=1, keepdim=True)
    c = centered @ centered.transpose(0, 1).conj() / (rows.shape[1] - 1)
    if rows.shape[0] == 1:  # (torch.cov of one variable is 0-d)
        return (c / c).reshape(())
    stddev = torch.sqrt(c.diagonal().real if c.is_complex() else c.diagonal())
    c = c / stddev.reshape(-1, 1) / stddev.reshape(1, -1)
    if c.is_complex():
        return torch.complex(c.real.clip(-1, 1), c.imag.clip(-1, 1))
    return c.clip(-1, 1)


def _correlate(cfg, ctx):
    mode = Values(cfg, ctx).str("mode", "valid", choices=("valid", "same", "full"))

    def correlate(x1, x2):
        a, b = torch.as_tensor(x1), torch.as_tensor(x2)
        dtype = torch.promote_types(a.dtype, b.dtype)
        dtype = torch.float64 if dtype == torch.int64 else dtype if dtype in (
            torch.bfloat16, torch.float16, torch.float64) else torch.float32
        a, b = a.to(dtype), b.to(dtype)
        n1, n2 = a.shape[-1], b.shape[-1]
        lead = torch.broadcast_shapes(a.shape[:-1], b.shape[:-1])
        a, b = a.expand(lead + (n1,)).reshape(-1, n1), b.expand(lead + (n2,)).reshape(-1, n2)
        # the full cross-correlation, one signal per group; then the centred window of the mode
        out = torch.nn.functional.conv1d(a.unsqueeze(0), b.unsqueeze(1), padding=n2 - 1, groups=a.shape[0])
        out = out.reshape(lead + (-1,))
        if mode != "full":
            keep = max(n1, n2) - min(n1, n2) + 1 if mode == "valid" else n1
            start = (out.shape[-1] - keep) // 2
            out = out[..., start:start + keep]
        return out  # (a one-element "valid" result keeps its axis, as NumPy's and Keras on TensorFlow's)
    return correlate, f"mode={mode}"


def _unravel_index(cfg, ctx):
    shape = tuple(Values(cfg, ctx).int_list("shape", lo=1, hi=MAX_SIZE))

    def unravel_index(indices):
        indices = torch.as_tensor(indices)
        return [i.to(indices.dtype) for i in torch.unravel_index(indices, shape)]
    return unravel_index, f"shape={shape}"


def _view(cfg, ctx):
    dtype = dtype_arg(cfg, ctx)
    return (lambda x: x if dtype is None else x.view(dtype)), f"dtype={dtype}"


# -- sequences, counts and arrays ----------------------------------------------------------------

def _argpartition(cfg, ctx):
    """The indices of the kth+1 smallest entries (smallest first), then those of the rest: as
    Keras computes it on every backend, of the values cast to int32 (a float's fraction dropped),
    the first part by topk of the negated values, the rest by topk of a 0 / 1 marker (torch's order
    of equal entries, as Keras on torch gets it)."""
    v = Values(cfg, ctx)
    kth = v.int("kth", lo=0, hi=MAX_SIZE)
    axis = axis_or_none(cfg, ctx, default=-1)

    def argpartition(x):
        x = torch.as_tensor(x).to(torch.int32)
        x, a = along(x, axis)
        x = x.transpose(a, -1)
        n = x.shape[-1]
        if kth >= n:
            raise ValueError(f"argpartition: kth={kth} of an axis of {n}")
        bottom = torch.topk(-x, kth + 1).indices
        rest = torch.ones_like(x).scatter(-1, bottom, 0)
        out = torch.cat([bottom, torch.topk(rest, n - kth - 1).indices], dim=-1)
        return out.transpose(-1, a).to(torch.int32)
    return argpartition, f"kth={kth} axis={axis}"


def _bincount(cfg, ctx):
    """Counts of each value of a 1-D or 2-D (row by row) tensor of non-negative integers, at least
    minlength of them: int32 (Keras writes no weights; a file that holds some is refused)."""
    v = Values(cfg, ctx)
    if cfg.get("weights") is not None:
        raise ctx.error("config weights= is not supported (Keras does not save them)")
    if v.bool("sparse", False):
        raise ctx.error("config sparse=true is not supported (a sparse result)")
    minlength = v.int("minlength", 0, lo=0, hi=MAX_SIZE)

    def bincount(x):
        x = torch.as_tensor(x)
        if x.is_floating_point() or x.dim() not in (1, 2):
            raise ValueError(f"bincount of {x.dtype} of shape {tuple(x.shape)}; expected integers of rank 1 or 2")
        if x.numel() and bool((x < 0).any()):
            raise ValueError("bincount of negative values")
        n = max(minlength, int(x.max()) + 1 if x.numel() else 0)
        rows = x.reshape(-1, x.shape[-1]).long()
        counts = torch.zeros(rows.shape[0], n, dtype=torch.int32, device=x.device)
        counts.scatter_add_(1, rows, torch.ones_like(rows, dtype=torch.int32))
        return counts if x.dim() == 2 else counts[0]
    return bincount, f"minlength={minlength}"


def _full(cfg, ctx):
    """An array of the config's shape filled with the call's value (an array: repeated over the
    leading axes), in the config's dtype or the value's."""
    shape = _shape_list(cfg, ctx, "shape")
    if any(s < 0 for s in shape) or math.prod(shape) > MAX_SIZE:
        raise ctx.error(f"config shape={shape}; expected sizes of at most {MAX_SIZE} values")
    dtype = dtype_arg(cfg, ctx)

    def full(fill_value):
        fill = torch.as_tensor(fill_value)
        return fill.to(dtype or fill.dtype).expand(*shape).clone()
    return full, f"shape={shape}"


def _spaced(kind: str):
    """Linspace / Logspace / Geomspace: num samples from start to stop (broadcast arrays: the
    samples along a new axis), endpoint included or not; NumPy's definitions, in the float dtype
    of the arguments (float32 for integers) or the config's."""
    def build(cfg, ctx):
        v = Values(cfg, ctx)
        num = v.int("num", 50, lo=0, hi=MAX_SIZE)
        endpoint = v.bool("endpoint", True)
        if v.bool("retstep", False):
            raise ctx.error("config retstep=true is not supported (Keras cannot record it)")
        base = v.float("base", 10.0) if kind == "log" else 10.0
        axis = v.int("axis", 0, lo=-8, hi=8)
        dtype = dtype_arg(cfg, ctx)

        def spaced(start, stop):
            a, b = torch.as_tensor(start), torch.as_tensor(stop)
            work = torch.promote_types(floating(a).dtype, floating(b).dtype)
            a, b = a.to(work), b.to(work)
            if kind == "geom":
                sign, a, b = torch.sign(a), torch.log10(torch.abs(a)), torch.log10(torch.abs(b))
            a, b = torch.broadcast_tensors(a, b)
            div = (num - 1 if endpoint else num) or 1
            steps = (torch.arange(num, dtype=work, device=a.device) / div).reshape(num, *([1] * a.dim()))
            out = a.unsqueeze(0) + steps * (b - a).unsqueeze(0)
            if kind == "lin" and endpoint and num > 1:
                out = torch.cat([out[:-1], b.unsqueeze(0)])
            if kind != "lin":
                out = torch.pow(base if kind == "log" else 10.0, out)
            if kind == "geom":
                out = out * sign.unsqueeze(0)
            return out.movedim(0, axis % out.dim()).to(dtype or work)
        return spaced, f"num={num} endpoint={endpoint}"
    return build


def _histogram(cfg, ctx):
    """[counts, bin edges] of a 1-D float tensor in `bins` equal bins over its range or the
    config's (the last bin closed), as torch.histogram computes them."""
    v = Values(cfg, ctx)
    bins = v.int("bins", 10, lo=1, hi=MAX_SIZE)
    span = cfg.get("range")
    if span is not None:
        span = [Values({"r": e}, ctx).float("r") for e in (span if isinstance(span, list) else [None])]
        if len(span) != 2 or span[0] > span[1]:
            raise ctx.error(f"config range={str(cfg.get('range'))[:40]!r}; expected [low, high]")

    def histogram(x):
        if x.dim() != 1 or not x.is_floating_point():
            raise ValueError(f"histogram of {x.dtype} of shape {tuple(x.shape)}; expected a 1-D float tensor")
        out = torch.histogram(x, bins=bins, range=None if span is None else tuple(span))
        return [out.hist, out.bin_edges]
    return histogram, f"bins={bins} range={span}"


NUMPY_OPS: Dict[str, Callable] = {
    # elementwise
    "Arcsinh": fixed(lambda x: torch.asinh(floating(x))), "Arccosh": fixed(lambda x: torch.acosh(floating(x))),
    "Arctanh": fixed(lambda x: torch.atanh(floating(x))), "Cbrt": fixed(_cbrt),
    "Deg2rad": fixed(lambda x: torch.deg2rad(floating(x))), "Rad2deg": fixed(lambda x: torch.rad2deg(floating(x))),
    "Exp2": fixed(lambda x: torch.exp2(floating(x))), "Sinc": fixed(lambda x: torch.sinc(floating(x))),
    "Trunc": fixed(lambda x: x if x.dtype == torch.bool else torch.trunc(x)), "Signbit": fixed(torch.signbit),
    "Isneginf": fixed(torch.isneginf), "Isposinf": fixed(torch.isposinf), "Copy": fixed(torch.clone),
    "StopGradient": fixed(torch.Tensor.detach), "NanToNum": _nan_to_num,
    "Fliplr": fixed(lambda x: torch.flip(x, [1])), "Flipud": fixed(lambda x: torch.flip(x, [0])),
    "Ravel": fixed(lambda x: x.reshape(-1)), "Fabs": fixed(lambda x: torch.abs(floating(x))),
    "Isnan": fixed(torch.isnan), "Isinf": fixed(torch.isinf), "Isfinite": fixed(torch.isfinite),
    "I0": fixed(lambda x: torch.special.i0(floating(x))),
    # the complex-number functions, on the real tensors a graph of real layers carries (real and
    # conj return a real input itself, in torch and TensorFlow, and its Keras mask goes with it)
    "Real": fixed(_same), "Conj": fixed(_same), "Conjugate": fixed(_same),
    "Imag": fixed(torch.zeros_like), "Angle": fixed(_real_angle),
    # two arguments
    "Hypot": fixed(_both(torch.hypot)), "Logaddexp": fixed(_both(torch.logaddexp)),
    "Logaddexp2": fixed(_both(torch.logaddexp2)), "Heaviside": fixed(_both(torch.heaviside)),
    "Fmod": fixed(_both(torch.fmod, _same)), "Fmax": fixed(_both(torch.fmax, _same)), "Fmin": fixed(_both(torch.fmin, _same)),
    "DivideNoNan": fixed(_both(_divide_no_nan)), "Isclose": _isclose,
    "BitwiseAnd": fixed(_both(torch.bitwise_and, _same)), "BitwiseOr": fixed(_both(torch.bitwise_or, _same)),
    "BitwiseXor": fixed(_both(torch.bitwise_xor, _same)), "BitwiseNot": fixed(torch.bitwise_not),
    "BitwiseInvert": fixed(torch.bitwise_not),
    "BitwiseLeftShift": fixed(_both(torch.bitwise_left_shift, _same)), "LeftShift": fixed(_both(torch.bitwise_left_shift, _same)),
    "BitwiseRightShift": fixed(_both(torch.bitwise_right_shift, _same)),
    "RightShift": fixed(_both(torch.bitwise_right_shift, _same)),
    "Gcd": fixed(_both(torch.gcd, _same)), "Lcm": fixed(_both(torch.lcm, _same)),
    "Kron": fixed(lambda x1, x2: _promoted(torch.kron, x1, x2)),
    "Outer": fixed(lambda x1, x2: _promoted(torch.outer, x1.reshape(-1), x2.reshape(-1))),
    "Inner": fixed(lambda x1, x2: _promoted(torch.inner, x1, x2)),
    "Vdot": fixed(lambda x1, x2: _promoted(torch.dot, x1.reshape(-1), x2.reshape(-1))),
    "Dot": fixed(lambda x1, x2: _promoted(_dot, x1, x2)), "Tensordot": _tensordot, "Cross": _cross,
    "Digitize": fixed(_digitize),
    # reductions
    "Ptp": whole_reduction(lambda x, dims, k: x.amax(dim=dims, keepdim=k) - x.amin(dim=dims, keepdim=k), "ptp"),
    "Nansum": reduction("nansum", in_summable_dtype(lambda x, a, k: torch.nansum(x, dim=a, keepdim=k))),
    "Nanprod": reduction("nanprod", in_summable_dtype(lambda x, a, k: torch.where(
        torch.isnan(x), torch.ones_like(x), x).prod(dim=a, keepdim=k) if x.is_floating_point() else x.prod(dim=a, keepdim=k))),
    "Nanmax": reduction("nanmax", _nan_extreme(-math.inf, torch.amax)),
    "Nanmin": reduction("nanmin", _nan_extreme(math.inf, torch.amin)),
    "Nanmean": whole_reduction(lambda x, dims, k: torch.nanmean(x, dim=dims, keepdim=k), "nanmean", True),
    "Nanvar": whole_reduction(_nanvar, "nanvar", True),
    "Nanstd": whole_reduction(lambda x, a, k: torch.sqrt(_nanvar(x, a, k)), "nanstd", True),
    "Median": _median(False), "Nanmedian": _median(True),
    "Quantile": _quantile(1.0, False, reads_method=False), "Percentile": _quantile(100.0, False),
    "Nanquantile": _quantile(1.0, True), "Nanpercentile": _quantile(100.0, True),
    "Average": _average, "CountNonzero": _count_nonzero,
    "Nanargmax": _nan_arg(-math.inf, torch.argmax), "Nanargmin": _nan_arg(math.inf, torch.argmin),
    "Nancumsum": _nan_cumulative(0.0, torch.cumsum), "Nancumprod": _nan_cumulative(1.0, torch.cumprod),
    "Trapezoid": _trapezoid, "IsIn": _isin, "SearchSorted": _searchsorted, "Vander": _vander,
    "Meshgrid": lambda cfg, ctx: ((lambda *x, i=Values(cfg, ctx).str("indexing", "xy", choices=("xy", "ij")):
                                   list(torch.meshgrid(*x, indexing=i))), "meshgrid"),
    "Slogdet": fixed(lambda x: list(torch.linalg.slogdet(x))),
    "Ldexp": fixed(lambda x1, x2: floating(x1) * torch.pow(2.0, torch.as_tensor(x2).to(floating(x1).dtype))),
    # shapes, pieces and gathers
    "Pad": _pad, "BroadcastTo": _broadcast_to, "Roll": _roll, "Rot90": _rot90,
    "Tril": _k("k", torch.tril), "Triu": _k("k", torch.triu),
    "Diag": _k("k", lambda x, k: torch.diag(x, k)), "Diagflat": _k("k", lambda x, k: torch.diagflat(x, k)),
    "Diagonal": _diagonal_of(lambda d: d), "Trace": _diagonal_of(_trace_sum),
    "Split": _split("split"), "ArraySplit": _split("array"), "Hsplit": _split("h"), "Vsplit": _split("v"),
    "Dsplit": _split("d"),
    "Unstack": lambda cfg, ctx: ((lambda x, a=one_axis(cfg, ctx, 0): list(torch.unbind(x, a))), "unstack"),
    "Hstack": fixed(_stacked(torch.hstack)), "Vstack": fixed(_stacked(torch.vstack)),
    "Dstack": fixed(_stacked(torch.dstack)),
    "Take": _take, "TakeAlongAxis": _take_along_axis, "Sort": _sort(False), "Argsort": _sort(True),
    # predicates, statistics and views
    "Isreal": fixed(lambda x: torch.isreal(torch.as_tensor(x))), "AllClose": _allclose, "Nextafter": fixed(_both(_nextafter)),
    "Corrcoef": fixed(_corrcoef), "Correlate": _correlate, "UnravelIndex": _unravel_index, "View": _view,
    "Size": fixed(lambda x: torch.scalar_tensor(x.numel(), dtype=torch.int32, device=x.device)),
    "Diff": _diff, "Append": _append, "FullLike": _full_like, "Slice": _slice, "Select": fixed(_select),
    # sequences, counts and arrays
    "Argpartition": _argpartition, "Bincount": _bincount, "Full": _full, "Histogram": _histogram,
    "Linspace": _spaced("lin"), "Logspace": _spaced("log"), "Geomspace": _spaced("geom"),
    "Ndim": fixed(lambda x: torch.scalar_tensor(x.dim(), dtype=torch.int32, device=x.device)),
}
