"""The typed wrapper of the dispatcher ops and their fake kernels.

The ops themselves are defined in csrc/core/ops.cpp (schemas) and implemented per backend in
C++; their autograd (rnn_forward's backward is the rnn_backward op) is C++ too
(csrc/core/autograd.cpp). This module gives the one Python description of the op's options
(`RnnSpec`, fields in schema order), the typed wrapper, and teaches PyTorch how to trace the ops
(register_fake) through one parser of their argument lists.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from .cells import GATES  # (cells loads cudnn_rnn._C, the library that registers the ops)


@dataclass(frozen=True)
class RnnSpec:
    """The op's options (every argument after the tensors), in schema order (csrc/core/ops.cpp)."""

    cell: str
    activation: str = "tanh"
    recurrent_activation: str = "sigmoid"
    use_bias: bool = True
    reset_after: bool = True
    num_layers: int = 1
    bidirectional: bool = False
    go_backwards: bool = False
    zero_output_for_mask: bool = False

    def args(self) -> tuple:
        """The options as the op takes them, positionally."""
        cached = self.__dict__.get("_args")
        if cached is None:  # (frozen: written past __setattr__, once)
            cached = self.__dict__["_args"] = tuple(getattr(self, name) for name in _FIELD_NAMES)
        return cached

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(RnnSpec))
_N_OPTIONS = len(_FIELD_NAMES)
_forward_op = torch.ops.cudnn_rnn.rnn_forward.default


def rnn_forward(
    x: Tensor,
    weights: Sequence[Tensor],
    mask: Optional[Tensor],
    h0: Optional[Tensor],
    c0: Optional[Tensor],
    dropout_masks: Sequence[Tensor],
    recurrent_dropout_masks: Sequence[Tensor],
    spec: Optional[RnnSpec] = None,
    **options,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Runs a stack of num_layers x (1 or 2) recurrent layers; see csrc/core/ops.cpp for shapes.
    The options are `spec`, or RnnSpec's fields as keywords.

    Returns (y [B, T, D*u], h_n [L*D, B, u], c_n [L*D, B, u] or [0], reserve)."""
    if spec is None:
        spec = RnnSpec(**options)
    elif options:
        raise TypeError(f"rnn_forward takes spec or its fields as keywords, not both; got {sorted(options)}")
    need_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, h0, c0, *weights))
    return _forward_op(x, list(weights), mask, h0, c0, list(dropout_masks), list(recurrent_dropout_masks),
                       *spec.args(), need_grad)


def _spec(options: tuple) -> RnnSpec:
    """The RnnSpec of an op call's trailing arguments (rnn_forward's need_grad, when present, follows)."""
    return RnnSpec(*options[:_N_OPTIONS])


def _outputs_fake(x, weights, options):
    """y, h_n, c_n of a forward call (rnn_forward, rnn_forward_int8) without data."""
    spec = _spec(options)
    torch._check(x.dim() == 3, lambda: f"x must have shape (batch, time, features); got {tuple(x.shape)}")
    torch._check(spec.cell in GATES, lambda: f"cell must be one of {sorted(GATES)}; got '{spec.cell}'")
    per_dir = 3 if spec.use_bias else 2
    torch._check(
        len(weights) == spec.num_layers * spec.directions * per_dir,
        lambda: f"weights must hold {spec.num_layers * spec.directions * per_dir} tensors; got {len(weights)}",
    )
    batch, time, _ = x.shape
    units = weights[1].shape[0]
    stacks = spec.num_layers * spec.directions
    y = x.new_empty((batch, time, spec.directions * units))
    h_n = x.new_empty((stacks, batch, units))
    c_n = x.new_empty((stacks, batch, units)) if spec.cell == "lstm" else x.new_empty((0,))
    return y, h_n, c_n


@torch.library.register_fake("cudnn_rnn::rnn_forward")
def _rnn_forward_fake(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, *options):
    y, h_n, c_n = _outputs_fake(x, weights, options)
    # The reserve's size depends on the backend (CPU saved activations, cuDNN's reserve space): an
    # unbacked size where a shape environment can make one (torch.compile); the Meta kernel and a
    # plain FakeTensorMode (shape propagation, load_keras's check of huge declared shapes) get an
    # empty placeholder, as nothing but the backward reads the reserve.
    ctx, mode = torch.library.get_ctx(), torch._guards.detect_fake_mode()
    dynamic = ctx is not None and (mode is None or mode.shape_env is not None)
    reserve = x.new_empty((ctx.new_dynamic_size() if dynamic else 0,), dtype=torch.uint8)
    return y, h_n, c_n, reserve


def register_meta(qualname: str, fake) -> None:
    """Meta kernels (shapes without data or a fake mode; load_keras's trial-run size check) are the
    fake impls. Some torch releases (2.11) already register the fake impl as the Meta kernel of an op
    that has none, and refuse a second one."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(qualname, "Meta"):
        torch.library.register_kernel(qualname, "Meta", fake)


register_meta("cudnn_rnn::rnn_forward", _rnn_forward_fake)


@torch.library.register_fake("cudnn_rnn::rnn_forward_int8")
def _rnn_forward_int8_fake(x, weights, mask, h0, c0, *options):
    return _outputs_fake(x, weights, options)


@torch.library.register_fake("cudnn_rnn::linear_int8")
def _linear_int8_fake(x, kernel, bias):
    torch._check(x.shape[-1] == kernel.shape[0], lambda: f"x [..., {kernel.shape[0]}]; got {tuple(x.shape)}")
    return x.new_empty((*x.shape[:-1], kernel.shape[1]))


@torch.library.register_fake("cudnn_rnn::rnn_backward")
def _rnn_backward_fake(grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks, recurrent_dropout_masks,
                       reserve, *options):
    # The kernels return contiguous gradients whatever the inputs' strides: new_empty, not empty_like.
    grad_weights = [w.new_empty(w.shape) for w in weights]
    return x.new_empty(x.shape), grad_weights, grad_h_n.new_empty(grad_h_n.shape), grad_c_n.new_empty(grad_c_n.shape)
