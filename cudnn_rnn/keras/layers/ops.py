"""The Keras 3 operations a functional graph records (keras.ops calls on Keras tensors, and the
Python operators on them: `x + y` is Add, `x[:, -1]` is GetItem): build_op makes an Op module of
one. They are not layers, so they are not in BUILDERS; load.py builds them with build_op.
(tf.keras 2's recorded TensorFlow calls are layers: ops_tf.py.)

An operation's constructor arguments (axis, keepdims, newshape, ...) are its config, read with
Values; its call arguments are the call's positional arguments as written (Call.args: tensors,
constants, lists, slices). Each entry of _OPS computes what keras.ops computes, with torch."""
from __future__ import annotations

import inspect
import math
import operator
import re
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..graph.spec import LayerSpec, TensorArg
from .activations import keras_relu
from .op_args import (arg_reduction, as_tensor_like, axes_arg, dtype_arg, fixed, floating, in_summable_dtype, one_axis, pair,
                      reduction, summable, whole_reduction)
from .ops_image import IMAGE_OPS
from .ops_math import MATH_OPS
from .ops_nn import NN_OPS
from .ops_numpy import NUMPY_OPS
from .registry import BuildContext
from .values import MAX_SIZE, Values


class Op(nn.Module):
    """A keras.ops function in the graph: its positional and keyword arguments (tensors from the
    inputs, constants as recorded) in; its tensors out (several for keras.ops.split, top_k,
    moments, ...), no mask."""

    def __init__(self, fn: Callable, template: list, description: str, keywords: Optional[dict] = None,
                 constants: Sequence[torch.Tensor] = ()):
        super().__init__()
        self.fn, self.template, self.description, self.keywords = fn, template, description, keywords or {}
        for i, c in enumerate(constants):  # constant tensor arguments, as buffers (they follow .to(device))
            self.register_buffer(f"constant_{i}", c)
        self.n_constants = len(constants)

    def forward(self, inputs, masks):
        consts = [getattr(self, f"constant_{i}") for i in range(self.n_constants)]
        args = [fill_arguments(a, inputs, consts) for a in self.template] if self.template else list(inputs)
        out = self.fn(*args, **{k: fill_arguments(v, inputs, consts) for k, v in self.keywords.items()})
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        # Keras attaches a mask to a tensor object: an operation that returns its input itself (a
        # cast to the dtype it has) passes that input's mask on; any other output has none
        return outs, [next((m for x, m in zip(inputs, masks or []) if o is x), None) for o in outs]

    def extra_repr(self):
        return self.description


@dataclass(frozen=True)
class ConstantArg:
    """A constant tensor argument of a recorded call (Keras writes its values: `x + np.ones(4)`,
    `ops.matmul(x, ops.eye(4))`): the Op's buffer constant_<index>."""
    index: int


def fill_arguments(value, inputs, constants=()):
    if isinstance(value, TensorArg):
        return inputs[value.index]
    if isinstance(value, ConstantArg):
        return constants[value.index]
    if isinstance(value, list):
        return [fill_arguments(v, inputs, constants) for v in value]
    if isinstance(value, dict) and value.get("class_name") == "__slice__":
        c = value.get("config") or {}
        return slice(c.get("start"), c.get("stop"), c.get("step"))
    return value


def get_item(x, key):
    """x[key] with Keras's serialized key: an index, a slice (any step: `x[:, ::-1]`), None (a new
    axis), Ellipsis or a tuple of these."""
    def one(k):
        if k is None or isinstance(k, (int, slice)) and not isinstance(k, bool):
            return k
        if k == "Ellipsis" or k is Ellipsis or (isinstance(k, dict) and k.get("class_name") == "__ellipsis__"):
            return Ellipsis
        if isinstance(k, torch.Tensor):
            return k
        raise ValueError(f"GetItem index {str(k)[:40]!r} is not supported")
    keys = [one(k) for k in key] if isinstance(key, list) else [one(key)]
    if any(isinstance(k, slice) and k.step is not None and k.step < 0 for k in keys):
        x, keys = _forward_steps(x, keys)
    return x[tuple(keys)] if isinstance(key, list) else x[keys[0]]


def _forward_steps(x, keys):
    """(x, keys) with each dimension that a negative-step slice reads flipped and that slice
    turned into the forward one reading the flipped dimension (torch slices only forward)."""
    if any(isinstance(k, torch.Tensor) for k in keys):
        raise ValueError("GetItem with a negative-step slice beside a tensor index is not supported")
    reads = sum(1 for k in keys if k is not None and k is not Ellipsis)
    dim, out = 0, []
    for k in keys:
        if k is Ellipsis:
            dim += x.dim() - reads
        elif k is not None:
            if isinstance(k, slice) and k.step is not None and k.step < 0:
                n = x.shape[dim]
                k = slice(_flipped(k.start, n), _flipped(k.stop, n), -k.step)
                x = x.flip(dim)
            dim += 1
        out.append(k)
    return x, out


def _flipped(i, n):
    """Where position i of a negative-step slice (Python's rules: negative from the end, clamped to
    [-1, n-1]) lies in the flipped dimension; None stays None (the slice's own end)."""
    if i is None:
        return None
    # (written so that a free length n needs no guard: i < 0 is n + i clamped below at -1)
    return torch.sym_min(-1 - i, n) if i < 0 else torch.sym_max(n - 1 - i, 0)


def _reshape(cfg, ctx):
    shape = Values(cfg, ctx).int_list("newshape", lo=-1, hi=MAX_SIZE)
    if shape.count(-1) > 1:
        raise ctx.error(f"Reshape newshape {shape} has more than one -1")
    return (lambda x: x.reshape(shape)), f"newshape={shape}"


def _transpose(cfg, ctx):
    axes = cfg.get("axes")
    if axes is None:
        return (lambda x: x.permute(*reversed(range(x.dim())))), "reverse"
    axes = Values(cfg, ctx).int_list("axes", lo=-8, hi=8)
    return (lambda x: x.permute(*axes)), f"axes={axes}"


def _squeeze(cfg, ctx):
    axis = axes_arg(cfg, ctx)
    if axis is None:
        return (lambda x: x.squeeze()), "all"
    axes = axis if isinstance(axis, tuple) else (axis,)
    return (lambda x: x.squeeze(tuple(a % x.dim() for a in axes))), f"axis={axis}"


def _expand_dims(cfg, ctx):
    axis = axes_arg(cfg, ctx)
    if axis is None:
        raise ctx.error("ExpandDims has no axis")
    axes = axis if isinstance(axis, tuple) else (axis,)

    def expand(x):
        n = x.dim() + len(axes)
        for a in sorted(a % n for a in axes):
            x = x.unsqueeze(a)
        return x
    return expand, f"axis={axis}"




def _clip(cfg, ctx):
    v = Values(cfg, ctx)
    lo, hi = v.float("x_min", None), v.float("x_max", None)
    # integer bounds keep an integer tensor's dtype, as Keras's clip does
    lo, hi = (int(b) if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool) else b
              for b, k in ((lo, "x_min"), (hi, "x_max")))
    return (lambda x: torch.clamp(x.to(torch.int32) if x.dtype == torch.bool else x, lo, hi)), f"[{lo}, {hi}]"


def _round(cfg, ctx):
    decimals = Values(cfg, ctx).int("decimals", 0, lo=-16, hi=16)

    def round_(x):
        if x.is_floating_point():
            return torch.round(x, decimals=decimals)
        return torch.round(x.to(torch.float32), decimals=decimals).to(x.dtype)  # (as Keras: in float32, back)
    return round_, f"decimals={decimals}"


def _float_rounding(fn):
    """Floor / Ceil: an integer or boolean input comes out float32, as in Keras."""
    return lambda x: fn(floating(x))


def _cast(cfg, ctx):
    dtype = dtype_arg(cfg, ctx)
    return (lambda x: torch.as_tensor(x).to(dtype) if dtype is not None else torch.as_tensor(x)), f"dtype={dtype}"


def _einsum(cfg, ctx):
    subscripts = Values(cfg, ctx).str("subscripts")
    if not re.fullmatch(r"[a-zA-Z.,\->\s]{1,200}", subscripts):
        raise ctx.error(f"Einsum subscripts {subscripts[:60]!r} are not an einsum equation")
    return (lambda *xs: torch.einsum(subscripts, *xs)), subscripts


def _repeat(cfg, ctx):
    v = Values(cfg, ctx)
    repeats, axis = v.int("repeats", lo=1, hi=1 << 16), axes_arg(cfg, ctx)
    if axis is None:
        return (lambda x: x.reshape(-1).repeat_interleave(repeats)), f"repeats={repeats}"
    return (lambda x: x.repeat_interleave(repeats, dim=axis)), f"repeats={repeats} axis={axis}"


def _tile(cfg, ctx):
    repeats = cfg.get("repeats")
    reps = Values({"repeats": repeats if isinstance(repeats, list) else [repeats]}, ctx).int_list("repeats", lo=1,
                                                                                                  hi=1 << 16)

    def tile(x):
        r = list(reps)
        if len(r) < x.dim():
            r = [1] * (x.dim() - len(r)) + r
        return x.repeat(*r) if len(r) >= x.dim() else x
    return tile, f"repeats={reps}"


def _softmax_like(fn):
    def build(cfg, ctx):
        axis = one_axis(cfg, ctx, -1)
        return (lambda x: fn(x, dim=axis)), f"axis={axis}"
    return build


def _stack(cfg, ctx):
    axis = one_axis(cfg, ctx, 0)
    return (lambda xs: torch.stack(list(xs), dim=axis)), f"axis={axis}"


def _concatenate(cfg, ctx):
    axis = one_axis(cfg, ctx, 0)
    # keras.ops.concatenate takes a list; older configs call it with the tensors themselves
    return (lambda *xs: torch.cat(list(xs[0]) if len(xs) == 1 and isinstance(xs[0], list) else list(xs), dim=axis)), \
        f"axis={axis}"


def _cumulative(fn):
    def build(cfg, ctx):
        axis, dtype = axes_arg(cfg, ctx), dtype_arg(cfg, ctx)

        def cumulative(x):
            x = x.to(dtype) if dtype is not None else summable(x) if x.dtype == torch.bool else x
            return (fn(x.reshape(-1), 0) if axis is None else fn(x, axis)).to(x.dtype)
        return cumulative, f"axis={axis}"
    return build


def _like(fill):
    def build(cfg, ctx):
        dtype = dtype_arg(cfg, ctx)
        return (lambda x: fill(x, dtype=dtype or x.dtype)), f"dtype={dtype}"
    return build


_OPS: Dict[str, Callable] = {
    # arithmetic and comparison (keras.src.ops.numpy); Python numbers as recorded
    "Add": fixed(operator.add), "Subtract": fixed(operator.sub), "Multiply": fixed(operator.mul),
    "Divide": fixed(operator.truediv), "TrueDivide": fixed(operator.truediv),
    "FloorDivide": fixed(operator.floordiv), "Mod": fixed(operator.mod), "Power": fixed(operator.pow),
    "Maximum": fixed(pair(torch.maximum)), "Minimum": fixed(pair(torch.minimum)),
    "Matmul": fixed(pair(torch.matmul)), "Arctan2": fixed(pair(torch.atan2)),
    "Equal": fixed(operator.eq), "NotEqual": fixed(operator.ne), "Greater": fixed(operator.gt),
    "GreaterEqual": fixed(operator.ge), "Less": fixed(operator.lt), "LessEqual": fixed(operator.le),
    "LogicalAnd": fixed(pair(torch.logical_and)), "LogicalOr": fixed(pair(torch.logical_or)),
    "LogicalXor": fixed(pair(torch.logical_xor)), "LogicalNot": fixed(torch.logical_not),
    # elementwise
    "Abs": fixed(torch.abs), "Absolute": fixed(torch.abs), "Negative": fixed(torch.neg),
    "Exp": fixed(torch.exp), "Expm1": fixed(torch.expm1), "Log": fixed(torch.log), "Log1p": fixed(torch.log1p),
    "Log2": fixed(torch.log2), "Log10": fixed(torch.log10), "Sqrt": fixed(torch.sqrt), "Rsqrt": fixed(torch.rsqrt),
    "Square": fixed(torch.square), "Sign": fixed(torch.sign), "Floor": fixed(_float_rounding(torch.floor)),
    "Ceil": fixed(_float_rounding(torch.ceil)), "Reciprocal": fixed(torch.reciprocal), "Sin": fixed(torch.sin),
    "Cos": fixed(torch.cos), "Tan": fixed(torch.tan), "Arcsin": fixed(torch.asin), "Arccos": fixed(torch.acos),
    "Arctan": fixed(torch.atan), "Sinh": fixed(torch.sinh), "Cosh": fixed(torch.cosh), "Tanh": fixed(torch.tanh),
    "Erf": fixed(torch.erf), "IsNan": fixed(torch.isnan), "IsInf": fixed(torch.isinf),
    "IsFinite": fixed(torch.isfinite),
    "Round": _round,
    "Clip": _clip, "Where": fixed(lambda c, a, b: torch.where(as_tensor_like(c, a).bool(), as_tensor_like(a, b), as_tensor_like(b, a))),
    # activations (keras.src.ops.nn)
    "Relu": fixed(F.relu), "Relu6": fixed(F.relu6), "Sigmoid": fixed(torch.sigmoid), "Softplus": fixed(F.softplus),
    "Softsign": fixed(F.softsign), "Silu": fixed(F.silu), "Swish": fixed(F.silu), "Selu": fixed(F.selu),
    "LogSigmoid": fixed(F.logsigmoid), "HardSigmoid": fixed(F.hardsigmoid), "HardSilu": fixed(F.hardswish),
    "HardSwish": fixed(F.hardswish),
    "Gelu": lambda cfg, ctx: ((lambda x, a=Values(cfg, ctx).bool("approximate", True): F.gelu(
        x, approximate="tanh" if a else "none")), "gelu"),
    "Elu": lambda cfg, ctx: ((lambda x, a=Values(cfg, ctx).float("alpha", 1.0): F.elu(x, a)), "elu"),
    "LeakyRelu": lambda cfg, ctx: ((lambda x, s=Values(cfg, ctx).float("negative_slope", 0.2): keras_relu(
        x, s, None, 0.0)), "leaky_relu"),
    "Softmax": _softmax_like(F.softmax), "LogSoftmax": _softmax_like(F.log_softmax),
    # reductions
    "Sum": reduction("sum", in_summable_dtype(lambda x, a, k: x.sum(dim=a, keepdim=k))),
    "Mean": whole_reduction(lambda x, dims, k: x.mean(dim=dims, keepdim=k), "mean", True),
    "Max": reduction("max", lambda x, a, k=False: x.amax(dim=a, keepdim=k)),
    "Min": reduction("min", lambda x, a, k=False: x.amin(dim=a, keepdim=k)),
    "Amax": reduction("max", lambda x, a, k=False: x.amax(dim=a, keepdim=k)),
    "Amin": reduction("min", lambda x, a, k=False: x.amin(dim=a, keepdim=k)),
    "Prod": reduction("prod", in_summable_dtype(lambda x, a, k: x.prod(dim=a, keepdim=k))),
    "Any": reduction("any", lambda x, a, k=False: x.bool().any(dim=a, keepdim=k)),
    "All": reduction("all", lambda x, a, k=False: x.bool().all(dim=a, keepdim=k)),
    # (over all their axes at once: a variance of variances is not the variance)
    "Std": whole_reduction(lambda x, dims, k: x.std(dim=dims, keepdim=k, unbiased=False), "std", True),
    "Var": whole_reduction(lambda x, dims, k: x.var(dim=dims, keepdim=k, unbiased=False), "var", True),
    "Argmax": arg_reduction(lambda x, a, k: x.argmax(dim=a, keepdim=k).to(torch.int32)),
    "Argmin": arg_reduction(lambda x, a, k: x.argmin(dim=a, keepdim=k).to(torch.int32)),
    "Cumsum": _cumulative(torch.cumsum), "Cumprod": _cumulative(torch.cumprod),
    # shape and indexing
    "Reshape": _reshape, "Transpose": _transpose, "Squeeze": _squeeze, "ExpandDims": _expand_dims,
    "Concatenate": _concatenate, "Stack": _stack, "GetItem": fixed(get_item),
    "Flip": lambda cfg, ctx: ((lambda x, a=axes_arg(cfg, ctx): torch.flip(x, list(range(x.dim())) if a is None else
                                                                      list(a) if isinstance(a, tuple) else [a])), "flip"),
    "Repeat": _repeat, "Tile": _tile, "Einsum": _einsum,
    "Moveaxis": lambda cfg, ctx: ((lambda x, s=axes_arg(cfg, ctx, "source"), d=axes_arg(cfg, ctx, "destination"):
                                   torch.movedim(x, s, d)), "moveaxis"),
    "Swapaxes": lambda cfg, ctx: ((lambda x, a=Values(cfg, ctx).int("axis1", lo=-8, hi=8),
                                   b=Values(cfg, ctx).int("axis2", lo=-8, hi=8): x.transpose(a, b)), "swapaxes"),
    # dtypes and constants
    "Cast": _cast, "ConvertToTensor": _cast, "Array": _cast, "ZerosLike": _like(torch.zeros_like),
    "OnesLike": _like(torch.ones_like),
    "EmptyLike": _like(torch.zeros_like),  # (an empty array holds whatever memory held: zeros here)
}

# which file's table builds each operation class (docs/keras-layers.md says it)
OP_FILES = {**dict.fromkeys(_OPS, "ops"), **dict.fromkeys(NUMPY_OPS, "ops_numpy"), **dict.fromkeys(NN_OPS, "ops_nn"),
            **dict.fromkeys(MATH_OPS, "ops_math"), **dict.fromkeys(IMAGE_OPS, "ops_image")}
if len(OP_FILES) != len(_OPS) + len(NUMPY_OPS) + len(NN_OPS) + len(MATH_OPS) + len(IMAGE_OPS):
    raise ImportError("an operation class is in two tables")
_OPS.update(NUMPY_OPS)
_OPS.update(NN_OPS)
_OPS.update(MATH_OPS)
_OPS.update(IMAGE_OPS)
OP_CLASSES = frozenset(_OPS)


# Arguments that Keras 3.0-3.10 passed to these operations' calls and Keras 3.11 and later keeps in
# their configs: (name, its position in the older call). A file of either keeps them in one place.
_CALL_TO_CONFIG = {"ZerosLike": ("dtype", 1), "OnesLike": ("dtype", 1), "FullLike": ("dtype", 2),
                   "Slice": ("shape", 2), "Scatter": ("shape", 2), "SearchSorted": ("side", 2),
                   "Isclose": ("equal_nan", 4), "DotProductAttention": ("flash_attention", 6)}


def _older_call(spec: LayerSpec, call):
    """(config, call) with an argument Keras <= 3.10 recorded in the call (_CALL_TO_CONFIG) moved
    to the config, as Keras 3.11 and later records it."""
    moved = _CALL_TO_CONFIG.get(spec.class_name)
    if moved is None or call is None:
        return spec.config, call
    name, position = moved
    args, kwargs = list(call.args), dict(call.kwargs)
    if name in kwargs and name not in call.tensor_kwargs():
        value = kwargs.pop(name)
    elif len(args) > position and not isinstance(args[position], TensorArg):
        value = args.pop(position)
    else:
        return spec.config, call
    return {name: value, **spec.config}, replace(call, args=args, kwargs=kwargs)


def build_op(spec: LayerSpec, ctx: "BuildContext") -> nn.Module:
    build = _OPS.get(spec.class_name)
    if build is None:
        raise ctx.error(f"Keras operation {spec.module[:60]}.{spec.class_name[:60]} is not supported "
                        f"(supported: {', '.join(sorted(_OPS))})")
    config, call = _older_call(spec, spec.calls[0] if spec.calls else None)
    check_constants(call.args if call else [], ctx)
    constants: List[torch.Tensor] = []
    template = _hoist(call.args, constants, ctx) if call else []
    keywords = _hoist(_keywords(call, ctx), constants, ctx) if call else {}
    fn, description = build(config, ctx)
    if keywords:
        try:
            inspect.signature(fn).bind(*template, **keywords)
        except TypeError:
            raise ctx.error(f"the operation is called with keyword arguments {sorted(keywords)} that it does not "
                            "take here") from None
    return Op(fn, template, description or spec.class_name, keywords, constants)


_MAX_CONSTANT = 1 << 20  # elements of one constant tensor argument


def _hoist(value, constants: list, ctx):
    """value with each constant tensor ({"class_name": "__tensor__"} or "__numpy__") made a tensor, appended to
    `constants` and replaced by its ConstantArg."""
    if isinstance(value, dict) and value.get("class_name") in ("__tensor__", "__numpy__"):
        config = value.get("config") if isinstance(value.get("config"), dict) else {}
        dtype = dtype_arg(config, ctx) or torch.float32
        try:
            t = torch.tensor(config.get("value"), dtype=dtype)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise ctx.error(f"a constant tensor argument {str(config.get('value'))[:60]!r} is not an array of "
                            "numbers") from None
        if t.numel() > _MAX_CONSTANT or t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ctx.error(f"a constant tensor argument of shape {tuple(t.shape)} is too large or not finite")
        constants.append(t)
        return ConstantArg(len(constants) - 1)
    if isinstance(value, list):
        return [_hoist(v, constants, ctx) for v in value]
    if isinstance(value, dict) and value.get("class_name") not in ("__slice__", "__ellipsis__"):
        return {k: _hoist(v, constants, ctx) for k, v in value.items()}
    return value


def _keywords(call, ctx) -> dict:
    """A call's keyword arguments: constants as recorded (checked as the positional ones are) and
    TensorArg for each tensor, numbered after the positional inputs in model.py's order."""
    tensors = call.tensor_kwargs()
    out, index = {}, len(call.inputs)
    for name in tensors:
        refs = call.kwargs[name]
        out[name] = TensorArg(index) if len(refs) == 1 else [TensorArg(index + i) for i in range(len(refs))]
        index += len(refs)
    for name, value in call.kwargs.items():
        if name in tensors or name == "mask" and value is None:
            continue
        if name in ("mask", "initial_state"):
            raise ctx.error(f"an operation called with {name}= is not supported")
        check_constants(value, ctx)
        out[name] = value
    return out


MAX_ARGUMENTS = 1 << 12  # a list argument's length (the config's JSON limits bound it anyway)


def check_constants(value, ctx, depth=0) -> None:
    """A recorded call's constant arguments: finite numbers (integers within 2^62), booleans,
    None, slices of integers, Ellipsis, and lists of these, nested a few deep (a hostile file's
    arguments go no further)."""
    if depth > 4:
        raise ctx.error("the operation's arguments nest too deeply")
    if isinstance(value, TensorArg) or value is None or isinstance(value, bool):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ctx.error(f"the constant operand {value!r} is not a finite number")
        return
    if isinstance(value, int):
        if abs(value) > 1 << 62:
            raise ctx.error(f"the constant operand {value!r} is out of range")
        return
    if isinstance(value, list):
        if len(value) > MAX_ARGUMENTS:
            raise ctx.error(f"the operation has more than {MAX_ARGUMENTS} arguments")
        for v in value:
            check_constants(v, ctx, depth + 1)
        return
    if isinstance(value, dict) and value.get("class_name") in ("__ellipsis__", "__tensor__", "__numpy__"):
        return  # (a constant tensor is checked as it is read: _hoist)
    if isinstance(value, dict) and value.get("class_name") == "__slice__" and isinstance(value.get("config"), dict):
        for k in ("start", "stop", "step"):
            e = value["config"].get(k)
            if e is not None and (isinstance(e, bool) or not isinstance(e, int) or abs(e) > 1 << 62):
                raise ctx.error(f"a slice bound {str(e)[:40]!r} is not an integer")
        return
    raise ctx.error(f"the operation argument {str(value)[:60]!r} is not supported")
