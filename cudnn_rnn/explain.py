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

    def __str__(self) -> str:
        text = f"{self.backend} on {self.device}"
        if self.reasons:
            text += ": " + "; ".join(self.reasons)
        if self.notes:
            text += " (" + "; ".join(self.notes) + ")"
        return text


def cudnn_incompatibilities(layer: _RNNBase, dtype: torch.dtype, training: bool) -> List[str]:
    """Everything about `layer` that cuDNN's RNN API cannot express, as readable reasons."""
    reasons = [f"{setting} is not supported by cuDNN ({standard})" for setting, standard in layer.nonstandard_settings()]
    if training and 0.0 < layer.recurrent_dropout < 1.0:
        reasons.append(f"recurrent_dropout={layer.recurrent_dropout} masks h inside the step, which cuDNN cannot")
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        reasons.append(f"dtype {dtype} is not supported by cuDNN")
    return reasons


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
    reasons = []
    for side in sides:
        for reason in cudnn_incompatibilities(side, ref.dtype, training):
            if reason not in reasons:
                reasons.append(reason)
    notes = ["a mask runs on cuDNN only when right-padded; any other mask runs cuda-generic"]
    if ref.dtype == torch.bfloat16:
        notes.append("bfloat16 needs cuDNN >= 9.13, else cuda-generic")
    if not torch._C._dispatch_has_kernel_for_dispatch_key("cudnn_rnn::rnn_forward", "CUDA"):
        notes.append("this build has no CUDA kernels yet, so a CUDA tensor raises")
    return Explanation("cuda-generic" if reasons else "cudnn", str(device), reasons, notes)
