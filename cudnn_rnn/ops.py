"""The typed wrapper of the dispatcher ops and their fake kernels.

The ops themselves are defined in csrc/ops.cpp (schemas) and implemented per backend in C++;
their autograd (rnn_forward's backward is the rnn_backward op) is C++ too (csrc/autograd.cpp).
This module only gives the typed wrapper and teaches PyTorch how to trace the ops (register_fake).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _C  # noqa: F401  (loads the library that registers the ops)

# Gates per cell, in Keras column order (LSTM i, f, c, o; GRU z, r, h).
CELL_GATES = {"lstm": 4, "gru": 3, "simple_rnn": 1}

_forward_op = torch.ops.cudnn_rnn.rnn_forward.default


def rnn_forward(
    x: Tensor,
    weights: Sequence[Tensor],
    mask: Optional[Tensor],
    h0: Optional[Tensor],
    c0: Optional[Tensor],
    dropout_masks: Sequence[Tensor],
    recurrent_dropout_masks: Sequence[Tensor],
    *,
    cell: str,
    activation: str,
    recurrent_activation: str,
    use_bias: bool,
    reset_after: bool,
    num_layers: int,
    bidirectional: bool,
    go_backwards: bool,
    zero_output_for_mask: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Runs a stack of num_layers x (1 or 2) recurrent layers; see csrc/ops.cpp for shapes.

    Returns (y [B, T, D*u], h_n [L*D, B, u], c_n [L*D, B, u] or [0], reserve)."""
    need_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, h0, c0, *weights))
    return _forward_op(
        x, list(weights), mask, h0, c0, list(dropout_masks), list(recurrent_dropout_masks), cell, activation,
        recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards, zero_output_for_mask,
        need_grad,
    )


@torch.library.register_fake("cudnn_rnn::rnn_forward")
def _rnn_forward_fake(x, weights, mask, h0, c0, dropout_masks, recurrent_dropout_masks, cell, activation,
                      recurrent_activation, use_bias, reset_after, num_layers, bidirectional, go_backwards,
                      zero_output_for_mask, need_grad=True):
    torch._check(x.dim() == 3, lambda: f"x must have shape (batch, time, features); got {tuple(x.shape)}")
    torch._check(cell in CELL_GATES, lambda: f"cell must be 'lstm', 'gru' or 'simple_rnn'; got '{cell}'")
    per_dir = 3 if use_bias else 2
    directions = 2 if bidirectional else 1
    torch._check(
        len(weights) == num_layers * directions * per_dir,
        lambda: f"weights must hold {num_layers * directions * per_dir} tensors; got {len(weights)}",
    )
    batch, time, _ = x.shape
    units = weights[1].shape[0]
    y = x.new_empty((batch, time, directions * units))
    h_n = x.new_empty((num_layers * directions, batch, units))
    c_n = x.new_empty((num_layers * directions, batch, units)) if cell == "lstm" else x.new_empty((0,))
    # The reserve's size depends on the backend (CPU saved activations, cuDNN's reserve space).
    reserve = x.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.uint8)
    return y, h_n, c_n, reserve


@torch.library.register_fake("cudnn_rnn::rnn_backward")
def _rnn_backward_fake(grad_y, grad_h_n, grad_c_n, x, weights, mask, dropout_masks, recurrent_dropout_masks,
                       reserve, cell, activation, recurrent_activation, use_bias, reset_after, num_layers,
                       bidirectional, go_backwards, zero_output_for_mask):
    # The kernels return contiguous gradients whatever the inputs' strides: new_empty, not empty_like.
    grad_weights = [w.new_empty(w.shape) for w in weights]
    return x.new_empty(x.shape), grad_weights, grad_h_n.new_empty(grad_h_n.shape), grad_c_n.new_empty(grad_c_n.shape)
