"""The attention layers that sit beside recurrent encoders and decoders: Attention (Luong: dot or
concat scores, use_scale), AdditiveAttention (Bahdanau) and MultiHeadAttention (over the time
axis of [batch, time, features] inputs), with Keras's masks (query / value / key masks, an
attention_mask tensor, use_causal_mask, sliding_window) and return_attention_scores.

Semantics follow keras/src/layers/attention/{attention,additive_attention,multi_head_attention}.py
(Keras 3.15) and their tf.keras 2 counterparts, which compute the same: scores at masked positions
lowered by 1e9 before the softmax; Attention zeroes the outputs of masked query steps;
a query step of MultiHeadAttention whose every key is masked attends uniformly to all of them
(the -1e9 swamps every score), except in Keras 3 on its slow path (dropout > 0 or
return_attention_scores: keras.layers.Softmax with a mask), which zeroes the masked
probabilities. On its fast path Keras 3 calls torch's scaled_dot_product_attention with an
additive mask of -0.7 x the largest float; so does this module, because that kernel's backward
treats a row with every key masked its own way (gradients as if each key had weight 1). Keras 3's MultiHeadAttention also removes the masks from the tensors it reads, as
a side effect that depends on the order Keras runs the graph in: a layer reading the same
tensor after it then sees no mask there (reproduced by model.py, KerasModel._masks_dropped). The per-call options
(use_causal_mask, return_attention_scores) and where each tensor comes from (positional or
keyword: query=, value=, key=, attention_mask=) are read from the layer's calls in the graph.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .registry import BuildContext, builder
from .values import Values, check_shapes

_NEG = 1e9  # Keras's large negative number for float32 scores


def _large_negative(dtype) -> float:
    """The additive mask of Keras 3's dot_product_attention (torch backend): -0.7 x the dtype's
    largest value, as Keras writes it."""
    return -0.7 * (65500.0 if dtype == torch.float16 else 3.38953e38)


def _call_options(ctx: BuildContext, names=("use_causal_mask", "return_attention_scores")) -> Dict[str, bool]:
    """The boolean call options every call of the layer gives (the same for all calls)."""
    seen = None
    for call in ctx.spec.calls:
        opts = {}
        for name in names:
            value = call.kwargs.get(name, False)
            if not isinstance(value, bool):
                raise ctx.error(f"call option {name}={str(value)[:40]!r}; expected true or false")
            opts[name] = value
        if seen is not None and opts != seen:
            raise ctx.error(f"the layer is called with different options ({seen} and {opts}); one module serves "
                            "every call, so they must agree")
        seen = opts
    return seen or {name: False for name in names}


def _binding(ctx: BuildContext, positional: List[str]) -> Dict[str, int]:
    """Where each named argument sits in the module's inputs, the same for every call."""
    seen = None
    for call in ctx.spec.calls:
        names = positional[: len(call.inputs)]
        if len(call.inputs) > len(positional):
            raise ctx.error(f"called with {len(call.inputs)} positional tensors; expected at most {len(positional)}")
        for k in call.tensor_kwargs():
            if len(call.kwargs[k]) != 1:
                raise ctx.error(f"call argument {k} holds {len(call.kwargs[k])} tensors; expected one")
            names.append(k)
        if len(set(names)) != len(names):
            raise ctx.error(f"call arguments {names} name a tensor twice")
        if seen is not None and names != seen:
            raise ctx.error(f"the layer's calls pass their tensors differently ({seen} and {names})")
        seen = names
    return {name: i for i, name in enumerate(seen or [])}


def _causal(tq: int, tv: int, device) -> Tensor:
    """[1, Tq, Tv]: query step i may see value steps j <= i (Keras: row index >= column index)."""
    rows = torch.arange(tq, device=device)[:, None]
    cols = torch.arange(tv, device=device)[None, :]
    return (rows >= cols)[None]


def _and(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    if a is None:
        return b
    return a if b is None else a & b


class DotAttention(nn.Module):
    """keras.layers.Attention and AdditiveAttention: inputs [query, value(, key)], masks
    [query mask, value mask(, key mask)]; outputs the attended values (and the scores)."""

    def __init__(self, additive: bool, scale: Optional[Tensor], concat_weight: Optional[Tensor], dropout: float,
                 causal: bool, return_scores: bool):
        super().__init__()
        self.additive = additive
        self.scale = nn.Parameter(scale) if scale is not None else None
        self.concat_weight = nn.Parameter(concat_weight) if concat_weight is not None else None
        self.dropout, self.causal, self.return_scores = dropout, causal, return_scores

    def keras_groups(self):
        return [("", [p for p in (self.scale, self.concat_weight) if p is not None])]

    def scores(self, q: Tensor, k: Tensor) -> Tensor:
        if self.additive:
            t = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))
            return (t * self.scale if self.scale is not None else t).sum(-1)
        if self.concat_weight is not None:
            s = q.unsqueeze(-2) + k.unsqueeze(-3)
            return self.concat_weight * torch.tanh(self.scale * s if self.scale is not None else s).sum(-1)
        s = q @ k.transpose(-1, -2)
        return s * self.scale if self.scale is not None else s

    def forward(self, inputs, masks):
        if len(inputs) not in (2, 3):
            raise ValueError(f"attention takes [query, value] or [query, value, key]; got {len(inputs)} tensors")
        q, v = inputs[0], inputs[1]
        k = inputs[2] if len(inputs) > 2 else v
        q_mask, v_mask = masks[0], masks[1]
        s = self.scores(q, k)
        score_mask = v_mask.unsqueeze(-2) if v_mask is not None else None
        if self.causal:
            score_mask = _and(score_mask, _causal(s.shape[-2], s.shape[-1], s.device))
        if score_mask is not None:
            s = torch.where(score_mask, s, s - _NEG)
        w = torch.softmax(s, dim=-1)
        out = F.dropout(w, self.dropout, self.training) @ v if self.dropout > 0 else w @ v
        if q_mask is not None:
            out = torch.where(q_mask.unsqueeze(-1), out, torch.zeros((), dtype=out.dtype, device=out.device))
        if self.return_scores:
            return [out, w], [q_mask, None]
        return [out], [q_mask]


def _attention_options(cfg, ctx, additive: bool):
    v = Values(cfg, ctx)
    use_scale = v.bool("use_scale", additive)
    score_mode = "dot" if additive else v.str("score_mode", "dot", choices=("dot", "concat"))
    dropout = v.float("dropout", 0.0, 0.0, 1.0)
    opts = _call_options(ctx)
    causal = opts["use_causal_mask"] or v.bool("causal", False)  # tf.keras <= 2.9 kept it in the config
    return use_scale, score_mode, min(dropout, 1.0 - 1e-7), causal, opts["return_attention_scores"]


@builder("Attention", weights=lambda cfg: bool(cfg.get("use_scale")) or cfg.get("score_mode") == "concat")
def build_attention(cfg, ctx):
    use_scale, score_mode, dropout, causal, scores = _attention_options(cfg, ctx, additive=False)
    n = int(use_scale) + int(score_mode == "concat")
    (w,) = ctx.weights.take([("", n)])
    check_shapes(ctx, "Attention", w, [()] * n)
    scale = ctx.tensor(w[0]).data if use_scale else None
    concat = ctx.tensor(w[-1]).data if score_mode == "concat" else None
    return DotAttention(False, scale, concat, dropout, causal, scores)


@builder("AdditiveAttention", weights=lambda cfg: cfg.get("use_scale", True) is not False)
def build_additive_attention(cfg, ctx):
    use_scale, _, dropout, causal, scores = _attention_options(cfg, ctx, additive=True)
    (w,) = ctx.weights.take([("", int(use_scale))])
    check_shapes(ctx, "AdditiveAttention", w, [("dim",)] * int(use_scale))
    return DotAttention(True, ctx.tensor(w[0]).data if use_scale else None, None, dropout, causal, scores)


class MultiHeadAttention(nn.Module):
    """keras.layers.MultiHeadAttention over the time axis of [B, T, F] query / value / key, and
    GroupedQueryAttention: fewer key / value heads than query heads, each repeated for its group
    of consecutive query heads (Keras's ops.repeat)."""

    def __init__(self, weights: Dict[str, List[Tensor]], num_heads: int, key_dim: int, dropout: float,
                 binding: Dict[str, int], causal: bool, return_scores: bool, sliding_window: Optional[int],
                 zero_masked: bool, keras3: bool = True, attention_axes: Optional[Tuple[int, ...]] = None):
        super().__init__()
        self.attention_axes = attention_axes  # as configured (None: every axis between batch and features)
        self.names = list(weights)  # Keras's sub-layer order (a ParameterDict keeps its keys sorted)
        self.proj = nn.ParameterDict({name: nn.Parameter(w[0]) for name, w in weights.items()})
        self.bias = nn.ParameterDict({name: nn.Parameter(w[1]) for name, w in weights.items() if len(w) > 1})
        self.num_heads, self.key_dim, self.dropout = num_heads, key_dim, dropout
        self.binding, self.causal, self.return_scores, self.sliding_window = binding, causal, return_scores, sliding_window
        self.zero_masked = zero_masked  # masked probabilities set to 0 after the softmax
        self.keras3 = keras3

    def keras_groups(self):
        return [(_GROUPS_KERAS3[name], [self.proj[name]] + ([self.bias[name]] if name in self.bias else []))
                for name in self.names]  # Keras's sub-layer order: query, key(, gate), value, output

    def _project(self, name: str, x: Tensor) -> Tensor:  # [B, ..., F] -> [B, ..., H, D]
        y = torch.einsum("...f,fhd->...hd", x, self.proj[name])
        return y + self.bias[name] if name in self.bias else y

    def _axes(self, rank: int) -> Tuple[int, ...]:
        """The attention axes of the projected [B, ..., H, D] tensors (rank of them), as Keras's
        _build_attention takes them: every axis between batch and heads where none are
        configured; a negative one counted from the input's rank in Keras 3, from the
        projection's in tf.keras (its einsum equations index with it as it is)."""
        if self.attention_axes is None:
            return tuple(range(1, rank - 2))
        if rank == 4 and self.attention_axes == (-3,):  # the time axis (as the converter has always read it)
            return (1,)
        base = rank - 1 if self.keras3 else rank
        return tuple(a if a >= 0 else base + a for a in self.attention_axes)

    def _over_axes(self, query: Tensor, value: Tensor, key: Tensor, axes: Tuple[int, ...]):
        """Keras's attention over the axes `axes` of [B, ..., F] inputs (its einsum equations): the
        other axes between batch and heads are batch axes, the scores a softmax over all the key's
        attention positions at once. No masks (refused by the caller)."""
        q = self._project("query", query)
        k, v = self._project("key", key), self._project("value", value)
        rank = q.dim()
        if any(not 1 <= a <= rank - 3 for a in axes) or len(set(axes)) != len(axes):
            raise ValueError(f"MultiHeadAttention: attention_axes={self.attention_axes} do not fit inputs of shape "
                             f"{tuple(query.shape)} (axes between the batch and the features)")
        if k.dim() != rank or v.dim() != rank:
            raise ValueError(f"MultiHeadAttention: query, value and key must have the same rank; got "
                             f"{tuple(query.shape)}, {tuple(value.shape)}, {tuple(key.shape)}")
        if k.shape[-2] != self.num_heads:  # GroupedQueryAttention
            k = k.repeat_interleave(self.num_heads // k.shape[-2], dim=-2)
            v = v.repeat_interleave(self.num_heads // v.shape[-2], dim=-2)
        batch = [i for i in range(rank - 1) if i not in axes]  # batch, the other axes, the heads
        order = batch + list(axes) + [rank - 1]
        qp, kp, vp = q.permute(order), k.permute(order), v.permute(order)
        lead = qp.shape[:len(batch)]
        if kp.shape[:len(batch)] != lead or vp.shape[:-1] != kp.shape[:-1]:
            raise ValueError(f"MultiHeadAttention: the query's, value's and key's axes other than the attention axes "
                             f"{axes} must agree; got {tuple(query.shape)}, {tuple(value.shape)}, {tuple(key.shape)}")
        q_at, k_at = qp.shape[len(batch):-1], kp.shape[len(batch):-1]
        n = math.prod(lead)
        qf = qp.reshape(n, math.prod(q_at), qp.shape[-1]) * (1.0 / math.sqrt(self.key_dim))
        scores = torch.bmm(qf, kp.reshape(n, math.prod(k_at), kp.shape[-1]).transpose(1, 2))
        probs = torch.softmax(scores, dim=-1)
        attended = torch.bmm(F.dropout(probs, self.dropout, self.training), vp.reshape(n, math.prod(k_at), vp.shape[-1]))
        back = [0] * rank
        for j, a in enumerate(order):
            back[a] = j
        attended = attended.reshape(*lead, *q_at, vp.shape[-1]).permute(back)  # [B, ..., H, Dv]
        return attended, probs.reshape(*lead, *q_at, *k_at)

    def forward(self, inputs, masks):
        at = self.binding
        query, value = inputs[at["query"]], inputs[at["value"]]
        key = inputs[at["key"]] if "key" in at else value
        axes = self._axes(query.dim() + 1)
        if query.dim() != 3 or axes != (1,):
            return self._forward_over_axes(inputs, masks, query, value, key, axes)
        for name, t in (("query", query), ("value", value), ("key", key)):
            if t.dim() != 3:
                raise ValueError(f"MultiHeadAttention: {name} must be [batch, time, features] as the query is; "
                                 f"got {tuple(t.shape)}")
        # Keras 3 fills query_mask / value_mask / key_mask from the tensors' own masks
        q_mask = masks[at["query"]]
        v_mask = inputs[at["value_mask"]] if "value_mask" in at else masks[at["value"]]
        k_mask = inputs[at["key_mask"]] if "key_mask" in at else (masks[at["key"]] if "key" in at else None)
        mask = q_mask.bool().unsqueeze(-1) if q_mask is not None else None
        mask = _and(mask, v_mask.bool().unsqueeze(-2) if v_mask is not None else None)
        mask = _and(mask, k_mask.bool().unsqueeze(-2) if k_mask is not None else None)
        tq, tv = query.shape[1], value.shape[1]
        if self.causal:
            mask = _and(mask, _causal(tq, tv, query.device))
        if self.sliding_window is not None:
            rows = torch.arange(tq, device=query.device)[:, None]
            cols = torch.arange(tv, device=query.device)[None, :]
            mask = _and(mask, ((rows - cols).abs() < self.sliding_window)[None])
        if "attention_mask" in at:
            given = inputs[at["attention_mask"]].bool()
            mask = given if mask is None else given & mask
        causal_only = self.causal and q_mask is None and v_mask is None and k_mask is None and \
            self.sliding_window is None and "attention_mask" not in at
        k = self._project("key", key)
        v = self._project("value", value)
        if k.shape[2] != self.num_heads:  # GroupedQueryAttention
            k = k.repeat_interleave(self.num_heads // k.shape[2], dim=2)
            v = v.repeat_interleave(self.num_heads // v.shape[2], dim=2)
        if mask is not None:
            mask = mask.unsqueeze(1) if mask.dim() == 3 else mask
        probs = None
        if self.keras3 and not self.zero_masked:
            # Keras 3's dot_product_attention (torch backend): the same fused call, an additive
            # mask of -0.7 x the dtype's largest value (or torch's causal kernel when causality is
            # the only mask), so that gradients through rows with every key masked agree too
            q = self._project("query", query)
            bias, causal = None, False
            if mask is not None and causal_only:
                causal = True
            elif mask is not None:
                bias = torch.where(mask, torch.zeros((), dtype=q.dtype, device=q.device),
                                   torch.full((), _large_negative(q.dtype), dtype=q.dtype, device=q.device))
                bias = bias.contiguous()  # [B or 1, 1, Tq, Tv], broadcast over the heads as Keras passes it
            attended = F.scaled_dot_product_attention(
                q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(),
                attn_mask=bias, is_causal=causal, scale=1.0 / math.sqrt(self.key_dim)).transpose(1, 2)
        else:
            q = self._project("query", query) * (1.0 / math.sqrt(self.key_dim))
            scores = torch.einsum("bshd,bthd->bhts", k, q)  # [B, H, Tq, Tv]
            if mask is not None:
                if self.zero_masked:  # keras.layers.Softmax with a mask: the masked scores replaced
                    scores = torch.where(mask, scores, torch.full((), -_NEG, dtype=scores.dtype, device=scores.device))
                else:  # tf.keras's Softmax: an additive -1e9
                    scores = scores + torch.where(mask, torch.zeros((), dtype=scores.dtype, device=scores.device),
                                                  torch.full((), -_NEG, dtype=scores.dtype, device=scores.device))
            probs = torch.softmax(scores, dim=-1)
            if mask is not None and self.zero_masked:
                probs = torch.where(mask, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
            attended = torch.einsum("bhts,bshd->bthd", F.dropout(probs, self.dropout, self.training), v)
        return self._output(query, attended, probs, q_mask)

    def _output(self, query: Tensor, attended: Tensor, probs: Optional[Tensor], q_mask: Optional[Tensor]):
        if "gate" in self.proj:
            attended = attended * torch.sigmoid(self._project("gate", query))
        out = torch.einsum("...hd,hdo->...o", attended, self.proj["output"])
        if "output" in self.bias:
            out = out + self.bias["output"]
        if self.return_scores:
            return [out, probs], [q_mask, None]
        return [out], [q_mask]

    def _forward_over_axes(self, inputs, masks, query, value, key, axes):
        at = self.binding
        masked = [name for name in ("query", "value", "key") if name in at and masks[at[name]] is not None]
        masked += [name for name in ("attention_mask", "value_mask", "key_mask", "query_mask") if name in at]
        if masked or self.causal or self.sliding_window is not None:
            what = ", ".join(masked + (["use_causal_mask"] if self.causal else []) +
                             (["sliding_window"] if self.sliding_window is not None else []))
            raise ValueError(f"MultiHeadAttention over the axes {axes} of inputs of shape {tuple(query.shape)}: "
                             f"masks ({what}) are supported over the time axis of [batch, time, features] only")
        attended, probs = self._over_axes(query, value, key, axes)
        return self._output(query, attended, probs, None)


_GROUPS_KERAS3 = {"query": "query_dense", "key": "key_dense", "gate": "_gate_dense", "value": "value_dense",
                  "output": "output_dense"}


@builder("MultiHeadAttention")
def build_multi_head_attention(cfg, ctx):
    v = Values(cfg, ctx)
    heads, key_dim = v.int("num_heads", lo=1, hi=4096), v.int("key_dim", lo=1)
    value_dim = v.int("value_dim", key_dim, lo=1)
    use_bias, use_gate = v.bool("use_bias", True), v.bool("use_gate", False)
    dropout = min(v.float("dropout", 0.0, 0.0, 1.0), 1.0 - 1e-7)
    axes = cfg.get("attention_axes")
    if isinstance(axes, int) and not isinstance(axes, bool):
        axes = [axes]
    if axes is not None and not (isinstance(axes, (list, tuple)) and axes and len(axes) <= 8 and all(
            isinstance(a, int) and not isinstance(a, bool) and -9 <= a <= 9 for a in axes)):
        raise ctx.error(f"attention_axes={str(axes)[:40]}; expected None, an axis or a list of axes")
    window = cfg.get("sliding_window")
    if window is not None:
        window = v.int("sliding_window", lo=1)
    output_shape = cfg.get("output_shape")
    if isinstance(output_shape, list) and len(output_shape) == 1:
        output_shape = output_shape[0]
    if output_shape is not None and (isinstance(output_shape, bool) or not isinstance(output_shape, int)):
        raise ctx.error(f"output_shape={str(output_shape)[:40]}; only one output width is supported")
    d_out = "out" if output_shape is None else output_shape
    return _attention_module(ctx, use_bias, use_gate, dropout, window, heads, heads, key_dim, value_dim, d_out,
                             tuple(axes) if axes is not None else None)


def _attention_module(ctx, use_bias, use_gate, dropout, window, heads, kv_heads, key_dim, value_dim, d_out,
                      attention_axes=None):
    """The weights (sub-layers query, key, gate, value, output, checked against the config) and
    the call options of a MultiHeadAttention or GroupedQueryAttention."""
    what = ctx.spec.class_name
    names = ["query", "key"] + (["gate"] if use_gate else []) + ["value", "output"]
    per = 2 if use_bias else 1
    # (tf.keras's .keras files name the sub-layers by their private attributes: _query_dense, ...)
    groups = [((_GROUPS_KERAS3[n], "_" + _GROUPS_KERAS3[n].lstrip("_")), per) for n in names]
    arrays = ctx.weights.take(groups)
    weights = {n: [ctx.tensor(a).data for a in w] for n, w in zip(names, arrays)}
    expected = {"query": [("q", heads, key_dim), (heads, key_dim)],
                "key": [("k", kv_heads, key_dim), (kv_heads, key_dim)],
                "gate": [("q", heads, value_dim), (heads, value_dim)],
                "value": [("v", kv_heads, value_dim), (kv_heads, value_dim)],
                "output": [(heads, value_dim, d_out), (d_out,)]}
    check_shapes(ctx, what, [a for w in arrays for a in w], [s for n in names for s in expected[n][:per]])
    opts = _call_options(ctx)
    binding = _binding(ctx, ["query", "value", "key"])
    if "query" not in binding or "value" not in binding:
        raise ctx.error(f"{what} is called without a query and a value tensor")
    unknown = set(binding) - {"query", "value", "key", "attention_mask", "value_mask", "key_mask", "query_mask"}
    if unknown:
        raise ctx.error(f"{what} call arguments {sorted(unknown)} are not supported")
    zero_masked = ctx.keras_major >= 3 and (dropout > 0 or opts["return_attention_scores"])
    return MultiHeadAttention(weights, heads, key_dim, dropout, binding, opts["use_causal_mask"],
                              opts["return_attention_scores"], window, zero_masked, keras3=ctx.keras_major >= 3,
                              attention_axes=attention_axes)


@builder("GroupedQueryAttention", "GroupQueryAttention")
def build_grouped_query_attention(cfg, ctx):
    v = Values(cfg, ctx)
    head_dim, heads = v.int("head_dim", lo=1), v.int("num_query_heads", lo=1, hi=4096)
    kv_heads = v.int("num_key_value_heads", lo=1, hi=4096)
    if heads % kv_heads:
        raise ctx.error(f"num_query_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    dropout = min(v.float("dropout", 0.0, 0.0, 1.0), 1.0 - 1e-7)
    window = v.int("sliding_window", lo=1) if cfg.get("sliding_window") is not None else None
    return _attention_module(ctx, v.bool("use_bias", True), v.bool("use_gate", False), dropout, window, heads,
                             kv_heads, head_dim, head_dim, "out")
