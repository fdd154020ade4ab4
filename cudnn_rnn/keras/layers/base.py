"""What the layer families share: the one-input module base (_Single), the identity, the
embedding lookup, a ReversibleEmbedding's choice of direction per call (Reversible), and the
data-format helpers (Keras's channels_last / channels_first against the channels-first layout
torch.nn.functional computes in)."""
from __future__ import annotations

import re
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .values import Values


class _Single(nn.Module):
    """One input, one output; the mask passes through (Keras supports_masking) or is dropped."""

    keeps_mask = True

    def forward(self, inputs: List[Tensor], masks: List[Optional[Tensor]]):
        return [self.apply(inputs[0])], [masks[0] if self.keeps_mask else None]


class Identity(_Single):
    def apply(self, x):
        return x


def lookup(ids, table):
    """The rows of `table` at `ids`; an id outside the table named (checked only when the lookup
    fails, so a traced or exported call holds no check)."""
    try:
        return F.embedding(ids, table)
    except (IndexError, RuntimeError) as e:
        bad = ids[(ids < 0) | (ids >= table.shape[0])] if ids.numel() else ids
        if bad.numel() == 0:
            raise
        raise IndexError(f"Embedding: ids must be in [0, {table.shape[0]}) (input_dim); got "
                         f"{int(bad.reshape(-1)[0])}") from e


class Reversible:
    """keras.layers.ReversibleEmbedding's calls, for a class whose own forward is the embedding
    lookup and whose `logits(x)` is the reverse product: each call of the layer in the graph
    (the graph passes its index: takes_call) is a lookup, or with reverse=True logits soft-capped
    by logit_soft_cap * tanh(logits / cap). A call from a wrapper (no index) is the first call's
    kind."""

    takes_call = True

    def directions_and_cap(self, directions: Sequence[bool], soft_cap: Optional[float]) -> None:
        self.directions, self.soft_cap = list(directions), soft_cap

    def forward(self, inputs, masks, call: Optional[int] = None):
        if not self.directions[call or 0]:
            return super().forward(inputs, masks)
        logits = self.logits(inputs[0])
        if self.soft_cap is not None:
            logits = torch.tanh(logits / self.soft_cap) * self.soft_cap
        return [logits], [None]


def without_mask_in_keras2(module: _Single, ctx) -> _Single:
    """tf.keras 2's Identity, Rescaling and Normalization do not support masking: there a mask
    that reaches them is dropped without a word (Keras 3's pass it on)."""
    if ctx.keras_major < 3:
        module.keeps_mask = False
    return module


def class_rank(ctx) -> int:
    """The spatial rank a class name says: Conv2D, MaxPooling3D, Conv1DTranspose, ..."""
    return int(re.search(r"(\d)D", ctx.spec.class_name).group(1))


def channels_last_format(cfg, ctx) -> bool:
    """True for data_format="channels_last" (Keras's default), False for "channels_first"."""
    return Values(cfg, ctx).str("data_format", "channels_last", ("channels_last", "channels_first")) == "channels_last"


def to_channels_first(x: Tensor, channels_last: bool) -> Tensor:
    """[N, *S, C] -> [N, C, *S] (unchanged when already channels first). One channel is given
    with standard strides: torch 2.14's float32 CPU convolution computes a one-channel input whose
    channel stride is 1 (the permuted view) wrongly (see csrc/core/conv_lstm.cpp)."""
    if not channels_last:
        return x
    if x.shape[-1] == 1:
        return x.reshape(x.shape[0], 1, *x.shape[1:-1]).contiguous()
    return x.movedim(-1, 1)


def from_channels_first(y: Tensor, channels_last: bool) -> Tensor:
    """The inverse of to_channels_first, contiguous: an elementwise op on the moved view makes
    torch.export compare strides over a free length (after a strided convolution or pooling: a
    guard it cannot prove, and the export fails)."""
    return y.movedim(1, -1).contiguous() if channels_last else y


def _channels_last(cfg, ctx):
    """Refuses data_format="channels_first" for a layer that supports only channels_last."""
    if cfg.get("data_format", "channels_last") not in ("channels_last", None):
        raise ctx.error(f"data_format={str(cfg.get('data_format'))[:40]!r} is not supported (channels_last only)")
