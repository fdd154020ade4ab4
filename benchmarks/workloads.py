"""The benchmark's workloads, their inputs, and the FLOP count each result is measured against.

A workload is a shape (T, layers, I, H, B, bidirectional) plus how the batch is padded:
``lengths=None`` (every sequence has T steps), or a rule drawing per-sequence lengths (the
sequences are right-padded to T and the layers get the matching [B, T] mask). A *case* is one
workload run with one cell (LSTM, GRU or SimpleRNN).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Tuple

import torch

import cudnn_rnn
from cudnn_rnn.cells import GATES


# Every workload shrunk to this (T, B, I, H) in smoke mode, so the whole suite runs in seconds.
SMOKE_SHAPE = dict(T=5, B=2, I=8, H=8)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    description: str
    T: int
    layers: int
    I: int
    H: int
    B: int
    cells: Tuple[str, ...] = ("lstm", "gru")
    bidirectional: bool = False
    # How the batch is padded: None (all sequences have T steps), "uniform_1_T" (lengths drawn
    # from U[1, T], the mask of a typical padded Keras batch) or "uniform_30_100" (lengths from
    # U[0.3 T, T), i.e. U[30, 100) at T=100: fastrnns' variable-length benchmark).
    lengths: Optional[str] = None
    # Keras-only cell settings: GRU reset_after=False and recurrent_dropout, which no fused path
    # (cuDNN, torch.nn, TF's standard_gru) implements.
    reset_after: bool = True
    recurrent_dropout: float = 0.0

    def shrunk(self) -> "Workload":
        """The same workload at the smoke-test size (layers, direction and padding kept)."""
        return dataclasses.replace(self, **SMOKE_SHAPE)

    def shape_string(self) -> str:
        s = f"T={self.T} L={self.layers} I={self.I} H={self.H} B={self.B}"
        if self.bidirectional:
            s += " bidir"
        if self.lengths:
            s += f" lengths~{self.lengths}"
        return s


WORKLOADS: List[Workload] = [
    Workload("fastrnns", "fastrnns default s100-l1-i512-h512-b64", T=100, layers=1, I=512, H=512, B=64),
    Workload("fastrnns-2layer", "fastrnns default with 2 layers", T=100, layers=2, I=512, H=512, B=64),
    Workload("fastrnns-bidir", "fastrnns default, bidirectional", T=100, layers=1, I=512, H=512, B=64,
             bidirectional=True),
    Workload("ptb-large", "PTB large LM: 2 layers, 1500 hidden, batch 20, 35 steps", T=35, layers=2, I=1500,
             H=1500, B=20),
    Workload("latency", "small-batch latency: B=1", T=50, layers=1, I=128, H=128, B=1),
    Workload("keras-typical", "typical Keras model, masked (lengths ~ U[1, T], right-padded)", T=100, layers=1,
             I=64, H=64, B=32, cells=("lstm", "gru", "simple_rnn"), lengths="uniform_1_T"),
    Workload("variable-length", "fastrnns size, lengths ~ U[30, 100) (right-padded, masked)", T=100, layers=1,
             I=512, H=512, B=64, lengths="uniform_30_100"),
    Workload("keras-only", "Keras-only GRU: reset_after=False, recurrent_dropout=0.25 (Keras-typical size)",
             T=100, layers=1, I=64, H=64, B=32, cells=("gru",), reset_after=False, recurrent_dropout=0.25),
]


@dataclasses.dataclass
class Inputs:
    """One case's inputs: x [B, T, I], and for padded workloads the lengths [B] and mask [B, T]."""

    x: torch.Tensor
    lengths: Optional[torch.Tensor] = None
    mask: Optional[torch.Tensor] = None

    @property
    def real_steps(self) -> int:
        """Sum of the sequence lengths: the timesteps that carry data (B*T without padding)."""
        if self.lengths is None:
            return self.x.shape[0] * self.x.shape[1]
        return int(self.lengths.sum())


def draw_lengths(w: Workload, generator: torch.Generator) -> Optional[torch.Tensor]:
    if w.lengths is None:
        return None
    if w.lengths == "uniform_1_T":
        low, high = 1, w.T + 1
    elif w.lengths == "uniform_30_100":
        low, high = max(1, math.ceil(0.3 * w.T)), w.T
    else:
        raise ValueError(f"unknown lengths rule {w.lengths!r}")
    return torch.randint(low, max(high, low + 1), (w.B,), generator=generator)


def make_inputs(w: Workload, device: str, seed: int = 0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(w.B, w.T, w.I, generator=g)
    lengths = draw_lengths(w, g)
    mask = None if lengths is None else torch.arange(w.T)[None, :] < lengths[:, None]
    return Inputs(x.to(device), lengths, None if mask is None else mask.to(device))


def build_ours(w: Workload, cell: str, device: str, seed: int = 0) -> torch.nn.Module:
    """Our layer for the case (return_sequences=True), with seeded Keras-default initial weights."""
    torch.manual_seed(seed)
    cls = {"lstm": cudnn_rnn.LSTM, "gru": cudnn_rnn.GRU, "simple_rnn": cudnn_rnn.SimpleRNN}[cell]
    kwargs = dict(num_layers=w.layers, return_sequences=True)
    if cell == "gru":
        kwargs["reset_after"] = w.reset_after
    if w.recurrent_dropout:
        kwargs.update(recurrent_dropout=w.recurrent_dropout, seed=seed)
    layer = cls(w.I, w.H, **kwargs)
    if w.bidirectional:
        layer = cudnn_rnn.Bidirectional(layer)
    return layer.to(device)


def gemm_flops(w: Workload, cell: str, real_steps: int, mode: str) -> float:
    """The GEMM FLOPs of one call: forward = sum over layers and directions of
    2 * steps * (In + H) * G * H (In = that layer's input width, steps = the real timesteps of
    the batch, i.e. T*B, or the sum of the lengths for padded workloads); forward+backward = 3x
    forward. Elementwise gate math is not counted."""
    directions = 2 if w.bidirectional else 1
    total = 0.0
    for layer in range(w.layers):
        width = w.I if layer == 0 else directions * w.H
        total += directions * 2.0 * real_steps * (width + w.H) * GATES[cell] * w.H
    return total if mode == "forward" else 3.0 * total


def select(smoke: bool) -> List[Workload]:
    """The workloads, shrunk to SMOKE_SHAPE in smoke mode."""
    return [w.shrunk() for w in WORKLOADS] if smoke else list(WORKLOADS)


def as_dict(w: Workload) -> Dict:
    return dataclasses.asdict(w)
