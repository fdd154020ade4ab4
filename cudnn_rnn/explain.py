"""Which backend runs a layer, and why not cuDNN (docs/architecture.md; the choice itself:
csrc/cudnn_host/backend_choice.cpp)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Union

import torch
from torch import nn

from .layers import Bidirectional, _RNNBase


@dataclass
class Explanation:
    """What :func:`explain` found; ``str()`` gives it in one line.

    Attributes:
        backend (str): ``"cpu"``, ``"cudnn"``, ``"cuda-generic"``, or ``"unavailable"`` (CUDA
            asked of a CPU-only build).
        device (str): the device asked about.
        reasons (list of str): why not cuDNN (empty when cuDNN runs).
        notes (list of str): conditions that depend on the call (a mask's shape).
        algorithm (str or None): the cuDNN RNN algorithm, when cuDNN runs.
        plan (list of str): on the CPU, the products (engine, precision) and the thread split.
    """

    backend: str
    device: str
    reasons: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    algorithm: Optional[str] = None
    plan: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = f"{self.backend} on {self.device}"
        if self.algorithm:
            text += f" (algorithm {self.algorithm})"
        if self.reasons:
            text += ": " + "; ".join(self.reasons)
        if self.notes:
            text += " (" + "; ".join(self.notes) + ")"
        return text


def _side_choice(layer: _RNNBase, dtype: torch.dtype, training: bool, bidirectional: bool, go_backwards: bool,
                 mask: Optional[torch.Tensor]):
    """The C++ backend choice (csrc/cudnn_host/backend_choice.cpp) for one op call of `layer`,
    asked with the call's own arguments: meta tensors without a mask; with one, CPU tensors of
    its batch and length (the choice reads the mask's values)."""
    from ._C import cuda_backend_choice

    where = "meta" if mask is None else "cpu"
    batch, time = (1, 1) if mask is None else tuple(mask.shape)

    def empty(shape):
        return torch.empty(shape, dtype=dtype, device=where)

    directions = 2 if bidirectional else 1
    x = empty((batch, time, layer.input_size))
    weights = [empty(w.shape) for l in range(layer.num_layers) for _ in range(directions)
               for w in layer.layer_weights(l)]
    inputs, recurrent = layer.dropout_shapes(batch, training)
    dropout = [empty(shape) for shape, _ in inputs for _ in range(directions)]
    recurrent_dropout = [empty(shape) for shape, _ in recurrent for _ in range(directions)]
    spec = layer.op_spec(bidirectional=bidirectional, go_backwards=go_backwards)
    return cuda_backend_choice(x, weights, mask, None, None, dropout, recurrent_dropout, *spec.args(), False)


def _cpu_plan(layer: _RNNBase, dtype: torch.dtype, training: bool, mask: Optional[torch.Tensor]) -> List[str]:
    """What the CPU backend's time loop runs for this layer (csrc/cpu/plan_choice.cpp), in words."""
    from ._C import cpu_bf16_gemm_kernel, cpu_forward_plan, cpu_int8_gemm_isa, cpu_split
    from .cells import GATES

    gates, units = GATES[layer.cell], layer.units
    quantized = layer.quantized and not training and dtype == torch.float32
    precision = "int8" if quantized else {torch.bfloat16: "bfloat16", torch.float64: "float64"}.get(dtype, "float32")
    shape = {} if mask is None else {"batch": mask.shape[0], "time": mask.shape[1]}
    plan, rows_apart = cpu_forward_plan(layer.cell, units, precision, **shape)
    if plan == "int8":
        products = f"int8 products ({cpu_int8_gemm_isa()})"
    elif plan == "bfloat16":
        products = f"bfloat16 products ({cpu_bf16_gemm_kernel()} kernel)"
    elif precision == "float64":
        products = "float64 products (BLAS)"
    else:
        products = f"float32 products on the {plan} engine" + (" (no int8 products on this CPU)" if quantized else "")
        small = None if mask is not None else cpu_forward_plan(layer.cell, units, precision, batch=1, time=1)[0]
        if small not in (None, plan):
            products += f" ({small} for one-step calls and batches under 8)"
    notes = [products]
    if layer.cell == "gru" and not layer.reset_after or (training and layer.recurrent_dropout > 0):
        notes.append("row loops in parallel over the batch (two GEMMs a step, or recurrent dropout)")
    elif mask is not None and rows_apart:
        notes.append(f"steps split by {cpu_split(mask.shape[0], units, gates)} on {torch.get_num_threads()} threads")
    else:
        notes.append("steps split by units (by batch rows where the batch and kernel size make it pay: "
                     "cudnn_rnn.set_cpu_plan)" if rows_apart else "steps split by units")
    return notes


def _device(device: Union[str, torch.device]) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device; got {type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must name a device such as 'cpu' or 'cuda:0'; got {device!r}") from None


def explain(layer: nn.Module, device: Union[str, torch.device, None] = None, training: Optional[bool] = None,
            mask: Optional[torch.Tensor] = None) -> Explanation:
    r"""Which backend would run ``layer``, and why not cuDNN.

    Args:
        layer (LSTM, GRU, SimpleRNN or Bidirectional): the layer to explain.
        device (str or torch.device, optional): where the call would run. Default: where the
            layer's parameters are.
        training (bool, optional): for a call in training mode (dropout). Default:
            ``layer.training``.
        mask (Tensor, optional): the :math:`(N, L)` mask a call would pass. cuDNN takes no mask or
            a right-padded one; anything else runs the generic CUDA backend. Default: the answer
            for unmasked and right-padded calls (a note says so).

    Returns:
        Explanation: ``backend`` (``"cpu"``, ``"cudnn"``, ``"cuda-generic"``, or ``"unavailable"``
        when a CPU-only build is asked about CUDA), ``reasons`` it is not cuDNN, ``notes``,
        cuDNN's ``algorithm``, and on the CPU the ``plan`` (products, engine, thread split).
        ``str()`` gives it in one line.

    Example:
        >>> cudnn_rnn.explain(cudnn_rnn.GRU(8, 8, reset_after=False)).backend
        'cpu'
        >>> print(cudnn_rnn.explain(cudnn_rnn.GRU(8, 8, reset_after=False), "cuda"))  # doctest: +SKIP
        cuda-generic on cuda: reset_after=False is not supported by cuDNN ...
    """
    if isinstance(layer, Bidirectional):
        sides = [layer.forward_layer, layer.backward_layer]
    elif isinstance(layer, _RNNBase):
        sides = [layer]
    else:
        raise TypeError(f"layer must be a cudnn_rnn LSTM, GRU, SimpleRNN or Bidirectional; got {type(layer).__name__}")
    ref = sides[0].kernel
    device = _device(device) if device is not None else ref.device
    training = layer.training if training is None else training
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"mask must be a (batch, time) tensor; got {got}")
        mask = (mask if mask.dtype == torch.bool else mask != 0).to("cpu")
    if device.type != "cuda":
        return Explanation("cpu", str(device), plan=_cpu_plan(sides[0], ref.dtype, training, mask))
    if not torch._C._dispatch_has_kernel_for_dispatch_key("cudnn_rnn::rnn_forward", "CUDA"):
        return Explanation("unavailable", str(device), ["this build has no CUDA kernels (a CPU-only build): a CUDA "
                                                        "tensor raises; rebuild with CUDA (docs/install.md)"])
    if isinstance(layer, Bidirectional) and layer.fused:
        calls = [(sides[0], True, sides[0].go_backwards)]
    else:
        calls = [(side, False, side.go_backwards) for side in sides]
    reasons = []
    for side, bidirectional, go_backwards in calls:
        cudnn, reason = _side_choice(side, ref.dtype, training, bidirectional, go_backwards, mask)
        if not cudnn and reason not in reasons:
            reasons.append(reason)
    notes = [] if mask is not None else ["a mask runs on cuDNN only when right-padded; any other mask runs cuda-generic"]
    if ref.dtype == torch.bfloat16:
        notes.append("bfloat16 needs cuDNN >= 9.13, else cuda-generic")
    if reasons:
        return Explanation("cuda-generic", str(device), reasons, notes)
    from ._C import choose_algorithm

    major = torch.cuda.get_device_capability(device)[0] if torch.cuda.is_available() else 8
    side = sides[0]
    uniform = mask is None or bool(mask.all())
    algorithm = choose_algorithm(side.cell, side.units, ref.dtype, uniform, major)
    if algorithm != "STANDARD" and mask is None:
        notes.append("with a mask (variable lengths): STANDARD; a persistent algorithm cuDNN refuses falls back to "
                     "STANDARD")
    return Explanation("cudnn", str(device), [], notes, algorithm=algorithm)
