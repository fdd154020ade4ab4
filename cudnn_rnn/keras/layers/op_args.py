"""The arguments of recorded Keras operations, read from their configs: dtypes, axes and the
shared builders (an operation without arguments, a reduction over axes, an arg-reduction), and
the dtype and gather rules they share, that ops.py, ops_numpy.py, ops_nn.py, ops_math.py and ops_tf.py build
their tables from."""
from __future__ import annotations

from typing import Optional

import torch

from .registry import dtype_name
from .values import Values


DTYPES = {"bool": torch.bool, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
          "float64": torch.float64, "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16,
          "int32": torch.int32, "int64": torch.int64}


def dtype_arg(cfg, ctx, key="dtype") -> Optional[torch.dtype]:
    name = cfg.get(key)
    if isinstance(name, dict):
        name = dtype_name(name)
    if name is None:
        return None
    if name not in DTYPES:
        raise ctx.error(f"config {key}={str(name)[:40]!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


def as_tensor_like(a, like):
    """A Python number as a tensor beside `like` (torch.maximum and friends take tensors only);
    a float takes a floating `like`'s dtype, as TensorFlow converts it."""
    if isinstance(a, torch.Tensor):
        return a
    if not isinstance(like, torch.Tensor):
        return torch.as_tensor(a)
    return torch.as_tensor(a, dtype=like.dtype if like.is_floating_point() and isinstance(a, float) else None,
                           device=like.device)


def pair(fn):
    return lambda x, y: fn(as_tensor_like(x, y), as_tensor_like(y, x))  # (x, y: TensorFlow's argument names)


def axes_arg(cfg, ctx, key="axis"):
    axis = cfg.get(key)
    if axis is None:
        return None
    if isinstance(axis, list):
        return tuple(Values(cfg, ctx).int_list(key, lo=-8, hi=8))
    return Values(cfg, ctx).int(key, lo=-8, hi=8)


def over_axes(fn):
    """fn(x, axis, keepdims) applied over an axis, a tuple of them (one at a time), or (None)
    every axis: for the reductions that compose axis by axis (sum, max, any, ...; not std or
    var: whole_reduction), of keras.ops and of TensorFlow alike."""
    def reduce(x, axis=None, keepdims=False):
        if axis is None:
            y = fn(x.reshape(-1), 0, False)
            return y.reshape([1] * x.dim()) if keepdims else y
        for a in sorted((a % x.dim() for a in (tuple(axis) if isinstance(axis, (list, tuple)) else (axis,))),
                        reverse=True):
            x = fn(x, a, keepdims)
        return x
    return reduce


def reduction(name, fn):
    """A keras.ops reduction: cfg axis (None: every axis) and keepdims."""
    reduce = over_axes(fn)

    def build(cfg, ctx):
        axis, keepdims = axes_arg(cfg, ctx), Values(cfg, ctx).bool("keepdims", False)
        return (lambda x: reduce(x, axis, keepdims)), f"{name} axis={axis} keepdims={keepdims}"
    return build


def arg_reduction(fn):
    """fn(x, axis, keepdims) over one axis, or over the flattened input (axis None)."""
    def build(cfg, ctx):
        axis, keepdims = axis_or_none(cfg, ctx), Values(cfg, ctx).bool("keepdims", False)
        return (lambda x: fn(*along(x, axis), keepdims and axis is not None)), f"axis={axis}"
    return build


def fixed(fn, name=""):
    """An operation without constructor arguments of its own."""
    return lambda cfg, ctx: (fn, name)


def axis_or_none(cfg, ctx, key="axis", default=None):
    """One axis, or None (the operation reads the flattened input), from config `key`."""
    axis = axes_arg(cfg, ctx, key) if key in cfg else default
    if isinstance(axis, tuple):
        raise ctx.error(f"config {key}={str(cfg.get(key))[:40]}; the operation takes one axis")
    return axis


def along(x, axis):
    """(x, dimension): x flattened and 0 where axis is None, else x and the axis."""
    return (x.reshape(-1), 0) if axis is None else (x, axis)


def one_axis(cfg, ctx, default=None):
    axis = axes_arg(cfg, ctx)
    axis = default if axis is None else axis
    if not isinstance(axis, int):
        raise ctx.error(f"config axis={str(cfg.get('axis'))[:40]}; expected one axis")
    return axis


def floating(x):
    """x as Keras's floating functions take it: integers and booleans as float32."""
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.to(torch.float32)


def all_axes(axis, x) -> tuple:
    """An axis, a tuple of them or (None) every axis, as a tuple of non-negative axes of x."""
    if axis is None:
        return tuple(range(x.dim()))
    return tuple(a % x.dim() for a in (axis if isinstance(axis, tuple) else (axis,)))


def whole_reduction(fn, name, floating_result=False):
    """fn(x, dims, keepdims) over all its axes at once (axis None: every axis), dims a tuple of
    non-negative axes."""
    def build(cfg, ctx):
        axis, keepdims = axes_arg(cfg, ctx), Values(cfg, ctx).bool("keepdims", False)

        def reduce(x):
            x = floating(x) if floating_result else torch.as_tensor(x)
            return fn(x, all_axes(axis, x), keepdims)
        return reduce, f"{name} axis={axis} keepdims={keepdims}"
    return build


def summable(x):
    """x in the dtype Keras sums, multiplies and accumulates in: booleans and small integers as
    int32, others as they are (torch would take int64)."""
    return x.to(torch.int32) if x.dtype in (torch.bool, torch.uint8, torch.int8, torch.int16) else x


def in_summable_dtype(fn):
    """fn(x, axis, keepdims) on summable(x), its result in that dtype (sum, prod and their NaN
    forms)."""
    def reduce(x, a, k=False):
        x = summable(x)
        return fn(x, a, k).to(x.dtype)
    return reduce


def gather(x, indices, axis: int):
    """x's slices at `indices` (any shape, non-negative) along axis: the indices' shape in place of
    that axis (keras.ops.take, tf.gather)."""
    index = torch.as_tensor(indices, dtype=torch.long, device=x.device)
    out = x.index_select(axis, index.reshape(-1))
    return out.reshape(x.shape[:axis] + index.shape + x.shape[axis + 1:])
