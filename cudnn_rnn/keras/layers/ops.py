"""The Keras 3 operations recorded in functional graphs (keras.ops calls, mostly the mask
computations: NotEqual, Any, ExpandDims, Cast, ConvertToTensor, ...): build_op makes an Op module of one. They are
not layers, so they are not in BUILDERS; load.py builds them with build_op."""
from __future__ import annotations

import math
from typing import Callable, Dict

import torch
from torch import nn

from ..graph.spec import LayerSpec
from .registry import BuildContext
from .values import Values


class Op(nn.Module):
    """A keras.ops function in the graph: tensors in, one tensor out, no mask."""

    def __init__(self, fn: Callable, description: str):
        super().__init__()
        self.fn, self.description = fn, description

    def forward(self, inputs, masks):
        return [self.fn(*inputs)], [None]

    def extra_repr(self):
        return self.description


def _op_constant(ctx, default=None):
    consts = ctx.spec.calls[0].constants if ctx.spec.calls else []
    return consts[0] if consts else default


def _axis_reduce(reduce):
    def build(cfg, ctx):
        axis, keepdims = cfg.get("axis"), bool(cfg.get("keepdims", False))
        if axis is None:
            return Op(lambda x: reduce(x.reshape(-1), 0, False) if not keepdims else reduce(x, None, True), "all axes")
        axes = tuple(axis) if isinstance(axis, list) else (axis,)

        def fn(x):
            for a in sorted((a % x.dim() for a in axes), reverse=True):
                x = reduce(x, a, keepdims)
            return x

        return Op(fn, f"axis={axis}, keepdims={keepdims}")

    return build


_OPS: Dict[str, Callable] = {
    "NotEqual": lambda cfg, ctx: _binary(torch.ne, ctx),
    "Equal": lambda cfg, ctx: _binary(torch.eq, ctx),
    "Greater": lambda cfg, ctx: _binary(torch.gt, ctx),
    "Less": lambda cfg, ctx: _binary(torch.lt, ctx),
    "LogicalOr": lambda cfg, ctx: _binary(torch.logical_or, ctx),
    "LogicalAnd": lambda cfg, ctx: _binary(torch.logical_and, ctx),
    "LogicalNot": lambda cfg, ctx: Op(torch.logical_not, "not"),
    "Any": _axis_reduce(lambda x, a, k: x.any(dim=a, keepdim=k) if a is not None else x.any()),
    "All": _axis_reduce(lambda x, a, k: x.all(dim=a, keepdim=k) if a is not None else x.all()),
    "ExpandDims": lambda cfg, ctx: Op(lambda x: x.unsqueeze(int(cfg["axis"]) if int(cfg["axis"]) >= 0 else x.dim() + 1 + int(cfg["axis"])),
                                      f"axis={cfg.get('axis')}"),
    "ZerosLike": lambda cfg, ctx: Op(lambda x: torch.zeros_like(x, dtype=_dtype_of(cfg, x)), "zeros_like"),
    "OnesLike": lambda cfg, ctx: Op(lambda x: torch.ones_like(x, dtype=_dtype_of(cfg, x)), "ones_like"),
    "Concatenate": lambda cfg, ctx: Op(lambda *xs: torch.cat(xs, dim=int(cfg.get("axis", 0))), f"axis={cfg.get('axis')}"),
    "Cast": lambda cfg, ctx: Op(lambda x: x.to(_dtype_of(cfg, x)), f"dtype={cfg.get('dtype')}"),
    # (Attention.compute_mask records its query mask through keras.ops.convert_to_tensor)
    "ConvertToTensor": lambda cfg, ctx: Op(lambda x: x.to(_dtype_of(cfg, x)), f"dtype={cfg.get('dtype')}"),
}


OP_CLASSES = frozenset(_OPS)


def _dtype_of(cfg, x):
    name = cfg.get("dtype")
    if not name:
        return x.dtype
    return {"bool": torch.bool, "float32": torch.float32, "float64": torch.float64, "int32": torch.int32,
            "int64": torch.int64}.get(str(name), x.dtype)


def _binary(fn, ctx):
    constant = _op_constant(ctx)
    if constant is None:
        return Op(fn, fn.__name__)
    return Op(lambda x: fn(x, torch.as_tensor(constant, dtype=x.dtype if not isinstance(constant, bool) else torch.bool)),
              f"{fn.__name__} {constant!r}")


def build_op(spec: LayerSpec, ctx: "BuildContext") -> nn.Module:
    build = _OPS.get(spec.class_name)
    if build is None:
        raise ctx.error(f"Keras operation {spec.module[:60]}.{spec.class_name[:60]} is not supported "
                        f"(supported: {', '.join(sorted(_OPS))})")
    axis = spec.config.get("axis")
    if axis is not None and not isinstance(axis, list):
        Values(spec.config, ctx).int("axis", lo=-8, hi=8)
    elif axis is not None:
        Values(spec.config, ctx).int_list("axis", lo=-8, hi=8)
    if spec.class_name == "ExpandDims" and axis is None:
        raise ctx.error("ExpandDims has no axis")
    if "dtype" in spec.config and spec.config["dtype"] is not None and not isinstance(spec.config["dtype"], (str, dict)):
        raise ctx.error(f"config dtype={str(spec.config['dtype'])[:40]!r}; expected a dtype name")
    constant = _op_constant(ctx)
    if constant is not None and (not isinstance(constant, (int, float)) or
                                 (isinstance(constant, float) and not math.isfinite(constant))):
        raise ctx.error(f"the constant operand {str(constant)[:40]!r} is not a finite number")
    return build(spec.config, ctx)
