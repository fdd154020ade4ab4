"""Dynamic int8 quantization for CPU inference: ``quantize_dynamic``.

Weights are quantized to int8 with one scale per output column (symmetric, the largest magnitude
to 127); each GEMM's input is quantized per row as it is computed (the recurrent state at every
step, the layer input once per call); products accumulate in int32 on AVX512_VNNI (elsewhere on
AVX_VNNI or AVX2, with the same sums) and everything else (the cell's gates and states, biases,
activations) stays float32. The float32 weights stay the module's parameters (``state_dict`` is
unchanged); their int8 forms are made on the first call and kept while the weights are unchanged
(their version counters). On a CPU without AVX2 the marked layers compute in float32.

What is quantized: LSTM, GRU and SimpleRNN layers (their input and recurrent products; GRU with
``reset_after=False`` its input products only), converted Keras ``Dense`` layers and
``torch.nn.Linear``. ConvLSTM, attention and convolutions stay float32.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from .layers import _RNNBase


class Int8Linear(nn.Module):
    """A ``torch.nn.Linear`` whose products run in int8 (``cudnn_rnn::linear_int8``) on float32 CPU
    inputs (other inputs run ``torch.nn.functional.linear``); ``weight`` and ``bias`` are the
    original module's, so is ``state_dict``. Inference only: it starts in eval mode, and in training
    mode a call raises.

    Args:
        linear (torch.nn.Linear): the layer to quantize.

    Shape:
        - Input: :math:`(*, H_{in})`
        - Output: :math:`(*, H_{out})`

    Example:
        >>> layer = cudnn_rnn.Int8Linear(torch.nn.Linear(64, 8))
        >>> layer(torch.randn(3, 64)).shape
        torch.Size([3, 8])
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.train(False)  # built for inference
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            raise RuntimeError("Int8Linear runs inference only; call model.eval() (the int8 product has no gradient)")
        if x.device.type == "cpu" and x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            with torch.no_grad():
                return torch.ops.cudnn_rnn.linear_int8(x, self.weight.t(), self.bias)
        return nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def _replace_linears(module: nn.Module) -> int:
    count = 0
    for name, child in module.named_children():
        if type(child) is nn.Linear:
            setattr(module, name, Int8Linear(child))
            count += 1
        else:
            count += _replace_linears(child)
    return count


def quantize_dynamic(model: nn.Module, inplace: bool = False) -> nn.Module:
    """Dynamic int8 quantization of a model's recurrent and dense layers, for CPU inference.

    Marks every cudnn_rnn LSTM / GRU / SimpleRNN (standalone, in ``Bidirectional``, or in a model
    ``load_keras`` converted) and every converted Keras ``Dense`` to run its GEMMs in int8, and
    replaces each ``torch.nn.Linear`` with an :class:`Int8Linear`. The model is put in eval mode:
    quantized layers run inference only (no gradients; a call in training mode raises).

    Args:
        model (torch.nn.Module): the model.
        inplace (bool): change ``model`` itself. Default: ``False`` (a deep copy is changed).

    Returns:
        The quantized model. Its error against float32 on the shipped Keras example
        (``examples/sentiment.h5``) is documented in docs/guides/serving.md (Quantized inference).

    Example:
        >>> model = cudnn_rnn.load_keras("examples/sentiment.h5")
        >>> q = cudnn_rnn.quantize_dynamic(model)  # int8 products where the CPU has AVX2 or AVX512_VNNI
        >>> q(torch.randint(1, 50, (2, 20))).shape
        torch.Size([2, 3])
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace must be a bool; got {type(inplace).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    from .keras.layers.core import Dense  # the converted Keras Dense

    if type(model) is nn.Linear:
        model = Int8Linear(model)
    for m in model.modules():
        if isinstance(m, (_RNNBase, Dense)):
            m.quantized = True
    _replace_linears(model)
    return model.eval()


def int8_available() -> bool:
    """Whether this CPU runs the int8 products (AVX512_VNNI, or AVX2).

    Returns:
        bool: where False, quantized layers compute in float32.
    """
    return _int8()


def _int8() -> bool:
    from ._C import cpu_int8_gemms

    return cpu_int8_gemms()
