"""tf.keras 2.x's recorded TensorFlow calls: a TFOpLambda / SlicingOpLambda layer holds a function
name such as "math.reduce_sum" and its arguments, no code. Those in _TF_FUNCTIONS are built with
TensorFlow's semantics (build_tf_call, the layer builder); every other is refused by name."""
from __future__ import annotations

import inspect
import math
import operator
import re
from typing import Callable, Dict

import torch
import torch.nn.functional as F
from torch import nn

from ..graph.spec import TensorArg
from .op_args import DTYPES, all_axes, as_tensor_like, gather, over_axes, pair
from .ops import MAX_ARGUMENTS, check_constants, fill_arguments, get_item
from .ops_math import index_tuple, put
from .ops_nn import depth_to_space, space_to_depth
from .preprocessing import Resizing
from .registry import builder
from .values import Values


def _tf_axes(axis):
    if axis is None or isinstance(axis, int):
        return axis
    return tuple(axis)


def _tf_slice(spec):
    """A SlicingOpLambda slice_spec entry: {start, stop, step} is a slice, {"class_name":
    "__ellipsis__"} an Ellipsis, None a new axis."""
    if isinstance(spec, dict) and spec.get("class_name") == "__ellipsis__":
        return Ellipsis
    if isinstance(spec, dict):
        return slice(spec.get("start"), spec.get("stop"), spec.get("step"))
    if spec == "..." or spec == "Ellipsis":
        return Ellipsis
    return spec


def _tf_getitem(tensor, slice_spec):
    spec = slice_spec if isinstance(slice_spec, list) else [slice_spec]
    if isinstance(tensor, tuple):  # tf.shape(x)[0], tf.shape(x)[1:]: a size, or sizes
        if len(spec) != 1 or not isinstance(_tf_slice(spec[0]), (int, slice)):
            raise ValueError(f"a shape indexed by {str(slice_spec)[:40]} is not supported")
        return tensor[_tf_slice(spec[0])]
    return get_item(tensor, [_tf_slice(s) for s in spec])  # (negative steps: h[:, ::-1])


def _tf_shape(input, out_type=None):  # noqa: A002 - TensorFlow's argument name
    """tf.shape: the sizes as a tuple of (symbolic) integers (one output; a list would be several),
    which reshape, tile, broadcast_to, zeros and arithmetic take as they are (an export keeps the
    batch and length free)."""
    if out_type not in (None, "int32", "int64"):
        raise ValueError(f"tf.shape with out_type={str(out_type)[:20]!r} is not supported")
    return tuple(input.shape)


def _tf_filled(value: float):
    """tf.zeros / tf.ones of a shape (sizes, some from tf.shape) and a dtype (float32 by default),
    on the model's device (TFCall passes it)."""
    def filled(shape, dtype=None, device=None):
        sizes = [shape] if not isinstance(shape, (list, tuple)) else list(shape)
        return torch.full(sizes, value, dtype=_tf_dtype(dtype, "float32"), device=device)
    _MADE_FROM_SIZES.add(filled)
    return filled


_MADE_FROM_SIZES: set = set()


def _tf_transpose(a, perm=None, conjugate=False):
    return a.permute(*(perm if perm is not None else reversed(range(a.dim()))))


def _tf_squeeze(input, axis=None, squeeze_dims=None):  # noqa: A002 - TensorFlow's argument name
    axis = axis if axis is not None else squeeze_dims
    if axis is None:
        return input.squeeze()
    axes = axis if isinstance(axis, (list, tuple)) else [axis]
    return input.squeeze(tuple(a % input.dim() for a in axes))


def _tf_l2_normalize(x, axis=None, epsilon=1e-12, dim=None):
    axis = _tf_axes(axis if axis is not None else dim)
    dims = tuple(range(x.dim())) if axis is None else axis
    return x * torch.rsqrt(torch.clamp((x * x).sum(dim=dims, keepdim=True), min=epsilon))


def _tf_cast(x, dtype):
    dtype = _tf_dtype(dtype, "float32")
    if not isinstance(x, torch.Tensor):  # a size from tf.shape
        return torch.full((), x, dtype=dtype)
    return x.to(dtype)


def _tf_unary(fn):
    return lambda x: fn(x)


def _tf_dims(axis, x):
    return [a % x.dim() for a in (axis if isinstance(axis, (list, tuple)) else [axis])]


def _tf_gather(params, indices, validate_indices=None, axis=None, batch_dims=0):
    if batch_dims:
        raise ValueError("tf.gather with batch_dims is not supported")
    return gather(params, indices, 0 if axis is None else axis % params.dim())


def _tf_int(x):
    """The dtype TensorFlow keeps a sum or product of x in: x's own for integers (wrapping as
    they do), else None (torch's)."""
    return x.dtype if not (x.is_floating_point() or x.is_complex() or x.dtype == torch.bool) else None


def _tf_mean(x, dims, k):
    """tf.reduce_mean over its axes together: of integers, the sum (not wrapping, unlike
    tf.reduce_sum's) divided by the count, truncating, in their dtype."""
    if _tf_int(x) is None:
        return x.mean(dim=dims, keepdim=k)
    count = 1
    for d in dims:
        count *= x.shape[d]
    total = x.sum(dim=dims, keepdim=k, dtype=torch.int64)
    return torch.div(total, max(count, 1), rounding_mode="trunc").to(x.dtype)


def _tf_cumulative(fn, identity: float):
    """tf.math.cumsum / cumprod: exclusive (each without its own element: y shifted one step
    behind `identity`) and reverse."""
    def cumulative(x, axis=0, exclusive=False, reverse=False):
        dim = axis % x.dim()
        y = x.flip(dim) if reverse else x
        if exclusive:
            y = torch.cat([torch.full_like(y.narrow(dim, 0, 1), identity), y.narrow(dim, 0, y.shape[dim] - 1)], dim)
        out = fn(y, dim, dtype=_tf_int(y))  # (integers in their dtype, as TensorFlow)
        return out.flip(dim) if reverse else out
    return cumulative


def _tf_pad(tensor, paddings, mode="CONSTANT", constant_values=0):
    if str(mode).upper() != "CONSTANT":
        raise ValueError(f"tf.pad with mode={str(mode)[:20]!r} is not supported (CONSTANT is)")
    flat = [int(p) for pair in reversed(list(paddings)) for p in pair]  # F.pad: last dimension first
    return F.pad(tensor, flat, value=constant_values)


def _tf_where(condition, x=None, y=None):
    if x is None or y is None:
        raise ValueError("tf.where with one argument (the indices form) is not supported")
    like = x if isinstance(x, torch.Tensor) else y
    return torch.where(as_tensor_like(condition, like).bool(), as_tensor_like(x, y), as_tensor_like(y, x))


def _tf_split(value, num_or_size_splits, axis=0, num=None):
    dim = axis % value.dim()
    if isinstance(num_or_size_splits, int):
        return list(value.chunk(num_or_size_splits, dim))
    sizes = list(num_or_size_splits)
    if sizes.count(-1) == 1:  # one size left to be inferred
        sizes[sizes.index(-1)] = value.shape[dim] - sum(s for s in sizes if s != -1)
    return list(value.split(sizes, dim))


def _tf_whole(fn):
    """A TensorFlow reduction computed over its axes together (None: every axis)."""
    def reduce(input_tensor, axis=None, keepdims=False):
        return fn(input_tensor, all_axes(_tf_axes(axis), input_tensor), bool(keepdims))
    return reduce


def _tf_dtype(name, default):
    if name is None:
        return DTYPES[default]
    if name not in DTYPES:
        raise ValueError(f"dtype {str(name)[:40]!r} is not supported")
    return DTYPES[name]


def _tf_arg(pick):
    """tf.math.argmax / argmin: axis None is axis 0 (TensorFlow's default); int64 unless output_type."""
    def arg(input, axis=None, output_type=None, dimension=None):  # noqa: A002 - TensorFlow's argument names
        axis = axis if axis is not None else dimension
        return pick(input, dim=0 if axis is None else axis).to(_tf_dtype(output_type, "int64"))
    return arg


def _tf_top_k(input, k=1, sorted=True):  # noqa: A002
    values, indices = torch.topk(input, k, dim=-1, sorted=True)
    return [values, indices.to(torch.int32)]


def _tf_one_hot(indices, depth, on_value=None, off_value=None, axis=None, dtype=None):
    dtype = _tf_dtype(dtype, "float32")
    ids = torch.as_tensor(indices).long()
    inside = (ids >= 0) & (ids < depth)  # (TensorFlow: other ids give off_value everywhere)
    hot = F.one_hot(ids.clamp(0, max(depth - 1, 0)), depth).bool() & inside.unsqueeze(-1)
    on = torch.as_tensor(1 if on_value is None else on_value, dtype=dtype)
    off = torch.as_tensor(0 if off_value is None else off_value, dtype=dtype)
    out = torch.where(hot, on, off)
    return out if axis is None or axis == -1 else out.movedim(-1, axis)


def _tf_count_nonzero(input, axis=None, keepdims=None, dtype=None):  # noqa: A002
    dims = all_axes(_tf_axes(axis), input)
    return (input != 0).sum(dim=dims, keepdim=bool(keepdims)).to(_tf_dtype(dtype, "int64"))


def _tf_no_nan(fn, zero_where):
    """TensorFlow's *_no_nan and x*log(y) family: 0 wherever `zero_where(x, y)`, whatever fn gives."""
    def call(x, y):
        a, b = as_tensor_like(x, y), as_tensor_like(y, x)
        zero = zero_where(a, b)
        return torch.where(zero, torch.zeros((), dtype=a.dtype, device=a.device), fn(a, torch.where(zero, torch.ones_like(b), b)))
    return call


def _tf_norm(tensor, ord="euclidean", axis=None, keepdims=None):  # noqa: A002
    dims = all_axes(_tf_axes(axis), tensor)
    keep = bool(keepdims)
    if ord in ("euclidean", "fro") or (ord == 2 and len(dims) == 1):
        return torch.sqrt((tensor * tensor).sum(dim=dims, keepdim=keep))
    if len(dims) == 1 and isinstance(ord, (int, float)) and not isinstance(ord, bool) and ord >= 1:
        return torch.linalg.vector_norm(tensor, ord=ord, dim=dims, keepdim=keep)
    raise ValueError(f"tf.norm with ord={str(ord)[:20]!r} over {len(dims)} axes is not supported")


def _tf_bias_add(value, bias, data_format=None):
    b = torch.as_tensor(bias, dtype=value.dtype, device=value.device)
    if data_format is not None and str(data_format).startswith("NC"):
        return value + b.reshape(-1, *([1] * (value.dim() - 2)))
    return value + b


def _tf_band_part(input, num_lower, num_upper):  # noqa: A002
    rows, cols = input.shape[-2], input.shape[-1]
    i = torch.arange(rows, device=input.device)[:, None]
    j = torch.arange(cols, device=input.device)[None, :]
    keep = ((num_lower < 0) | (i - j <= num_lower)) & ((num_upper < 0) | (j - i <= num_upper))
    return torch.where(keep, input, torch.zeros((), dtype=input.dtype, device=input.device))


def _tf_repeat(input, repeats, axis=None):  # noqa: A002
    r = torch.as_tensor(repeats, device=input.device) if isinstance(repeats, list) else repeats
    if axis is None:
        return input.reshape(-1).repeat_interleave(r)
    return input.repeat_interleave(r, dim=axis)


def _tf_sequence_mask(lengths, maxlen=None, dtype=None):
    lengths = torch.as_tensor(lengths)
    n = int(lengths.max()) if maxlen is None else int(maxlen)
    out = torch.arange(n, device=lengths.device) < lengths.unsqueeze(-1)
    return out.to(_tf_dtype(dtype, "bool"))


def _tf_sort(values, axis=-1, direction="ASCENDING"):
    return torch.sort(values, dim=axis, descending=str(direction).upper() == "DESCENDING").values


def _tf_argsort(values, axis=-1, direction="ASCENDING", stable=False):
    return torch.argsort(values, dim=axis, descending=str(direction).upper() == "DESCENDING", stable=True).to(torch.int32)


def _tf_slice_op(input_, begin, size):
    out = input_
    for d, (b, n) in enumerate(zip(begin, size)):
        out = out.narrow(d, int(b), out.shape[d] - int(b) if int(n) == -1 else int(n))
    return out


def _tf_clip_by_norm(t, clip_norm, axes=None):
    dims = all_axes(_tf_axes(axes), t)
    norm = torch.sqrt((t * t).sum(dim=dims, keepdim=True))
    return t * clip_norm / torch.maximum(norm, torch.as_tensor(clip_norm, dtype=t.dtype, device=t.device))


def _tf_matmul(a, b, transpose_a=False, transpose_b=False, adjoint_a=False, adjoint_b=False, a_is_sparse=False,
               b_is_sparse=False):
    """tf.linalg.matmul on real tensors (an adjoint is the transpose; the sparsity hints change nothing)."""
    return torch.matmul(a.transpose(-1, -2) if transpose_a or adjoint_a else a,
                        b.transpose(-1, -2) if transpose_b or adjoint_b else b)


def _tf_matvec(a, b, transpose_a=False, adjoint_a=False, a_is_sparse=False, b_is_sparse=False):
    m = a.transpose(-1, -2) if transpose_a or adjoint_a else a
    return torch.matmul(m, b.unsqueeze(-1)).squeeze(-1)


def _tf_range(start, limit=None, delta=1, dtype=None, device=None):
    """tf.range: [0, start) without a limit; int32 from integers, float32 where one is a float."""
    if limit is None:
        start, limit = 0, start
    floats = any(isinstance(v, float) or (isinstance(v, torch.Tensor) and v.is_floating_point())
                 for v in (start, limit, delta))
    return torch.arange(start, limit, delta, dtype=_tf_dtype(dtype, "float32" if floats else "int32"), device=device)


def _tf_fill(dims, value, layout=None, device=None):
    """tf.fill: value's dtype (a Python float is float32, an int int32)."""
    v = torch.as_tensor(value)
    dtype = torch.float32 if isinstance(value, float) else torch.int32 if isinstance(value, int) and not isinstance(
        value, bool) else v.dtype
    return torch.full(tuple(dims), v.item() if v.dim() == 0 else value, dtype=dtype, device=device)  # (sizes stay symbolic)


_MADE_FROM_SIZES.update((_tf_range, _tf_fill))


def _tf_gather_nd(params, indices, batch_dims=0, bad_indices_policy=""):
    if batch_dims:
        raise ValueError("tf.gather_nd with batch_dims is not supported")
    return params[index_tuple(indices, params)]


def _tf_scatter_nd(add: bool):
    """tf.tensor_scatter_nd_update / _add: tensor with updates written to (added at) the indices."""
    return lambda tensor, indices, updates, bad_indices_policy="": put(tensor, indices, updates, add)


def _tf_embedding_lookup(params, ids, partition_strategy="mod", validate_indices=True, max_norm=None):
    if not isinstance(params, torch.Tensor) or max_norm is not None:
        raise ValueError("tf.nn.embedding_lookup of partitioned params or with max_norm is not supported")
    return gather(params, ids, 0)


def _tf_sigmoid_cross_entropy(labels, logits=None):
    """max(x, 0) - x z + log(1 + exp(-|x|)), TensorFlow's stable form."""
    z = torch.as_tensor(labels, device=logits.device).to(logits.dtype)
    return torch.clamp(logits, min=0) - logits * z + torch.log1p(torch.exp(-logits.abs()))


def _tf_softmax_cross_entropy(labels, logits=None, axis=-1, dim=None):
    axis = dim if dim is not None else axis
    return -(torch.as_tensor(labels).to(logits.dtype) * F.log_softmax(logits, dim=axis)).sum(dim=axis)


def _tf_sparse_softmax_cross_entropy(labels, logits=None):
    index = torch.as_tensor(labels, device=logits.device).long().unsqueeze(-1)
    return -torch.gather(F.log_softmax(logits, dim=-1), -1, index).squeeze(-1)


def _tf_rgb_to_grayscale(images):
    """TensorFlow's weights (0.2989, 0.587, 0.114), integer images computed in float32 and rounded back."""
    x = images if images.is_floating_point() else images.to(torch.float32)
    gray = (x * torch.tensor([0.2989, 0.587, 0.114], dtype=x.dtype, device=x.device)).sum(-1, keepdim=True)
    return gray if images.is_floating_point() else torch.round(gray).to(images.dtype)


def _tf_linalg_diag(diagonal, k=0, num_rows=-1, num_cols=-1, padding_value=0, align="RIGHT_LEFT"):
    if k != 0 or num_rows != -1 or num_cols != -1 or padding_value != 0:
        raise ValueError("tf.linalg.diag with k, num_rows, num_cols or padding_value is not supported")
    return torch.diag_embed(diagonal)


def _tf_image_resize(images, size, method="bilinear", preserve_aspect_ratio=False, antialias=False):
    """tf.image.resize (TensorFlow 2's: half-pixel centres), bilinear or nearest, no antialiasing;
    nearest keeps the images' dtype, bilinear gives float32 as TensorFlow does."""
    if method not in ("bilinear", "nearest") or preserve_aspect_ratio or antialias:
        raise ValueError(f"tf.image.resize with method={str(method)[:20]!r}, preserve_aspect_ratio or antialias is "
                         "not supported (bilinear, nearest)")
    height, width = int(size[0]), int(size[1])
    if not (0 < height <= 1 << 14 and 0 < width <= 1 << 14):
        raise ValueError(f"tf.image.resize to {height} x {width}: expected sizes in [1, {1 << 14}]")
    x = images if images.dim() == 4 else images.unsqueeze(0)
    out = Resizing(height, width, method, False, True).apply(x)
    out = out.to(images.dtype) if method == "nearest" else out.to(torch.float32) if not images.is_floating_point() else out
    return out if images.dim() == 4 else out.squeeze(0)


def _tf_space(fn):
    """tf.nn.depth_to_space / space_to_depth, NHWC (or NCHW)."""
    def space(input, block_size, data_format="NHWC"):  # noqa: A002 - TensorFlow's argument name
        if data_format not in ("NHWC", "NCHW"):
            raise ValueError(f"data_format={str(data_format)[:20]!r} is not supported (NHWC, NCHW)")
        return fn(input, int(block_size), data_format == "NHWC")
    return space


_TF_FUNCTIONS: Dict[str, Callable] = {
    **{f"{p}reduce_{n}": over_axes(f) for p in ("math.", "") for n, f in (
        ("sum", lambda x, a, k: x.sum(dim=a, keepdim=k, dtype=_tf_int(x))),
        ("max", lambda x, a, k: x.amax(dim=a, keepdim=k)), ("min", lambda x, a, k: x.amin(dim=a, keepdim=k)),
        ("prod", lambda x, a, k: x.prod(dim=a, keepdim=k, dtype=_tf_int(x))),
        ("any", lambda x, a, k: x.bool().any(dim=a, keepdim=k)),
        ("all", lambda x, a, k: x.bool().all(dim=a, keepdim=k)),
        ("logsumexp", lambda x, a, k: torch.logsumexp(x, dim=a, keepdim=k)))},
    # (over all their axes at once: a variance of variances is not the variance)
    **{f"{p}reduce_{n}": _tf_whole(f) for p in ("math.", "") for n, f in (
        ("mean", _tf_mean), ("std", lambda x, dims, k: x.std(dim=dims, keepdim=k, unbiased=False)),
        ("variance", lambda x, dims, k: x.var(dim=dims, keepdim=k, unbiased=False)))},
    "concat": lambda values, axis: torch.cat(list(values), dim=axis),
    "stack": lambda values, axis=0: torch.stack(list(values), dim=axis),
    "expand_dims": lambda input, axis: input.unsqueeze(axis if axis >= 0 else input.dim() + 1 + axis),  # noqa: A002
    "squeeze": _tf_squeeze, "compat.v1.squeeze": _tf_squeeze,
    "reshape": lambda tensor, shape: tensor.reshape(list(shape)),
    "transpose": _tf_transpose, "compat.v1.transpose": _tf_transpose,
    "tile": lambda input, multiples: input.repeat(*multiples),  # noqa: A002
    "cast": _tf_cast, "dtypes.cast": _tf_cast,
    "__operators__.getitem": _tf_getitem,
    "__operators__.add": pair(operator.add), "math.add": pair(operator.add),
    "math.subtract": pair(operator.sub), "math.multiply": pair(operator.mul),
    "math.truediv": pair(operator.truediv), "math.divide": pair(operator.truediv),
    "math.pow": pair(torch.pow), "math.maximum": pair(torch.maximum),
    "math.minimum": pair(torch.minimum), "math.squared_difference": pair(lambda a, b: (a - b) ** 2),
    "math.equal": pair(torch.eq), "math.not_equal": pair(torch.ne), "__operators__.eq": pair(torch.eq),
    "__operators__.ne": pair(torch.ne), "math.greater": pair(torch.gt),
    "math.greater_equal": pair(torch.ge), "math.less": pair(torch.lt), "math.less_equal": pair(torch.le),
    "math.logical_and": pair(torch.logical_and), "math.logical_or": pair(torch.logical_or),
    "linalg.matmul": _tf_matmul,
    **{name: _tf_unary(fn) for name, fn in (
        ("math.negative", torch.neg), ("math.abs", torch.abs), ("math.exp", torch.exp), ("math.log", torch.log),
        ("math.sqrt", torch.sqrt), ("math.rsqrt", torch.rsqrt), ("math.square", torch.square), ("math.tanh", torch.tanh),
        ("nn.tanh", torch.tanh), ("math.sigmoid", torch.sigmoid), ("nn.sigmoid", torch.sigmoid), ("nn.relu", F.relu),
        ("nn.relu6", F.relu6), ("nn.elu", F.elu), ("nn.selu", F.selu), ("math.softplus", F.softplus),
        ("nn.softplus", F.softplus), ("nn.silu", F.silu), ("nn.swish", F.silu), ("math.erf", torch.erf),
        ("math.log_sigmoid", F.logsigmoid), ("math.logical_not", torch.logical_not))},
    "nn.gelu": lambda features, approximate=False: F.gelu(features, approximate="tanh" if approximate else "none"),
    "nn.softmax": lambda logits, axis=None: F.softmax(logits, dim=-1 if axis is None else axis),
    "math.softmax": lambda logits, axis=None: F.softmax(logits, dim=-1 if axis is None else axis),
    "nn.log_softmax": lambda logits, axis=None: F.log_softmax(logits, dim=-1 if axis is None else axis),
    "math.l2_normalize": _tf_l2_normalize, "nn.l2_normalize": _tf_l2_normalize,
    "clip_by_value": lambda t, clip_value_min, clip_value_max: torch.clamp(t, clip_value_min, clip_value_max),
    **{name: _tf_unary(fn) for name, fn in (
        ("math.floor", torch.floor), ("math.ceil", torch.ceil), ("math.round", torch.round), ("math.sign", torch.sign),
        ("math.log1p", torch.log1p), ("math.expm1", torch.expm1), ("math.reciprocal", torch.reciprocal),
        ("math.sin", torch.sin), ("math.cos", torch.cos), ("math.softsign", F.softsign), ("nn.softsign", F.softsign))},
    "nn.leaky_relu": lambda features, alpha=0.2: F.leaky_relu(features, alpha),
    "math.floordiv": pair(torch.floor_divide), "compat.v1.floor_div": pair(torch.floor_divide),
    "math.floormod": pair(torch.remainder),
    "reverse": lambda tensor, axis: tensor.flip(_tf_dims(axis, tensor)),
    "gather": _tf_gather, "compat.v1.gather": _tf_gather,
    "math.cumsum": _tf_cumulative(torch.cumsum, 0), "cumsum": _tf_cumulative(torch.cumsum, 0),
    "pad": _tf_pad, "compat.v1.pad": _tf_pad,
    "where": _tf_where, "compat.v1.where": _tf_where, "where_v2": _tf_where,
    "unstack": lambda value, num=None, axis=0: list(value.unbind(axis % value.dim())),
    "split": _tf_split,
    "math.argmax": _tf_arg(torch.argmax), "argmax": _tf_arg(torch.argmax),
    "math.argmin": _tf_arg(torch.argmin), "argmin": _tf_arg(torch.argmin),
    "math.top_k": _tf_top_k, "nn.top_k": _tf_top_k, "one_hot": _tf_one_hot,
    "math.is_nan": _tf_unary(torch.isnan), "math.is_inf": _tf_unary(torch.isinf),
    "math.is_finite": _tf_unary(torch.isfinite),
    **{f"math.{name}": _tf_unary(fn) for name, fn in (
        ("atan", torch.atan), ("asin", torch.asin), ("acos", torch.acos), ("tan", torch.tan), ("sinh", torch.sinh),
        ("cosh", torch.cosh), ("asinh", torch.asinh), ("acosh", torch.acosh), ("atanh", torch.atanh),
        ("erfc", torch.erfc), ("erfinv", torch.erfinv), ("lgamma", torch.lgamma), ("digamma", torch.digamma))},
    "math.atan2": lambda y, x: torch.atan2(as_tensor_like(y, x), as_tensor_like(x, y)),
    "math.count_nonzero": _tf_count_nonzero, "math.cumprod": _tf_cumulative(torch.cumprod, 1),
    "cumprod": _tf_cumulative(torch.cumprod, 1),
    "math.logical_xor": pair(torch.logical_xor),
    "math.divide_no_nan": _tf_no_nan(torch.div, lambda x, y: y == 0),
    "math.multiply_no_nan": _tf_no_nan(torch.mul, lambda x, y: y == 0),
    "math.xlogy": _tf_no_nan(lambda x, y: x * torch.log(y), lambda x, y: x == 0),
    "math.xdivy": _tf_no_nan(torch.div, lambda x, y: x == 0),
    "math.reduce_euclidean_norm": over_axes(lambda x, a, k: torch.sqrt((x * x).sum(dim=a, keepdim=k))),
    "math.add_n": lambda inputs: sum(list(inputs)[1:], list(inputs)[0]),
    "norm": _tf_norm, "compat.v1.norm": _tf_norm, "linalg.norm": _tf_norm,
    "nn.bias_add": _tf_bias_add, "linalg.band_part": _tf_band_part,
    "linalg.diag_part": lambda input: torch.diagonal(input, dim1=-2, dim2=-1),  # noqa: A002
    "linalg.trace": lambda x: torch.diagonal(x, dim1=-2, dim2=-1).sum(-1), "linalg.matvec": _tf_matvec,
    # (tf.identity gives a new tensor, which no mask follows)
    "identity": lambda input: input.view_as(input), "stop_gradient": lambda input: input.detach(),  # noqa: A002
    "ones_like": lambda input, dtype=None: torch.ones_like(input, dtype=None if dtype is None else _tf_dtype(dtype, "")),
    "zeros_like": lambda input, dtype=None: torch.zeros_like(input, dtype=None if dtype is None else _tf_dtype(dtype, "")),
    "repeat": _tf_repeat, "sequence_mask": _tf_sequence_mask, "sort": _tf_sort, "argsort": _tf_argsort,
    "roll": lambda input, shift, axis: torch.roll(input, shift, dims=axis), "slice": _tf_slice_op,  # noqa: A002
    "clip_by_norm": _tf_clip_by_norm,
    "shape": _tf_shape, "compat.v1.shape": _tf_shape, "zeros": _tf_filled(0.0), "ones": _tf_filled(1.0),
    "broadcast_to": lambda input, shape: torch.broadcast_to(input, list(shape)),  # noqa: A002
    "range": _tf_range, "fill": _tf_fill, "gather_nd": _tf_gather_nd, "compat.v1.gather_nd": _tf_gather_nd,
    "tensor_scatter_nd_update": _tf_scatter_nd(False), "tensor_scatter_nd_add": _tf_scatter_nd(True),
    "math.scalar_mul": lambda scalar, x: scalar * x, "compat.v1.math.scalar_mul": lambda scalar, x: scalar * x,
    "nn.embedding_lookup": _tf_embedding_lookup, "compat.v1.nn.embedding_lookup": _tf_embedding_lookup,
    "nn.sigmoid_cross_entropy_with_logits": _tf_sigmoid_cross_entropy,
    "compat.v1.nn.sigmoid_cross_entropy_with_logits": _tf_sigmoid_cross_entropy,
    "nn.softmax_cross_entropy_with_logits": _tf_softmax_cross_entropy,
    "compat.v1.nn.softmax_cross_entropy_with_logits_v2": _tf_softmax_cross_entropy,
    "nn.sparse_softmax_cross_entropy_with_logits": _tf_sparse_softmax_cross_entropy,
    "compat.v1.nn.sparse_softmax_cross_entropy_with_logits": _tf_sparse_softmax_cross_entropy,
    "image.rgb_to_grayscale": _tf_rgb_to_grayscale, "linalg.det": lambda input: torch.linalg.det(input),  # noqa: A002
    "linalg.inv": lambda input, adjoint=False: torch.linalg.inv_ex(input.transpose(-1, -2) if adjoint else input).inverse,  # noqa: A002,E501
    "linalg.diag": _tf_linalg_diag, "linalg.matrix_transpose": lambda a, conjugate=False: a.transpose(-1, -2),
    "image.resize": _tf_image_resize, "nn.depth_to_space": _tf_space(depth_to_space),
    "nn.space_to_depth": _tf_space(space_to_depth),
}
TF_FUNCTIONS = frozenset(_TF_FUNCTIONS)


class TFCall(nn.Module):
    """A recorded TensorFlow call: fn(first argument, **keyword arguments), the tensors in either
    (anywhere in a list: shape=[tf.shape(x)[0], -1]) taken from the inputs by their TensorArg
    (spec.py reads them so)."""

    def __init__(self, function: str, fn: Callable, template: list, constants: dict):
        super().__init__()
        self.function, self.fn, self.template, self.constants = function, fn, template, constants
        # where a call that makes a tensor from sizes alone (tf.zeros) puts it: the model's device
        self.register_buffer("anchor", torch.empty(0), persistent=False)

    def forward(self, inputs, masks):
        kwargs = {k: fill_arguments(v, inputs) for k, v in self.constants.items()}
        if self.fn in _MADE_FROM_SIZES:
            kwargs["device"] = self.anchor.device
        out = self.fn(*[fill_arguments(a, inputs) for a in self.template], **kwargs)
        outs = out if isinstance(out, list) else [out]  # tf.unstack / tf.split: one output per piece
        # tf.keras keeps a mask on the tensor object: a call that returns its input itself (tf.cast
        # to the dtype it has) passes that input's mask on
        return outs, [next((m for x, m in zip(inputs, masks or []) if o is x), None) for o in outs]

    def extra_repr(self):
        return f"tf.{self.function}"


def _check_tf_value(value, ctx, depth=0):
    if isinstance(value, str):
        if len(value) > 40:
            raise ctx.error(f"the argument {value[:40]!r}... is too long")
        return
    if isinstance(value, dict):
        if value.get("class_name") == "__ellipsis__":
            return
        if set(value) - {"start", "stop", "step"}:
            raise ctx.error(f"the argument {str(value)[:60]!r} is not supported")
        check_constants({"class_name": "__slice__", "config": value}, ctx, depth)
        return
    if isinstance(value, list):
        if len(value) > MAX_ARGUMENTS or depth > 4:
            raise ctx.error("the call's arguments are too large")
        for v in value:
            _check_tf_value(v, ctx, depth + 1)
        return
    check_constants(value, ctx, depth)


def build_tf_call(cfg, ctx):
    function = Values(cfg, ctx).str("function")
    fn = _TF_FUNCTIONS.get(function)
    if fn is None:
        raise ctx.error(f"the TensorFlow call tf.{function[:60]} (a {ctx.spec.class_name} layer) is not supported; "
                        f"supported: {', '.join('tf.' + f for f in sorted(_TF_FUNCTIONS))}")
    if len(ctx.spec.calls) != 1:
        raise ctx.error(f"a {ctx.spec.class_name} layer called {len(ctx.spec.calls)} times is not supported")
    call = ctx.spec.calls[0]
    constants = {k: v for k, v in call.kwargs.items() if k != "name"}
    for value in constants.values():
        _check_tf_value(value, ctx)
    try:
        inspect.signature(fn).bind(None, **{k: None for k in constants})
    except TypeError:
        raise ctx.error(f"tf.{function} is called with arguments {sorted(constants)} that it does not take here") \
            from None
    for value in call.constants:
        _check_tf_value(value, ctx)
    return TFCall(function, fn, call.args or [TensorArg(0)], constants)


builder("TFOpLambda", "SlicingOpLambda", weights=False)(build_tf_call)


# ---------------------------------------------------------------------------------------------
# tf.keras 2.0-2.3's TensorFlowOpLayer: a TensorFlow call on Keras tensors recorded as the raw
# graph node (node_def: the op's name, its inputs, its attributes) and the constant inputs by
# position; TensorFlow 2.4 on records the same calls as TFOpLambda. The ops below are built on the
# TFOpLambda functions with TensorFlow's semantics; every other op is refused by name.
# ---------------------------------------------------------------------------------------------
_DT = {"DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_HALF": "float16", "DT_BFLOAT16": "bfloat16",
       "DT_INT32": "int32", "DT_INT64": "int64", "DT_INT16": "int16", "DT_INT8": "int8", "DT_UINT8": "uint8",
       "DT_BOOL": "bool"}
_RAW_BINARY = {"AddV2": "math.add", "Add": "math.add", "Sub": "math.subtract", "Mul": "math.multiply",
               "RealDiv": "math.truediv", "Maximum": "math.maximum", "Minimum": "math.minimum", "Pow": "math.pow",
               "SquaredDifference": "math.squared_difference", "FloorDiv": "math.floordiv",
               "FloorMod": "math.floormod", "Equal": "math.equal", "NotEqual": "math.not_equal",
               "Greater": "math.greater", "GreaterEqual": "math.greater_equal", "Less": "math.less",
               "LessEqual": "math.less_equal", "LogicalAnd": "math.logical_and", "LogicalOr": "math.logical_or"}
_RAW_UNARY = {"Neg": "math.negative", "Abs": "math.abs", "Exp": "math.exp", "Log": "math.log", "Sqrt": "math.sqrt",
              "Rsqrt": "math.rsqrt", "Square": "math.square", "Tanh": "math.tanh", "Sigmoid": "math.sigmoid",
              "Relu": "nn.relu", "Relu6": "nn.relu6", "Elu": "nn.elu", "Selu": "nn.selu", "Softplus": "math.softplus",
              "Softsign": "math.softsign", "Erf": "math.erf", "Floor": "math.floor", "Ceil": "math.ceil",
              "Round": "math.round", "Sign": "math.sign", "Log1p": "math.log1p", "Expm1": "math.expm1",
              "Reciprocal": "math.reciprocal", "Sin": "math.sin", "Cos": "math.cos", "LogicalNot": "math.logical_not",
              "Softmax": "nn.softmax", "LogSoftmax": "nn.log_softmax", "Identity": "identity"}
_RAW_REDUCE = {"Mean": "reduce_mean", "Sum": "reduce_sum", "Max": "reduce_max", "Min": "reduce_min",
               "Prod": "reduce_prod", "All": "reduce_all", "Any": "reduce_any"}


def _attr(attrs: dict, key: str, kind: str, default):
    """A node_def attribute's value of one kind: "b" (bool), "i" (int; JSON writes int64 as a
    string), "f" (float), "type" (a dtype name) or "list" (its ints)."""
    value = attrs.get(key)
    if value is None:
        return default
    if not isinstance(value, dict) or kind not in value:
        raise ValueError(f"attribute {key} is {str(value)[:40]}; expected a {kind!r} value")
    got = value[kind]
    if kind == "b" and isinstance(got, bool):
        return got
    if kind == "i" and _is_int64(got):
        return int(got)
    if kind == "f" and isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got):
        return float(got)
    if kind == "type" and isinstance(got, str):
        return _DT.get(got)
    if kind == "list" and isinstance(got, dict) and isinstance(got.get("i", []), list) and len(got.get("i", [])) <= 8 \
            and all(_is_int64(i) for i in got.get("i", [])):
        return [int(i) for i in got.get("i", [])]
    raise ValueError(f"attribute {key} is {str(value)[:40]}; expected a {kind!r} value")


def _is_int64(value) -> bool:
    """An int64 as TensorFlow's JSON writes it: a number, or a string of decimal digits."""
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value):
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and -(1 << 63) <= value < 1 << 63


def _strided_slice(x, begin, end, strides, masks):
    """StridedSlice as TensorFlow reads its bit masks (begin, end, ellipsis, new axis, shrink)."""
    begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_mask = masks
    index = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        if ellipsis_mask >> i & 1:
            index.append(Ellipsis)
        elif new_axis_mask >> i & 1:
            index.append(None)
        elif shrink_mask >> i & 1:
            index.append(b)
        else:
            index.append(slice(None if begin_mask >> i & 1 else b, None if end_mask >> i & 1 else e, s))
    return get_item(x, index)


def _raw_op(op: str, attrs: dict) -> Callable:
    """The op's computation on its full list of inputs (the tensors and constants in node order)."""
    if op in _RAW_BINARY:
        fn = _TF_FUNCTIONS[_RAW_BINARY[op]]
        return lambda a: fn(a[0], a[1])
    if op in _RAW_UNARY:
        fn = _TF_FUNCTIONS[_RAW_UNARY[op]]
        return lambda a: fn(a[0])
    if op in _RAW_REDUCE:
        fn, keep = _TF_FUNCTIONS[_RAW_REDUCE[op]], _attr(attrs, "keep_dims", "b", False)
        return lambda a: fn(a[0], a[1], keep)
    if op == "LeakyRelu":
        alpha = _attr(attrs, "alpha", "f", 0.2)
        return lambda a: F.leaky_relu(a[0], alpha)
    if op in ("MatMul", "BatchMatMul", "BatchMatMulV2"):
        ta, tb = ("transpose_a", "transpose_b") if op == "MatMul" else ("adj_x", "adj_y")
        ta, tb = _attr(attrs, ta, "b", False), _attr(attrs, tb, "b", False)
        return lambda a: _tf_matmul(as_tensor_like(a[0], a[1]), as_tensor_like(a[1], a[0]), transpose_a=ta,
                                    transpose_b=tb)
    if op == "Cast":
        dtype = _attr(attrs, "DstT", "type", None)
        if dtype is None:
            raise ValueError(f"Cast to {str(attrs.get('DstT'))[:40]} is not supported")
        return lambda a: _tf_cast(a[0], dtype)
    if op == "StridedSlice":
        masks = tuple(_attr(attrs, f"{k}_mask", "i", 0) for k in ("begin", "end", "ellipsis", "new_axis", "shrink_axis"))
        return lambda a: _strided_slice(a[0], a[1], a[2], a[3], masks)
    if op == "ConcatV2":
        return lambda a: torch.cat(list(a[:-1]), dim=a[-1])
    if op == "Pack":
        axis = _attr(attrs, "axis", "i", 0)
        return lambda a: torch.stack(list(a), dim=axis)
    if op == "Squeeze":
        dims = _attr(attrs, "squeeze_dims", "list", [])
        return lambda a: _tf_squeeze(a[0], axis=dims or None)
    simple = {"Reshape": "reshape", "Transpose": "transpose", "ExpandDims": "expand_dims", "Tile": "tile",
              "Pad": "pad", "PadV2": "pad"}
    if op in simple:
        fn = _TF_FUNCTIONS[simple[op]]
        if op == "PadV2":
            return lambda a: fn(a[0], a[1], "CONSTANT", a[2])
        return lambda a: fn(a[0], a[1])
    raise KeyError(op)


RAW_OPS = frozenset(["LeakyRelu", "MatMul", "BatchMatMul", "BatchMatMulV2", "Cast", "StridedSlice", "ConcatV2", "Pack",
                     "Squeeze", "Reshape", "Transpose", "ExpandDims", "Tile", "Pad", "PadV2", *_RAW_BINARY,
                     *_RAW_UNARY, *_RAW_REDUCE])


class TFOpNode(nn.Module):
    """A TensorFlowOpLayer: its op on the node's inputs in order, each a constant the layer keeps
    or the next of the layer's tensor inputs; one output, no mask."""

    def __init__(self, op: str, fn: Callable, slots: list):
        super().__init__()
        self.op, self.fn, self.slots = op, fn, slots  # slots: a constant, or None for the next tensor

    def forward(self, inputs, masks):
        if len(inputs) != self.slots.count(None):
            raise ValueError(f"TensorFlow op {self.op} takes {self.slots.count(None)} tensors; got {len(inputs)}")
        tensors = iter(inputs)
        return [self.fn([next(tensors) if slot is None else slot for slot in self.slots])], [None]

    def extra_repr(self):
        return f"op={self.op}"


def build_tf_op_layer(cfg, ctx):
    node = cfg.get("node_def")
    if not isinstance(node, dict) or not isinstance(node.get("op"), str) or not isinstance(node.get("input", []), list):
        raise ctx.error("TensorFlowOpLayer config has no node_def with an op and its inputs")
    op, attrs = node["op"], node.get("attr") or {}
    if not isinstance(attrs, dict):
        raise ctx.error("TensorFlowOpLayer node_def attr is not a mapping")
    if op not in RAW_OPS:
        raise ctx.error(f"the TensorFlow op {op[:60]} (a TensorFlowOpLayer) is not supported; supported: "
                        f"{', '.join(sorted(RAW_OPS))}")
    constants = cfg.get("constants") or {}
    count = len(node.get("input", []))
    if not isinstance(constants, dict) or count > MAX_ARGUMENTS or not all(
            isinstance(k, str) and re.fullmatch(r"[0-9]{1,4}", k) and int(k) < count for k in constants):
        raise ctx.error("TensorFlowOpLayer constants are not numbered among its node's inputs")
    for value in constants.values():
        _check_tf_value(value, ctx)
    if len(ctx.spec.calls) != 1:
        raise ctx.error(f"a TensorFlowOpLayer called {len(ctx.spec.calls)} times is not supported")
    try:
        fn = _raw_op(op, attrs)
    except (ValueError, TypeError) as e:
        raise ctx.error(f"TensorFlowOpLayer {op}: {str(e)[:120]}") from None
    return TFOpNode(op, fn, [constants.get(str(i)) for i in range(count)])


builder("TensorFlowOpLayer", weights=False)(build_tf_op_layer)
