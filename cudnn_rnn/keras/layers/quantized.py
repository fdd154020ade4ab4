"""Layers that Keras 3's model.quantize() rewrote: int8 and int4 Dense, EinsumDense, Embedding and
ReversibleEmbedding, computed as Keras computes them from their integer weights (int4: two to a
byte), their scales and, for int4 in groups, their zero points and group indices; where the
layer's quantization config has an inputs quantizer (int8's default), each input row quantized by
its absolute maximum before an integer product. float8 Dense and EinsumDense: inputs and kernel rounded through float8_e4m3fn by
their scales."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from .base import Reversible, _Single, lookup

# The classes whose quantized form converts, and the modes (Keras 3's QUANTIZATION_MODES are
# int8, int4, float8, gptq and awq).
QUANTIZED_CLASSES = ("Dense", "EinsumDense", "Embedding", "ReversibleEmbedding")
QUANTIZED_MODES = ("int8", "int4")
_MODES = ("int8", "int4", "float8", "gptq", "awq")


def policy_mode(dtype) -> Optional[str]:
    """The quantization mode a layer's dtype policy names ("int8", "int4/128", "float8", ...), None
    for a float policy. Keras 3.4+ writes {"class_name": "QuantizedDTypePolicy" / "Int4DTypePolicy"
    / ..., "config": {"mode", "source_name"}}; earlier Keras 3 a name such as "int8_from_float32"."""
    if isinstance(dtype, dict):
        inner = dtype.get("config") if isinstance(dtype.get("config"), dict) else {}
        if isinstance(inner.get("mode"), str):
            return inner["mode"]
        dtype = inner.get("name")
    if isinstance(dtype, str) and dtype.startswith(_MODES) and "_from_" in dtype:
        return dtype.split("_from_")[0]
    return None


def unsupported(mode: str, class_name: str) -> Optional[str]:
    """Why a layer of this class quantized in this mode does not convert; None where it does."""
    base = mode.partition("/")[0]
    if class_name in QUANTIZED_CLASSES and (base in QUANTIZED_MODES or
                                            base == "float8" and "Embedding" not in class_name):
        return None
    return (f"the layer is quantized by Keras ({mode[:20]}), which is not supported: int8 and int4 "
            f"{', '.join(QUANTIZED_CLASSES)} and float8 Dense and EinsumDense convert; convert the float model "
            "(before model.quantize()), and cudnn_rnn.quantize_dynamic quantizes the converted one")


@dataclass(frozen=True)
class Quantization:
    mode: str                                  # "int8", "int4" or "float8"
    block_size: Optional[int]                  # int4 in groups of this many inputs; None: a scale per output
    inputs: Optional[Tuple[int, int, float]]   # the inputs quantizer's (low, high, epsilon); None: weights only
    # int4 as Keras 3.11-3.13 packed Dense and EinsumDense kernels: along the (first) summed axis,
    # computed as int8 (their policies say "int4"; Keras 3.14 and later's "int4/<block size>")
    row_packed: bool = False


def keras_quantization(cfg: dict, ctx) -> Optional[Quantization]:
    """How Keras quantized the layer (None: it did not), from its dtype policy and its
    quantization_config; anything else than int8 / int4 Dense, EinsumDense and Embedding (with
    Keras's AbsMaxQuantizer) and float8 Dense and EinsumDense refused by name."""
    mode = policy_mode(cfg.get("dtype"))
    if mode is None:
        return None
    refused = unsupported(mode, ctx.spec.class_name)
    if refused:
        raise ctx.error(refused)
    base, _, block = mode.partition("/")
    if base == "float8":
        return Quantization("float8", None, None)
    qc = cfg.get("quantization_config")
    inner = qc.get("config") if isinstance(qc, dict) and isinstance(qc.get("config"), dict) else {}
    size = inner.get("block_size") if "block_size" in inner else (int(block) if re.fullmatch(r"-?\d+", block) else None)
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size == 0 or size < -1):
        raise ctx.error(f"quantization block_size {str(size)[:20]} is not a positive count or -1")
    row_packed = base == "int4" and not block and "Embedding" not in ctx.spec.class_name
    if row_packed and size is not None and size > 0:
        raise ctx.error(f"int4 in groups of {size} with Keras 3.11-3.13's policy \"int4\" (which has no groups)")
    if not isinstance(qc, dict):  # no config: Keras's defaults (int8 and 3.11-3.13's int4 quantize the inputs)
        inputs = (-127, 127, 1e-7) if base == "int8" or row_packed else None
    else:
        inputs = _inputs_quantizer(inner.get("activation_quantizer"), ctx)
    if base == "int4" and size is not None and size > 0 and inputs is not None:
        raise ctx.error("int4 in groups with an inputs quantizer (Keras's Int4QuantizationConfig refuses the pair)")
    return Quantization(base, size if size is not None and size > 0 else None, inputs, row_packed)


def _inputs_quantizer(entry, ctx) -> Optional[Tuple[int, int, float]]:
    if entry is None:
        return None
    cfg = entry.get("config") if isinstance(entry, dict) else None
    if not isinstance(cfg, dict) or entry.get("class_name") != "AbsMaxQuantizer":
        name = entry.get("class_name") if isinstance(entry, dict) else entry
        raise ctx.error(f"the inputs quantizer {str(name)[:40]!r} is not Keras's AbsMaxQuantizer")
    low, high = cfg.get("value_range", (-127, 127))
    eps = cfg.get("epsilon", 1e-7)
    if cfg.get("output_dtype", "int8") != "int8" or not all(isinstance(v, int) and not isinstance(v, bool) and
                                                              -128 <= v <= 127 for v in (low, high)) or low >= high:
        raise ctx.error(f"the inputs quantizer's range {str(cfg.get('value_range'))[:30]} / output_dtype "
                        f"{str(cfg.get('output_dtype'))[:10]} is not an int8 range")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ctx.error(f"the inputs quantizer's epsilon {str(eps)[:20]} is not a number >= 0")
    return (low, high, float(eps))


def unpack_int4(packed: np.ndarray, size: int, axis: int = -1) -> np.ndarray:
    """Keras's int4 packing undone along `axis`: each byte holds two signed 4-bit values, the
    first in its low nibble; `size` values are kept (an odd count was padded)."""
    b = np.moveaxis(np.asarray(packed).astype(np.int8), axis, -1)
    low = ((b.astype(np.int16) & 0xF) ^ 8) - 8
    high = b.astype(np.int16) >> 4
    out = np.stack([low, high], axis=-1).reshape(*b.shape[:-1], -1)[..., :size].astype(np.int8)
    return np.moveaxis(out, -1, axis)


def pack_int4(values: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """unpack_int4's inverse (the layout Keras stores)."""
    v = values.to(torch.int16).movedim(axis, -1)
    if v.shape[-1] % 2:
        v = torch.cat([v, v.new_zeros(*v.shape[:-1], 1)], dim=-1)
    pairs = v.reshape(*v.shape[:-1], -1, 2)
    return ((pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)).to(torch.uint8).view(torch.int8).movedim(-1, axis)


def _abs_max(x: torch.Tensor, dims: Sequence[int], q: Tuple[int, int, float]):
    """Keras's abs_max_quantize: (round(x * s) clipped to the range, s = high / (max |x| + eps))."""
    low, high, eps = q
    scale = high / (x.abs().amax(dim=tuple(dims), keepdim=True) + eps)
    return torch.clamp(torch.round(x * scale), low, high), scale


def _exact_product(x_q: torch.Tensor, kernel: torch.Tensor, bound: float, product) -> torch.Tensor:
    """An integer product, as Keras's int32 one, in floating point: float32 where no sum can
    reach 2^24 (then every partial sum is exact), else float64; returned in x_q's dtype."""
    dtype = torch.float32 if bound < 2 ** 24 else torch.float64
    return product(x_q.to(dtype), kernel.to(dtype)).to(x_q.dtype)


# Keras's TimeDistributed runs the wrapped layer's float `call`, not its quantized one: the layer's
# `kernel` (`embeddings`) there is the integer one (int4 unpacked), multiplied as numbers without
# the scales (float8: the float kernel, inputs not rounded, the bias as it is). The modules below
# compute that where `float_call` is set (TimeDistributed's builder sets it).


def _integer_buffers(module: nn.Module, name: str, values, scale, zero, groups, dtype) -> None:
    """A quantized layer's buffers: its integer values (`name`), scales in the model's dtype, and
    int4 groups' zero points and indices. The integer ones stay out of the state_dict (a converted
    file rebuilds them from the Keras arrays it keeps; its state_dict holds float tensors only);
    the group indices are integers (a float buffer would follow the model to bfloat16, exact only
    up to 256; Keras stores them as float32)."""
    module.register_buffer(name, torch.as_tensor(np.asarray(values, dtype=np.int8)), persistent=False)
    module.register_buffer("scale", torch.as_tensor(np.asarray(scale), dtype=dtype))
    module.register_buffer("zero", None if zero is None else torch.as_tensor(np.asarray(zero, dtype=np.int8)),
                           persistent=False)
    module.register_buffer("groups", None if groups is None else torch.as_tensor(np.asarray(groups, dtype=np.int64)),
                           persistent=False)


class QuantizedDense(_Single):
    """Dense or EinsumDense from Keras's int8 / int4 weights. int8 and per-output int4 take the
    integer product and divide it by the scales (and the inputs' scales); int4 in groups (and
    EinsumDense's int4) takes the product with the kernel dequantized, as Keras does."""

    def __init__(self, q: Quantization, kernel: np.ndarray, scale: np.ndarray, bias, activation,
                 equation: Optional[str] = None, kernel_shape=None, zero=None, groups=None, pack_axis=None,
                 dtype=torch.float32):
        super().__init__()
        self.q, self.equation, self.activation = q, equation, activation
        # the kernel's axis labels (Dense's: inputs k, outputs n)
        self.kernel_labels = "kn" if equation is None else equation.split(",")[1].split("->")[0]
        # Keras 3.11-3.13's int4: the kernel axis packed, unpacked to an even length here and cut
        # to the input's at the call (the stored rows do not say whether one was padding)
        self.pack_axis = pack_axis
        self.keeps_mask = equation is None
        self.kernel_shape = tuple(kernel_shape) if kernel_shape is not None else None  # int4 EinsumDense's own
        _integer_buffers(self, "kernel", kernel, scale, zero, groups, dtype)
        # how many products each output sums (the kernel's axes the output lacks): the exact
        # integer product's bound
        out_labels = "n" if equation is None else equation.split("->")[1]
        self.summed = math.prod(n for n, c in zip(self.kernel.shape, self.kernel_labels) if c not in out_labels)
        self.bias = bias
        # int8, per-output int4 Dense and Keras 3.11-3.13's int4: the integer product, then the
        # scales; int4 in groups and EinsumDense's int4: the kernel dequantized first (Keras's
        # order for each)
        self.float_call = False
        self.dequantize_first = q.mode == "int4" and not q.row_packed and (q.block_size is not None or
                                                                            equation is not None)

    def keras_groups(self):
        kernel = self.kernel if self.q.mode != "int4" else \
            pack_int4(self.kernel, self.pack_axis if self.pack_axis is not None else -1)
        extra = [self.zero, self.groups.float()] if self.zero is not None else []
        return [("", [kernel] + ([self.bias] if self.bias is not None else []) + [self.scale] + extra)]

    def _float_kernel(self, x) -> torch.Tensor:
        dtype = x.dtype
        k = self.kernel.to(dtype)
        if self.zero is not None:  # Keras's dequantize_with_sz_map along the input axis
            g = self.groups
            k = (k - self.zero[g].to(dtype)) * self.scale.to(dtype)[g]
        else:
            k = k / self.scale.to(dtype)
        return k.reshape(self._shape_at(x)) if self.kernel_shape is not None else k

    def _shape_at(self, x) -> list:
        """int4 EinsumDense's kernel shape, its summed axes' sizes that the config leaves open
        (several of them) read from the input."""
        if None not in self.kernel_shape:
            return list(self.kernel_shape)
        ins, _ = self._specs(x.dim())
        shape = [n if n is not None else x.shape[ins.index(c)] for n, c in zip(self.kernel_shape, self.kernel_labels)]
        if int(np.prod(shape)) != self.kernel.numel():
            raise ValueError(f"EinsumDense: an input of shape {tuple(x.shape)} does not fit the int4 kernel of "
                             f"{self.kernel.shape[0]} rows ({self.equation})")
        return shape

    def _product(self, x, w):
        return torch.matmul(x, w) if self.equation is None else torch.einsum(_explicit(self.equation, x.dim()), x, w)

    def _specs(self, ndim: int) -> Tuple[str, str]:
        """(input labels, output labels); Dense's are "...k" and "...n"."""
        if self.equation is None:
            return "k", "n"
        eq = _explicit(self.equation, ndim)
        return eq.split(",")[0], eq.split("->")[1]

    def _reduced(self, x) -> Tuple[int, ...]:
        """The input axes the product sums over (those the inputs quantizer reduces)."""
        ins, out = self._specs(x.dim())
        return (x.dim() - 1,) if self.equation is None else tuple(i for i, c in enumerate(ins) if c not in out)

    def _to_output(self, s: torch.Tensor) -> torch.Tensor:
        """The inputs' scales (1 on the reduced axes) laid out as the output: EinsumDense's kept
        input axes in the output's order, 1 where the output has an axis the input lacks."""
        if self.equation is None:
            return s
        ins, out = self._specs(s.dim())
        kept = [c for c in ins if c in out]
        s = s.reshape([n for n, c in zip(s.shape, ins) if c in out])
        s = s.permute(sorted(range(len(kept)), key=lambda i: out.index(kept[i])))
        sizes = dict(zip(sorted(kept, key=out.index), s.shape))
        return s.reshape([sizes.get(c, 1) for c in out])

    def _integer_kernel(self, x) -> torch.Tensor:
        if self.pack_axis is None:
            return self.kernel
        ins, _ = self._specs(x.dim())
        size = x.shape[ins.index(self.kernel_labels[self.pack_axis])] if self.equation is not None else x.shape[-1]
        if not self.kernel.shape[self.pack_axis] - 1 <= size <= self.kernel.shape[self.pack_axis]:
            raise ValueError(f"{'EinsumDense' if self.equation else 'Dense'}: an input of shape {tuple(x.shape)} does "
                             f"not fit the int4 kernel of {self.kernel.shape[self.pack_axis] // 2} packed rows")
        return self.kernel.narrow(self.pack_axis, 0, size)

    def _kernel_scale(self, ndim: int, dtype) -> torch.Tensor:
        """The kernel's scales laid out as the output: Dense's as they are; EinsumDense's (one per
        kept kernel position, stored in the output's axis order) reshaped to the output's axes."""
        scale = self.scale.to(dtype)
        if self.equation is None:
            return scale
        _, out = self._specs(ndim)
        sizes = {c: n for c, n in zip(self.kernel_labels, self.kernel.shape) if c in out}
        return scale.reshape([sizes.get(c, 1) for c in out])

    def apply(self, x):
        if self.float_call:  # (see above)
            kernel = self._integer_kernel(x).to(x.dtype)
            y = self._product(x, kernel.reshape(self._shape_at(x)) if self.kernel_shape is not None else kernel)
            return self.activation(y + self.bias if self.bias is not None else y)
        x_s = None
        if self.q.inputs is not None:
            x, x_s = _abs_max(x, self._reduced(x), self.q.inputs)
            x_s = self._to_output(x_s)
        if self.dequantize_first:
            y = self._product(x, self._float_kernel(x))
            if x_s is not None:
                y = y / x_s
        else:
            if x_s is not None:
                bound = max(abs(v) for v in self.q.inputs[:2]) * (128 if self.q.mode == "int8" else 8) * self.summed
                y = _exact_product(x, self._integer_kernel(x), bound, self._product)
                y = y / (self._kernel_scale(x.dim(), y.dtype) * x_s)
            else:
                y = self._product(x, self._integer_kernel(x).to(x.dtype)) / self._kernel_scale(x.dim(), x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return self.activation(y)


def _explicit(equation: str, ndim: int) -> str:
    """An EinsumDense equation with its ellipsis replaced by letters it does not use, as Keras
    spells it out for the quantized product ("...b,bc->...c" on a rank-3 input: "Ab,bc->Ac")."""
    if "..." not in equation:
        return equation
    ins, rest = equation.split(",")
    kernel, out = rest.split("->")
    free = sorted(set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") - set(ins + kernel + out) - {"."})
    fill = "".join(free[: ndim - len(ins.replace("...", ""))])
    return f"{ins.replace('...', fill)},{kernel}->{out.replace('...', fill)}"


class Float8Dense(_Single):
    """Dense or EinsumDense that Keras quantized to float8: inputs and kernel each divided by its
    scale, clipped to float8_e4m3fn's range, rounded to it and multiplied back, then the product;
    a float32 layer's bias rounded to bfloat16 (as Keras adds it). The amax histories (the scales'
    training state) are kept for writing back."""

    def __init__(self, equation: Optional[str], kernel, bias, state: Sequence[np.ndarray], activation):
        super().__init__()
        self.equation, self.kernel, self.bias, self.activation = equation, kernel, bias, activation
        self.keeps_mask = equation is None
        self.float_call = False
        for name, value in zip(_FLOAT8_STATE, state):
            self.register_buffer(name, torch.as_tensor(np.asarray(value, dtype=np.float32)))

    def keras_groups(self):
        return [("", [self.kernel] + ([self.bias] if self.bias is not None else [])
                 + [getattr(self, name) for name in _FLOAT8_STATE])]

    @staticmethod
    def _qdq(x, scale):
        scale = scale.to(x.dtype)
        top = torch.finfo(torch.float8_e4m3fn).max
        return torch.clamp(x / scale, -top, top).to(torch.float8_e4m3fn).to(x.dtype) * scale

    def apply(self, x):
        if self.float_call:  # (see above QuantizedDense)
            y = torch.matmul(x, self.kernel) if self.equation is None else torch.einsum(self.equation, x, self.kernel)
            return self.activation(y + self.bias if self.bias is not None else y)
        x, kernel = self._qdq(x, self.inputs_scale), self._qdq(self.kernel.to(x.dtype), self.kernel_scale)
        y = torch.matmul(x, kernel) if self.equation is None else torch.einsum(self.equation, x, kernel)
        if self.bias is not None:
            y = y + (_to_bfloat16(self.bias) if self.bias.dtype == torch.float32 else self.bias)
        return self.activation(y)


def _to_bfloat16(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to bfloat16 (to nearest, ties to even), kept float32: on the bits, so
    that a compiled graph keeps the rounding (Inductor drops a float32 -> bfloat16 -> float32
    round trip; an ONNX graph keeps its Cast nodes, and has no bit view)."""
    if torch.onnx.is_in_onnx_export():
        return t.to(torch.bfloat16).to(t.dtype)
    bits = t.view(torch.int32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).view(torch.float32)
    return torch.where(torch.isfinite(t), rounded, t)


_FLOAT8_STATE = ("inputs_scale", "inputs_amax_history", "kernel_scale", "kernel_amax_history", "outputs_grad_scale",
                 "outputs_grad_amax_history")


def build_float8_dense(ctx, equation: Optional[str], use_bias: bool, activation, check) -> Float8Dense:
    """Dense / EinsumDense that Keras quantized to float8: its float weights (checked by `check`,
    the float layer's checks, which gives the bias as a tensor), then the scales and histories."""
    (w,) = ctx.weights.take([("", 1 + int(use_bias) + len(_FLOAT8_STATE))], order=["kernel", "bias", *_FLOAT8_STATE])
    n = 1 + int(use_bias)
    state = w[n:]
    for name, value in zip(_FLOAT8_STATE, state):
        if np.ndim(value) != (0 if name.endswith("scale") else 1) or not np.all(np.isfinite(value)):
            raise ctx.error(f"the float8 {name} has shape {tuple(np.shape(value))} or values that are not finite")
    bias = check(w[:n])
    return Float8Dense(equation, ctx.tensor(w[0]), bias, state, activation)


class QuantizedEmbedding(nn.Module):
    """Embedding from Keras's int8 / int4 table: the rows looked up, then dequantized by their
    scales (int4 in groups: by the group's scale and zero point), as Keras computes them."""

    def __init__(self, q: Quantization, table: np.ndarray, scale: np.ndarray, mask_zero: bool, zero=None,
                 groups=None, dtype=torch.float32):
        super().__init__()
        self.q, self.mask_zero = q, mask_zero
        self.float_call = False
        _integer_buffers(self, "embeddings", table, scale, zero, groups, dtype)

    def keras_groups(self):
        table = pack_int4(self.embeddings) if self.q.mode == "int4" else self.embeddings
        return [("", [table, self.scale] + ([self.zero, self.groups.float()] if self.zero is not None else []))]

    def forward(self, inputs, masks):
        ids = inputs[0].long()
        rows = lookup(ids, self.embeddings)
        dtype = self.scale.dtype
        if self.float_call:  # (see above QuantizedDense)
            out = rows.to(dtype)
        elif self.zero is not None:
            g = self.groups
            out = (rows.to(dtype) - self.zero[ids][..., g].to(dtype)) * self.scale[ids][..., g]
        else:
            out = rows.to(dtype) / self.scale[ids].unsqueeze(-1)
        return [out], [inputs[0] != 0 if self.mask_zero else None]


def _integers(ctx, what: str, a: np.ndarray, low: int, high: int) -> np.ndarray:
    a = np.asarray(a)
    if a.size and (not np.all(np.isfinite(a)) or np.any(a != np.round(a)) or a.min() < low or a.max() > high):
        raise ctx.error(f"{what} holds values that are not integers in [{low}, {high}]")
    return a


def _groups(ctx, g: np.ndarray, size: int, count: int) -> np.ndarray:
    """int4 group indices (Keras stores them as floats): each an integer below the group count."""
    g = _integers(ctx, "the int4 group index (g_idx)", g, 0, count - 1)
    if g.shape != (size,):
        raise ctx.error(f"the int4 group index (g_idx) has shape {g.shape}; expected ({size},)")
    return g


# Keras's saving order of each quantized class's variables (a legacy .h5 lists the trainable ones
# first: the bias)
_ORDER = {"Dense": ["kernel", "bias", "kernel_scale", "kernel_zero", "g_idx"],
          "Embedding": ["embeddings", "embeddings_scale", "embeddings_zero", "g_idx"]}
_ORDER["EinsumDense"] = _ORDER["Dense"]
_ORDER["ReversibleEmbedding"] = _ORDER["Embedding"] + ["reverse_embeddings", "reverse_embeddings_scale",
                                                       "reverse_embeddings_zero"]


def _take(ctx, q: Quantization, n: int, more: int = 0) -> list:
    """The layer's weights: n of the float layer's plus the scale (and int4 groups' zero points and
    indices), and `more` after them."""
    count = n + 1 + (2 if q.mode == "int4" and q.block_size is not None else 0) + more
    (w,) = ctx.weights.take([("", count)], order=_ORDER[ctx.spec.class_name])
    return w


def build_quantized_dense(ctx, q: Quantization, equation: Optional[str], out_shape, use_bias: bool, activation,
                          check) -> QuantizedDense:
    """Dense (equation None, out_shape [units]) or EinsumDense as Keras stored it quantized:
    kernel, bias, scale (int4 in groups: then zero points and group indices). `check`: the float
    layer's checks of [kernel, bias] (given a kernel of the float shape), which give the bias."""
    w = _take(ctx, q, 1 + int(use_bias))
    kernel, bias, scale, rest = w[0], (w[1] if use_bias else None), w[1 + int(use_bias)], w[2 + int(use_bias):]
    kernel = _integers(ctx, f"the {q.mode} kernel", kernel, -128, 127)
    pack_axis = None
    if equation is None:
        (units,) = out_shape
        rows, columns, kernel_shape = (kernel.shape[0] if kernel.ndim == 2 else -1), units, None
        want = (rows, units if q.mode == "int8" or q.row_packed else (units + 1) // 2)
        pack_axis = 0 if q.row_packed else None
    else:
        ins, kspec, out = equation.split(",")[0], equation.split(",")[1].split("->")[0], equation.split("->")[1]
        if q.row_packed:
            summed = [i for i, c in enumerate(kspec) if c not in out]
            pack_axis = summed[0] if summed else 0
        if q.mode == "int8" or q.row_packed:
            kernel_shape, want = None, None
            if kernel.ndim != len(kspec):
                raise ctx.error(f"EinsumDense kernel has shape {tuple(kernel.shape)}; the equation names {len(kspec)} axes")
            sizes = dict(zip(kspec, kernel.shape))
        else:
            sizes = _einsum_sizes(ctx, kspec, out, out_shape, kernel)
            kernel_shape = [sizes[c] for c in kspec]
        summed = [sizes[c] for c in kspec if c not in out]
        rows = int(np.prod(summed)) if None not in summed else kernel.shape[0]
        columns = int(np.prod([sizes[c] for c in kspec if c in out]))
        if q.mode == "int4" and not q.row_packed:
            want = (rows, (columns + 1) // 2)
    if want is not None and tuple(kernel.shape) != want:
        raise ctx.error(f"the {q.mode} kernel has shape {tuple(kernel.shape)}; expected {want}")
    zero = groups = None
    if q.mode == "int4" and q.block_size is not None:
        count = -(-rows // q.block_size)
        if tuple(np.shape(scale)) != (count, columns):
            raise ctx.error(f"the int4 kernel scale has shape {tuple(np.shape(scale))}; groups of {q.block_size} "
                            f"imply {(count, columns)}")
        zero = _integers(ctx, "the int4 zero point", rest[0], -128, 127)
        if zero.shape != (count, columns):
            raise ctx.error(f"the int4 zero point has shape {zero.shape}; expected {(count, columns)}")
        groups = _groups(ctx, rest[1], rows, count)
    elif int(np.prod(np.shape(scale))) != columns or (equation is None and np.ndim(scale) != 1):
        raise ctx.error(f"the {q.mode} kernel scale has shape {tuple(np.shape(scale))}; expected {columns} values, "
                        "one per output")
    if pack_axis is not None:
        kernel = unpack_int4(kernel, 2 * kernel.shape[pack_axis], pack_axis)
    elif q.mode == "int4":
        kernel = unpack_int4(kernel, columns)
    shape = [n or 1 for n in (kernel_shape or kernel.shape)]  # (the float layer's checks see its kernel's shape)
    bias = check([np.broadcast_to(np.int8(0), shape)] + ([bias] if use_bias else []))
    return QuantizedDense(q, kernel, scale, bias, activation, equation, kernel_shape, zero, groups, pack_axis,
                          ctx.dtype)


def _einsum_sizes(ctx, kspec: str, out: str, out_shape, kernel: np.ndarray) -> dict:
    """The sizes of an int4 EinsumDense kernel's axes (Keras stores it flattened to [summed axes,
    kept axes], two to a byte): the kept ones from the config's output_shape (the output's last
    axes), one summed axis from the rows; several summed axes are None here, read from the input
    at the call."""
    labels = out.replace("...", "")
    shape = [out_shape] if isinstance(out_shape, int) else list(out_shape or [])
    known = dict(zip(labels[len(labels) - len(shape):], shape)) if len(shape) <= len(labels) else {}
    reduced = [c for c in kspec if c not in out]
    sizes = {c: (known.get(c) if c in out else kernel.shape[0] if len(reduced) == 1 else None) for c in kspec}
    if kernel.ndim != 2 or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                   for c, n in sizes.items() if c in out):
        raise ctx.error(f"an int4 EinsumDense kernel of shape {tuple(kernel.shape)} for {kspec!r}: the sizes of its "
                        "axes in the output are not all in the config's output_shape")
    return sizes


def build_quantized_embedding(ctx, q: Quantization, shape: Tuple[int, int], mask_zero: bool,
                              weights: Optional[list] = None, cls=QuantizedEmbedding) -> QuantizedEmbedding:
    """Embedding as Keras stored it quantized: table, scale (int4 in groups: zero points, group
    indices); `weights`: those arrays where the caller took them."""
    rows, columns = shape
    table, scale, *rest = _take(ctx, q, 1) if weights is None else weights
    table = _integers(ctx, f"the {q.mode} embeddings", table, -128, 127)
    want = (rows, columns if q.mode == "int8" else (columns + 1) // 2)
    if tuple(table.shape) != want:
        raise ctx.error(f"the {q.mode} embeddings have shape {tuple(table.shape)}; expected {want}")
    zero = groups = None
    if q.mode == "int4" and q.block_size is not None:
        count = -(-columns // q.block_size)
        zero = _integers(ctx, "the int4 zero point", rest[0], -128, 127)
        if tuple(np.shape(scale)) != (rows, count) or zero.shape != (rows, count):
            raise ctx.error(f"the int4 embeddings scale / zero point have shapes {tuple(np.shape(scale))} / "
                            f"{zero.shape}; groups of {q.block_size} imply {(rows, count)}")
        groups = _groups(ctx, rest[1], columns, count)
    elif tuple(np.shape(scale)) != (rows,):
        raise ctx.error(f"the {q.mode} embeddings scale has shape {tuple(np.shape(scale))}; expected ({rows},)")
    if q.mode == "int4":
        table = unpack_int4(table, columns)
    return cls(q, table, scale, mask_zero, zero, groups, ctx.dtype)


class QuantizedReversibleEmbedding(Reversible, QuantizedEmbedding):
    """ReversibleEmbedding from Keras's int8 / int4 weights: the lookup as QuantizedEmbedding's,
    the reverse call as Keras's (`head`: a QuantizedDense over output_dim, its kernel the table's
    transpose where the weights are tied, else the layer's own reverse kernel)."""

    def keras_groups(self):
        (_, own), = super().keras_groups()
        if not self.tied:  # the reverse kernel packed along output_dim, its scales, its zero points (floats)
            head = self.head
            kernel = pack_int4(head.kernel, 0) if self.q.mode == "int4" else head.kernel
            own = own + [kernel, head.scale] + ([head.zero.float()] if head.zero is not None else [])
        return [("", own)]

    def logits(self, x):
        return self.head.apply(x)


def build_quantized_reversible(ctx, q: Quantization, shape: Tuple[int, int], tie: bool, config, directions,
                               soft_cap) -> QuantizedReversibleEmbedding:
    """ReversibleEmbedding as Keras stored it quantized: the embedding's arrays
    (build_quantized_embedding), then where the weights are not tied the reverse kernel
    [output_dim, input_dim] (int4: two to a byte along output_dim), its scales (one per input_dim;
    in groups of output_dim: [groups, input_dim]) and zero points, grouped by the table's group
    indices. Keras's reverse call quantizes its inputs per row unless the quantization config
    names no activation quantizer (the default quantizer for int4 too). Its lookups carry no mask:
    Keras's quantized call skips the float call, which alone sets the mask_zero mask (the layer's
    compute_mask gives none), so the layers after it run unmasked."""
    grouped = q.mode == "int4" and q.block_size is not None
    rows, columns = shape
    w = _take(ctx, q, 1, 0 if tie else 2 + int(grouped))
    n = 4 if grouped else 2
    layer = build_quantized_embedding(ctx, q, shape, False, w[:n], QuantizedReversibleEmbedding)
    inner = config.get("config") if isinstance(config, dict) and isinstance(config.get("config"), dict) else None
    inputs = (-127, 127, 1e-7) if inner is None else _inputs_quantizer(inner.get("activation_quantizer"), ctx)
    if tie:
        kernel, scale = layer.embeddings.numpy().T, layer.scale.numpy().T
        zero = layer.zero.numpy().T if grouped else None
    else:
        kernel, scale, *rest = w[n:]
        kernel = _integers(ctx, f"the {q.mode} reverse embeddings", kernel, -128, 127)
        want = (columns if q.mode == "int8" else (columns + 1) // 2, rows)
        if tuple(kernel.shape) != want:
            raise ctx.error(f"the {q.mode} reverse embeddings have shape {tuple(kernel.shape)}; expected {want}")
        groups_of = (-(-columns // q.block_size), rows) if grouped else (rows,)
        zero = _integers(ctx, "the int4 reverse zero point", rest[0], -128, 127) if grouped else None
        if tuple(np.shape(scale)) != groups_of or (zero is not None and zero.shape != groups_of):
            raise ctx.error(f"the {q.mode} reverse embeddings scale / zero point have shapes "
                            f"{tuple(np.shape(scale))} / {None if zero is None else zero.shape}; expected {groups_of}")
        if q.mode == "int4":
            kernel = unpack_int4(kernel, columns, 0)
    groups = layer.groups.numpy() if grouped else None
    layer.head = QuantizedDense(Quantization(q.mode, q.block_size, inputs), kernel, scale, None, nn.Identity(),
                                zero=zero, groups=groups, dtype=ctx.dtype)
    layer.tied = tie
    layer.directions_and_cap(directions, soft_cap)
    return layer
