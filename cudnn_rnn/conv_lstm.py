"""Keras 3's ConvLSTM1D / ConvLSTM2D / ConvLSTM3D as torch.nn.Modules.

Parameters are the Keras tensors (``kernel`` [*kernel_size, channels, 4 * filters],
``recurrent_kernel`` [*kernel_size, filters, 4 * filters], ``bias`` [4 * filters]; gates i, f, c,
o); the work is one call of the ``cudnn_rnn::conv_lstm_forward`` op (csrc/core/conv_lstm.cpp): the
input convolution of every timestep as one batched convolution, the recurrent convolution per
step, the cell fused, all channels last (channels_first inputs are permuted to it and back). Input is (batch, time, *spatial, channels) with data_format="channels_last"
(Keras's default) or (batch, time, channels, *spatial) with "channels_first"; outputs follow Keras
(``return_sequences``, ``return_state``), a mask [B, T] keeps the states over masked steps, a
mask [B, T, *S'] (Keras's Masking before a ConvLSTM) over masked positions.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn

from ._random import MaskSource
from .cells import canonical_activation
from .layers import _check_positive_int, _check_rate, _init_, autocast_input
from .ops import register_meta

IntOrTuple = Union[int, Sequence[int]]
_forward_op = torch.ops.cudnn_rnn.conv_lstm_forward.default


def _tuple(value: IntOrTuple, rank: int, argument: str, lo: int = 1) -> Tuple[int, ...]:
    values = (value,) * rank if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
    if len(values) != rank or not all(isinstance(v, int) and not isinstance(v, bool) and v >= lo for v in values):
        raise ValueError(f"{argument} must be an integer >= {lo} or {rank} of them; got {value!r}")
    return values


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> Tuple[int, int]:
    """Keras's (TensorFlow's) "same" padding of one dimension: (before, after), the extra one after."""
    span = (kernel - 1) * dilation + 1
    out = (size + stride - 1) // stride
    total = (out - 1) * stride + span - size  # (out - 1) * stride >= size - stride: negative only when span < stride
    if span < stride:
        total = torch.sym_max(0, total)  # a symbolic size stays symbolic; without the max torch can simplify it
    return total // 2, total - total // 2


def any_padding(pads) -> bool:
    """Whether F.pad has work: a padding of a symbolic size (torch.export, torch.compile) counts
    as some, with no guard on its value (which would make the size a constant)."""
    return any(isinstance(p, torch.SymInt) or p != 0 for p in pads)


def conv_output_size(size: int, kernel: int, stride: int, dilation: int, padding: str) -> int:
    span = (kernel - 1) * dilation + 1
    if padding == "same":
        return (size + stride - 1) // stride
    return (size - span) // stride + 1


class _ConvLSTM(nn.Module):
    r"""Convolutional LSTM over a sequence of 1-, 2- or 3-D feature maps, as Keras's ConvLSTM1D / 2D
    / 3D compute it: the LSTM of :class:`LSTM` with its matrix products replaced by convolutions
    (the input convolution with ``strides``, ``padding`` and ``dilation_rate``, the recurrent one
    "same" with stride 1).

    Args:
        in_channels (int): channels of each input step.
        filters (int): channels of the states and of the output.
        kernel_size (int or tuple): size of both convolutions' kernels.
        strides (int or tuple): stride of the input convolution. Default: ``1``.
        padding (str): ``"valid"`` or ``"same"`` (Keras's, asymmetric where it must be) for the input
            convolution. Default: ``"valid"``.
        data_format (str): ``"channels_last"`` (Keras's default) or ``"channels_first"``.
            Default: ``"channels_last"``.
        dilation_rate (int or tuple): dilation of the input convolution. Default: ``1``.
        activation (str or None): Keras name of the cell's activation. Default: ``"tanh"``.
        recurrent_activation (str): Keras name of the gates' activation. Default: ``"sigmoid"``.
        use_bias (bool): whether the layer has a ``bias``. Default: ``True``.
        kernel_initializer (str): Keras initializer name for ``kernel``. Default: ``"glorot_uniform"``.
        recurrent_initializer (str): for ``recurrent_kernel``. Default: ``"orthogonal"``.
        bias_initializer (str): for ``bias``. Default: ``"zeros"``.
        unit_forget_bias (bool): start the forget gate's bias at 1. Default: ``True``.
        dropout (float): fraction of the inputs dropped in training (one mask per gate and
            sequence). Default: ``0.0``.
        recurrent_dropout (float): fraction of the recurrent state dropped in training.
            Default: ``0.0``.
        seed (int, optional): seed of the dropout masks; ``None`` draws from torch's global
            generator. Default: ``None``.
        return_sequences (bool): return every step's output instead of the last. Default: ``False``.
        return_state (bool): return ``[output, h, c]``. Default: ``False``.
        go_backwards (bool): process the sequence from its end. Default: ``False``.
        stateful (bool): keep the final states for the next call. Default: ``False``.
        zero_output_for_mask (bool): masked steps output zeros. Default: ``False``.
        device (torch.device, optional): device of the parameters.
        dtype (torch.dtype, optional): float32 or float64.

    Shape:
        - x: :math:`(N, L, *S, C_{in})` (channels last) or :math:`(N, L, C_{in}, *S)`, S the
          ``rank`` spatial sizes.
        - mask: :math:`(N, L)`, optional, or :math:`(N, L, *S')` per output position (a masked
          position keeps its h and c and outputs its previous output, as Keras does with the mask
          of a ``Masking`` layer). initial_state: optional ``[h_0, c_0]``, each
          :math:`(N, *S', F)` in the layer's data format.
        - Output: :math:`(N, L, *S', F)` with ``return_sequences``, else :math:`(N, *S', F)`; with
          ``return_state`` the list ``[output, h_n, c_n]``. S' is S after the input convolution and
          F = ``filters``.

    Attributes:
        kernel: :math:`(*kernel\_size, C_{in}, 4F)`, gate blocks i, f, c, o.
        recurrent_kernel: :math:`(*kernel\_size, F, 4F)`.
        bias: :math:`(4F)`.
    """

    rank: int = 0

    def __init__(self, in_channels: int, filters: int, kernel_size: IntOrTuple, strides: IntOrTuple = 1,
                 padding: str = "valid", data_format: str = "channels_last", dilation_rate: IntOrTuple = 1,
                 activation="tanh", recurrent_activation="sigmoid", use_bias: bool = True,
                 kernel_initializer: str = "glorot_uniform", recurrent_initializer: str = "orthogonal",
                 bias_initializer: str = "zeros", unit_forget_bias: bool = True, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, seed: Optional[int] = None, return_sequences: bool = False,
                 return_state: bool = False, go_backwards: bool = False, stateful: bool = False,
                 zero_output_for_mask: bool = False, device=None, dtype=None):
        super().__init__()
        rank = self.rank
        self.in_channels = _check_positive_int(in_channels, "in_channels")
        self.filters = _check_positive_int(filters, "filters")
        self.kernel_size = _tuple(kernel_size, rank, "kernel_size")
        self.strides = _tuple(strides, rank, "strides")
        self.dilation_rate = _tuple(dilation_rate, rank, "dilation_rate")
        if padding not in ("valid", "same"):
            raise ValueError(f"padding must be 'valid' or 'same'; got {padding!r}")
        if data_format not in ("channels_last", "channels_first"):
            raise ValueError(f"data_format must be 'channels_last' or 'channels_first'; got {data_format!r}")
        if any(s > 1 for s in self.strides) and any(d > 1 for d in self.dilation_rate):
            raise ValueError("strides > 1 together with dilation_rate > 1 is not supported (nor by Keras)")
        self.padding, self.data_format = padding, data_format
        self.activation = canonical_activation(activation, "activation")
        self.recurrent_activation = canonical_activation(recurrent_activation, "recurrent_activation")
        self.use_bias, self.unit_forget_bias = bool(use_bias), bool(unit_forget_bias)
        self.dropout = _check_rate(dropout, "dropout")
        self.recurrent_dropout = _check_rate(recurrent_dropout, "recurrent_dropout")
        self.seed = seed
        self.return_sequences, self.return_state = bool(return_sequences), bool(return_state)
        self.go_backwards, self.stateful = bool(go_backwards), bool(stateful)
        self.zero_output_for_mask = bool(zero_output_for_mask)
        self.kernel_initializer, self.recurrent_initializer = kernel_initializer, recurrent_initializer
        self.bias_initializer = bias_initializer
        # masks a seeded layer has drawn (_random.py); not state_dict material
        self.register_buffer("_draws", torch.zeros((), dtype=torch.int64, device=device), persistent=False)
        self._states: Optional[List[Tensor]] = None
        factory = {"device": device, "dtype": dtype}
        g = 4 * self.filters
        self.kernel = nn.Parameter(torch.empty(*self.kernel_size, self.in_channels, g, **factory))
        self.recurrent_kernel = nn.Parameter(torch.empty(*self.kernel_size, self.filters, g, **factory))
        self.bias = nn.Parameter(torch.empty(g, **factory)) if self.use_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_(self.kernel, self.kernel_initializer, "kernel_initializer")
        _init_(self.recurrent_kernel, self.recurrent_initializer, "recurrent_initializer")
        if self.bias is not None:
            _init_(self.bias, self.bias_initializer, "bias_initializer")
            if self.unit_forget_bias:
                with torch.no_grad():
                    self.bias[self.filters : 2 * self.filters] = 1.0

    def extra_repr(self) -> str:
        s = f"{self.in_channels}, {self.filters}, kernel_size={self.kernel_size}"
        for name, default in (("strides", (1,) * self.rank), ("dilation_rate", (1,) * self.rank)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        for name, default in (("padding", "valid"), ("data_format", "channels_last"), ("activation", "tanh"),
                              ("recurrent_activation", "sigmoid"), ("return_sequences", False),
                              ("return_state", False), ("go_backwards", False), ("stateful", False),
                              ("zero_output_for_mask", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)!r}"
        return s

    # -- shapes -------------------------------------------------------------------------------
    def _spatial_in(self, x: Tensor) -> Tuple[int, ...]:
        return tuple(x.shape[2:-1]) if self.data_format == "channels_last" else tuple(x.shape[3:])

    def output_spatial(self, spatial: Sequence[int]) -> Tuple[int, ...]:
        return tuple(conv_output_size(n, k, s, d, self.padding)
                     for n, k, s, d in zip(spatial, self.kernel_size, self.strides, self.dilation_rate))

    def _pads(self, spatial: Sequence[int]):
        if self.padding == "valid":
            return [0] * self.rank, [0] * self.rank
        pairs = [same_padding(n, k, s, d) for n, k, s, d in zip(spatial, self.kernel_size, self.strides,
                                                                self.dilation_rate)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor; got {type(x).__name__}")
        want = self.rank + 3
        channels = x.shape[-1] if self.data_format == "channels_last" else (x.shape[2] if x.dim() > 2 else None)
        if x.dim() != want or channels != self.in_channels:
            layout = "*spatial, channels" if self.data_format == "channels_last" else "channels, *spatial"
            raise ValueError(f"x must have shape (batch, time, {layout}) with {self.rank} spatial sizes and "
                             f"{self.in_channels} channels; got {tuple(x.shape)}")
        if x.dtype != self.kernel.dtype or x.device != self.kernel.device:
            raise TypeError(f"x must be {self.kernel.dtype} on {self.kernel.device} like the layer's weights; got "
                            f"{x.dtype} on {x.device}")
        for n, k, d in zip(self._spatial_in(x), self.kernel_size, self.dilation_rate):
            if self.padding == "valid" and n < (k - 1) * d + 1:
                raise ValueError(f"x's spatial size {n} is smaller than the kernel's extent {(k - 1) * d + 1} "
                                 "(padding='valid')")

    # -- to and from the op's channels-last layout ----------------------------------------------
    def _to_op(self, t: Tensor, lead: int) -> Tensor:
        """channels_first [..lead dims.., C, *S] -> [..lead.., *S, C] (channels_last: as it is)."""
        if self.data_format == "channels_last":
            return t
        n = t.dim()
        return t.permute(*range(lead), *range(lead + 1, n), lead)

    def _from_op(self, t: Tensor, lead: int) -> Tensor:
        if self.data_format == "channels_last":
            return t
        n = t.dim()
        return t.permute(*range(lead), n - 1, *range(lead, n - 1))

    def layer_weights(self) -> List[Tensor]:
        """[kernel, recurrent_kernel(, bias)] as Keras lists them."""
        return [p for p in (self.kernel, self.recurrent_kernel, self.bias) if p is not None]

    def _weights(self):
        """kernel, recurrent kernel as the op takes them: [4F, C, *k] and [4F, F, *k]."""
        r = self.rank
        order = (r + 1, r, *range(r))
        return self.kernel.permute(*order), self.recurrent_kernel.permute(*order)

    # -- dropout --------------------------------------------------------------------------------
    def _mask(self, shape, rate: float, like: Tensor) -> Tensor:
        return MaskSource.keep_mask(shape, rate, like, self.seed, self._draws)

    def dropout_masks(self, x_op: Tensor, state_shape: Sequence[int], training: bool):
        """(input mask [4, B, *S, C] or None, recurrent mask [4, B, *S', F] or None): one mask per
        gate and sequence, shared by every step (tf.keras's ConvLSTM; Keras 3 indexes its one mask
        by the gate instead, which makes the masks rows of the batch: see docs/limits.md)."""
        dmask = rmask = None
        if training and 0.0 < self.dropout < 1.0:
            dmask = self._mask((4, x_op.shape[0], *x_op.shape[2:]), self.dropout, x_op)
        if training and 0.0 < self.recurrent_dropout < 1.0:
            rmask = self._mask((4, *state_shape), self.recurrent_dropout, x_op)
        return dmask, rmask

    # -- forward ------------------------------------------------------------------------------
    def _initial(self, initial_state, batch: int, state_shape: Tuple[int, ...]):
        if initial_state is None:
            if self.stateful and self._states is not None:
                if self._states[0].shape[0] != batch:
                    raise ValueError(f"stateful layer: x has batch size {batch} but the kept states have batch size "
                                     f"{self._states[0].shape[0]}; call reset_states() to start over")
                return self._states
            return None, None
        if isinstance(initial_state, Tensor) or len(initial_state) != 2:
            raise ValueError("initial_state must be a list of 2 tensors [h, c]")
        out = []
        for i, s in enumerate(initial_state):
            s_op = self._to_op(s, 1) if isinstance(s, Tensor) and s.dim() == len(state_shape) else s
            if not isinstance(s, Tensor) or tuple(s_op.shape) != state_shape:
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                want = tuple(self._from_op(torch.empty(state_shape, device="meta"), 1).shape)
                raise ValueError(f"initial_state[{i}] must have shape {want}; got {got}")
            if s.dtype != self.kernel.dtype or s.device != self.kernel.device:
                raise TypeError(f"initial_state[{i}] must be {self.kernel.dtype} on {self.kernel.device}")
            out.append(s_op.contiguous())
        return out

    def reset_states(self, states: Optional[Sequence[Tensor]] = None) -> None:
        """Forget (or set, as [h, c] in the layer's data_format) the states a stateful layer keeps."""
        self._states = None if states is None else [self._to_op(s.detach(), 1).contiguous() for s in states]

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self._states is not None:  # the kept states follow .to(), .double(), .cuda() as the parameters do
            self._states = [fn(s) for s in self._states]
        return out

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, initial_state=None, training: Optional[bool] = None):
        x, initial_state = autocast_input(x, self.kernel), autocast_input(initial_state, self.kernel)
        self._check_input(x)
        training = self.training if training is None else training
        spatial = self._spatial_in(x)
        out_spatial = self.output_spatial(spatial)
        state_shape = (x.shape[0], *out_spatial, self.filters)  # the op's (channels last)
        if mask is not None:
            per_step, per_position = tuple(x.shape[:2]), (*x.shape[:2], *out_spatial)
            if not isinstance(mask, Tensor) or tuple(mask.shape) not in (per_step, per_position):
                got = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
                raise ValueError(f"mask must have shape {per_step} (batch, time) or {per_position} (batch, time, "
                                 f"output positions); got {got}")
            if mask.device != x.device:
                raise ValueError(f"mask must be on {x.device} (the device of x); got {mask.device}")
            mask = mask if mask.dtype == torch.bool else mask != 0
        h0, c0 = self._initial(initial_state, x.shape[0], state_shape)
        x_op = self._to_op(x, 2).contiguous()
        dmask, rmask = self.dropout_masks(x_op, state_shape, training)
        kernel, recurrent = self._weights()
        before, after = self._pads(spatial)
        y, h_n, c_n, _, _, _ = _forward_op(x_op, kernel, recurrent, self.bias, mask, h0, c0, dmask, rmask,
                                           list(self.strides), before, after, list(self.dilation_rate),
                                           self.activation, self.recurrent_activation, self.go_backwards)
        if self.stateful:
            self._states = [h_n.detach(), c_n.detach()]
        if self.zero_output_for_mask and mask is not None:  # Keras: zeros at masked steps (processing order)
            real = (mask.flip(1) if self.go_backwards else mask).reshape(*mask.shape, *(1,) * (y.dim() - mask.dim()))
            y = torch.where(real, y, torch.zeros((), dtype=y.dtype, device=y.device))
        output = self._from_op(y, 2) if self.return_sequences else self._from_op(y[:, -1], 1)
        if not self.return_state:
            return output
        return [output, self._from_op(h_n, 1), self._from_op(c_n, 1)]


class ConvLSTM1D(_ConvLSTM):
    """``keras.layers.ConvLSTM1D``: x (batch, time, length, channels) by default. Arguments, shapes and
    attributes below.

    Example:
        >>> layer = cudnn_rnn.ConvLSTM1D(3, 4, kernel_size=3, padding="same", return_sequences=True)
        >>> layer(torch.randn(2, 5, 9, 3)).shape
        torch.Size([2, 5, 9, 4])
    """
    rank = 1


class ConvLSTM2D(_ConvLSTM):
    """``keras.layers.ConvLSTM2D``: x (batch, time, rows, cols, channels) by default. Arguments, shapes and
    attributes below.

    Example:
        >>> layer = cudnn_rnn.ConvLSTM2D(3, 4, kernel_size=3, padding="same", return_sequences=True)
        >>> layer(torch.randn(2, 5, 6, 7, 3)).shape
        torch.Size([2, 5, 6, 7, 4])
    """
    rank = 2


class ConvLSTM3D(_ConvLSTM):
    """``keras.layers.ConvLSTM3D``: x (batch, time, depth, rows, cols, channels) by default. Arguments, shapes and
    attributes below.

    Example:
        >>> layer = cudnn_rnn.ConvLSTM3D(3, 4, kernel_size=3, padding="same", return_sequences=True)
        >>> layer(torch.randn(2, 5, 4, 5, 3, 3)).shape
        torch.Size([2, 5, 4, 5, 3, 4])
    """
    rank = 3


def _fake_sizes(x, kernel, stride, pad_before, pad_after, dilation):
    spatial = []
    for i, n in enumerate(x.shape[2:-1]):
        span = (kernel.shape[2 + i] - 1) * dilation[i] + 1
        spatial.append((n + pad_before[i] + pad_after[i] - span) // stride[i] + 1)
    return spatial


@torch.library.register_fake("cudnn_rnn::conv_lstm_forward")
def _conv_lstm_forward_fake(x, kernel, recurrent_kernel, bias, mask, h0, c0, dropout_mask, recurrent_dropout_mask,
                            stride, pad_before, pad_after, dilation, activation, recurrent_activation, go_backwards):
    torch._check(x.dim() in (4, 5, 6), lambda: f"x must have 1 to 3 spatial dimensions; got {tuple(x.shape)}")
    b, t = x.shape[0], x.shape[1]
    f = kernel.shape[0] // 4
    sp = _fake_sizes(x, kernel, stride, pad_before, pad_after, dilation)
    return (x.new_empty((b, t, *sp, f)), x.new_empty((b, *sp, f)), x.new_empty((b, *sp, f)),
            x.new_empty((t, b, *sp, 4 * f)), x.new_empty((t + 1, b, *sp, f)), x.new_empty((t + 1, b, *sp, f)))


register_meta("cudnn_rnn::conv_lstm_forward", _conv_lstm_forward_fake)  # shapes only


@torch.library.register_fake("cudnn_rnn::conv_lstm_backward")
def _conv_lstm_backward_fake(grad_y, grad_h_n, grad_c_n, x, kernel, recurrent_kernel, bias, *rest):
    grad_bias = bias.new_empty(bias.shape) if bias is not None else x.new_empty((0,))
    return (x.new_empty(x.shape), kernel.new_empty(kernel.shape), recurrent_kernel.new_empty(recurrent_kernel.shape),
            grad_bias, grad_h_n.new_empty(grad_h_n.shape), grad_c_n.new_empty(grad_c_n.shape))


__all__ = ["ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D"]


# Each layer's help() and reference page carry the whole description (written once, above).
for _cls in (ConvLSTM1D, ConvLSTM2D, ConvLSTM3D):
    _cls.__doc__ = _cls.__doc__.rstrip() + "\n\n    " + _ConvLSTM.__doc__.strip() + "\n"
del _cls
