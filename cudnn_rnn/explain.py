"""Which backend runs a layer, and why not cuDNN (DESIGN.md, "Backends and the choice")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

import torch
from torch import nn

from .layers import Bidirectional, _RNNBase


@dataclass
class Explanation:
    backend: str  # "cpu", "cudnn" or "cuda-generic"
    device: str
    reasons: List[str] = field(default_factory=list)  # why not cuDNN (empty when cuDNN runs)
    notes: List[str] = field(default_factory=list)    # conditions that depend on the call
    algorithm: Optional[str] = None                   # the cuDNN RNN algorithm, when cuDNN runs

    def __str__(self) -> str:
        text = f"{self.backend} on {self.device}"
        if self.algorithm:
            text += f" (algorithm {self.algorithm})"
        if self.reasons:
            text += ": " + "; ".join(self.reasons)
        if self.notes:
            text += " (" + "; ".join(self.notes) + ")"
        return text


def _side_choice(layer: _RNNBase, dtype: torch.dtype, training: bool, bidirectional: bool, go_backwards: bool):
    """The C++ backend choice (csrc/cudnn_host/backend_choice.cpp) for one op call of `layer`
    without a mask, asked with the call's own arguments as meta tensors."""
    from ._C import cuda_backend_choice

    def meta(shape):
        return torch.empty(shape, dtype=dtype, device="meta")

    directions = 2 if bidirectional else 1
    x = meta((1, 1, layer.input_size))
    weights = [meta(w.shape) for l in range(layer.num_layers) for _ in range(directions)
               for w in layer.layer_weights(l)]
    inputs, recurrent = layer.dropout_shapes(1, training)
    dropout = [meta(shape) for shape, _ in inputs for _ in range(directions)]
    recurrent_dropout = [meta(shape) for shape, _ in recurrent for _ in range(directions)]
    spec = layer.op_spec(bidirectional=bidirectional, go_backwards=go_backwards)
    return cuda_backend_choice(x, weights, None, None, None, dropout, recurrent_dropout, *spec.args(), False)


def explain(layer: nn.Module, device: Union[str, torch.device, None] = None, training: Optional[bool] = None) -> Explanation:
    """Which backend would run `layer` on `device` (default: where its parameters are) and, when
    it is not cuDNN, why."""
    if isinstance(layer, Bidirectional):
        sides = [layer.forward_layer, layer.backward_layer]
    elif isinstance(layer, _RNNBase):
        sides = [layer]
    else:
        raise TypeError(f"layer must be a cudnn_rnn LSTM, GRU, SimpleRNN or Bidirectional; got {type(layer).__name__}")
    ref = sides[0].kernel
    device = torch.device(device) if device is not None else ref.device
    training = layer.training if training is None else training
    if device.type != "cuda":
        return Explanation("cpu", str(device))
    if isinstance(layer, Bidirectional) and layer.fused:
        calls = [(sides[0], True, sides[0].go_backwards)]
    else:
        calls = [(side, False, side.go_backwards) for side in sides]
    reasons = []
    for side, bidirectional, go_backwards in calls:
        cudnn, reason = _side_choice(side, ref.dtype, training, bidirectional, go_backwards)
        if not cudnn and reason not in reasons:
            reasons.append(reason)
    notes = ["a mask runs on cuDNN only when right-padded; any other mask runs cuda-generic"]
    if ref.dtype == torch.bfloat16:
        notes.append("bfloat16 needs cuDNN >= 9.13, else cuda-generic")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("cudnn_rnn::rnn_forward", "CUDA"):
        notes.append("this build has no CUDA kernels (CPU-only build), so a CUDA tensor raises")
    if reasons:
        return Explanation("cuda-generic", str(device), reasons, notes)
    from ._C import choose_algorithm

    major = torch.cuda.get_device_capability(device)[0] if torch.cuda.is_available() else 8
    side = sides[0]
    algorithm = choose_algorithm(side.cell, side.units, ref.dtype, True, major)
    if algorithm != "STANDARD":
        notes.append("with a mask (variable lengths): STANDARD; a persistent algorithm cuDNN refuses falls back to "
                     "STANDARD")
    return Explanation("cudnn", str(device), [], notes, algorithm=algorithm)
