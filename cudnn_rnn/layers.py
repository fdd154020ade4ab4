"""Keras 3 recurrent layers as torch.nn.Modules: LSTM, GRU, SimpleRNN, Bidirectional.

Parameters are the Keras tensors (``kernel`` [I, G*u], ``recurrent_kernel`` [u, G*u], ``bias``);
the work is one call of the ``cudnn_rnn::rnn_forward`` op per stack. Input is batch-major
(B, T, F) as in Keras; outputs follow Keras (``return_sequences``, ``return_state``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import List, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.utils._device import DeviceContext

from .cells import GATES, STATES, canonical_activation, standard_departures
from ._random import MaskSource
from ._C import layer_call as _layer_call
from .ops import RnnSpec, rnn_forward
from .torch_conversion import copy_from_torch, keras_options, to_torch as _to_torch, torch_incompatibilities

_INITIALIZERS = ("glorot_uniform", "glorot_normal", "orthogonal", "zeros", "ones", "he_uniform", "he_normal",
                 "lecun_uniform", "lecun_normal", "random_uniform", "random_normal")


def _init_(tensor: Tensor, name: str, argument: str) -> None:
    """Keras initializers by name, for a Keras-layout 2-D [fan_in, fan_out] or 1-D tensor, or a
    convolution kernel [*kernel_size, in, out] (fans times the receptive field, as Keras counts)."""
    if name not in _INITIALIZERS:
        raise ValueError(f"{argument} must be one of {list(_INITIALIZERS)}; got {name!r}")
    if tensor.dtype in (torch.float16, torch.bfloat16):
        # Drawn in float32 and rounded once (torch has no float16 / bfloat16 QR for orthogonal).
        full = torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device)
        _init_(full, name, argument)
        with torch.no_grad():
            tensor.copy_(full)
        return
    with torch.no_grad():
        if name == "zeros":
            tensor.zero_()
        elif name == "ones":
            tensor.fill_(1.0)
        elif name == "orthogonal":
            nn.init.orthogonal_(tensor.view(-1, tensor.shape[-1]) if tensor.dim() > 2 else tensor)
        elif name == "random_uniform":
            tensor.uniform_(-0.05, 0.05)
        elif name == "random_normal":
            tensor.normal_(0.0, 0.05)
        else:
            if tensor.dim() >= 2:
                field = math.prod(tensor.shape[:-2])
                fan_in, fan_out = tensor.shape[-2] * field, tensor.shape[-1] * field
            else:
                fan_in = fan_out = tensor.numel()
            scale = {"glorot": 2.0 / (fan_in + fan_out), "he": 2.0 / fan_in, "lecun": 1.0 / fan_in}[name.split("_")[0]]
            if name.endswith("uniform"):
                limit = math.sqrt(3.0 * scale)
                tensor.uniform_(-limit, limit)
            else:  # Keras uses a truncated normal with stddev sqrt(scale) / .87962566103423978
                std = math.sqrt(scale) / 0.87962566103423978
                nn.init.trunc_normal_(tensor, 0.0, std, -2 * std, 2 * std)


def _check_rate(value, argument: str) -> float:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{argument} must be a float in [0, 1]; got {value!r}")
    return float(value)


def _check_positive_int(value, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{argument} must be a positive integer; got {value!r}")
    return value


def _traced_or_overridden() -> bool:
    """Whether something above the dispatcher watches the call (torch.compile / export, torch.jit
    tracing, a torch function mode other than torch's default device): the layer then runs its
    Python path, which they see."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    if not torch._C._is_torch_function_mode_enabled():
        return False
    # torch.set_default_device / `with torch.device(...)`: a mode that only places new tensors, and
    # the op makes its outputs on x's device.
    return not all(type(m) is DeviceContext for m in torch.overrides._get_current_function_mode_stack())


def autocast_input(t, ref: Tensor):
    """Under torch.autocast, a floating tensor of another dtype than the parameters `ref` (the
    autocast dtype a preceding layer produced) cast to theirs: the recurrent layers compute in
    their parameters' precision, as torchvision's ops compute in float32 under autocast. Outside
    autocast, or for a tensor of their dtype, `t` itself."""
    if isinstance(t, Tensor):  # (cheapest test first: this runs on every call, streaming included)
        if t.dtype != ref.dtype and t.is_floating_point() and torch.is_autocast_enabled(t.device.type):
            return t.to(ref.dtype)
        return t
    if isinstance(t, (list, tuple)):
        dtype = ref.dtype
        for e in t:  # (a loop, not any() over a generator: a streaming call passes its states here)
            if isinstance(e, (Tensor, list, tuple)) and getattr(e, "dtype", None) != dtype:
                return type(t)(autocast_input(e, ref) for e in t)
    return t


class _RNNBase(nn.Module):
    """Shared machinery of the three Keras recurrent layers (one stack of num_layers)."""

    cell: str = ""
    # Set by cudnn_rnn.quantize_dynamic: inference through the int8 op (cudnn_rnn/quantization.py).
    quantized: bool = False
    # Whether forward may run the everyday call in C++ (_C.layer_call): false for a subclass that
    # overrides a step of the Python path, which must then run.
    _plain_call: bool = True
    _PATH_STEPS = ("run", "layer_weights", "_weight", "_check_input", "_check_mask", "_initial_states",
                   "dropout_masks", "op_spec")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._plain_call = all(getattr(cls, name) is getattr(_RNNBase, name) for name in _RNNBase._PATH_STEPS)

    def __init__(self, input_size, units, *, activation, recurrent_activation, use_bias, kernel_initializer,
                 recurrent_initializer, bias_initializer, dropout, recurrent_dropout, seed, return_sequences,
                 return_state, go_backwards, stateful, unroll, zero_output_for_mask, reset_after, unit_forget_bias,
                 num_layers, device, dtype):
        super().__init__()
        self.input_size = _check_positive_int(input_size, "input_size")
        self.units = _check_positive_int(units, "units")
        self.num_layers = _check_positive_int(num_layers, "num_layers")
        self.activation = canonical_activation(activation, "activation")
        self.recurrent_activation = canonical_activation(recurrent_activation, "recurrent_activation")
        self.use_bias = bool(use_bias)
        self.reset_after = bool(reset_after)
        self.unit_forget_bias = bool(unit_forget_bias)
        self.dropout = _check_rate(dropout, "dropout")
        self.recurrent_dropout = _check_rate(recurrent_dropout, "recurrent_dropout")
        self.seed = seed
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.go_backwards = bool(go_backwards)
        self.stateful = bool(stateful)
        self.unroll = bool(unroll)  # Keras's unrolled loop: the same numbers but for unrolled_zeros
        self.zero_output_for_mask = bool(zero_output_for_mask)
        self.kernel_initializer = kernel_initializer
        self.recurrent_initializer = recurrent_initializer
        self.bias_initializer = bias_initializer
        # masks a seeded layer has drawn (_random.py); not state_dict material
        self.register_buffer("_draws", torch.zeros((), dtype=torch.int64, device=device), persistent=False)
        self._states: Optional[List[Tensor]] = None
        # Input width of layers 1.. of the stack: units, or 2 * units inside a Bidirectional.
        self.inner_input_size = self.units

        gu = self.gates * self.units
        factory = {"device": device, "dtype": dtype}
        for layer in range(self.num_layers):
            in_size = self.input_size if layer == 0 else self.inner_input_size
            self.register_parameter(self._name("kernel", layer), nn.Parameter(torch.empty(in_size, gu, **factory)))
            self.register_parameter(self._name("recurrent_kernel", layer),
                                    nn.Parameter(torch.empty(self.units, gu, **factory)))
            if self.use_bias:
                shape = (2, gu) if self.cell == "gru" and self.reset_after else (gu,)
                self.register_parameter(self._name("bias", layer), nn.Parameter(torch.empty(shape, **factory)))
        self.reset_parameters()

    # -- parameters ---------------------------------------------------------------------------
    @property
    def gates(self) -> int:
        return GATES[self.cell]

    @property
    def state_count(self) -> int:
        return STATES[self.cell]

    @staticmethod
    def _name(kind: str, layer: int) -> str:
        return kind if layer == 0 else f"{kind}_l{layer}"

    def reset_parameters(self) -> None:
        for layer in range(self.num_layers):
            _init_(getattr(self, self._name("kernel", layer)), self.kernel_initializer, "kernel_initializer")
            _init_(getattr(self, self._name("recurrent_kernel", layer)), self.recurrent_initializer,
                   "recurrent_initializer")
            if self.use_bias:
                bias = getattr(self, self._name("bias", layer))
                _init_(bias, self.bias_initializer, "bias_initializer")
                if self.cell == "lstm" and self.unit_forget_bias:
                    with torch.no_grad():  # Keras: [init(u), ones(u), init(2u)]
                        bias[self.units : 2 * self.units] = 1.0

    def _widen_for_bidirectional(self) -> None:
        """Inside a Bidirectional, layers 1.. of the stack read both directions: [2u, G*u] kernels."""
        if self.num_layers == 1 or self.inner_input_size == 2 * self.units:
            return
        self.inner_input_size = 2 * self.units
        ref = self.kernel
        for layer in range(1, self.num_layers):
            name = self._name("kernel", layer)
            kernel = nn.Parameter(torch.empty(2 * self.units, self.gates * self.units, dtype=ref.dtype, device=ref.device))
            _init_(kernel, self.kernel_initializer, "kernel_initializer")
            setattr(self, name, kernel)

    def layer_weights(self, layer: int = 0) -> List[Tensor]:
        """[kernel, recurrent_kernel(, bias)] of one layer of the stack, in op order."""
        return [self._weight(name) for name in _cached(_weight_names)(self.use_bias, layer)]

    def _weight(self, name: str) -> Tensor:
        # Straight from the parameter dict (nn.Module.__getattr__ costs a few microseconds a call,
        # which a one-step streaming call pays several times); through getattr where the weight
        # is not a plain parameter (a parametrization, a reassigned tensor).
        p = self._parameters.get(name)
        return p if p is not None else getattr(self, name)

    def op_spec(self, **overrides) -> RnnSpec:
        """The op's options for this layer's stack (one direction, as configured); keyword
        overrides replace fields (a Bidirectional sets bidirectional=True)."""
        spec = _cached(_spec)(self.cell, self.activation, self.recurrent_activation, self.use_bias, self.reset_after,
                     self.num_layers, self.go_backwards, self.zero_output_for_mask)
        return dataclasses.replace(spec, **overrides) if overrides else spec

    def nonstandard_settings(self) -> List[tuple]:
        """(setting, what the standard cell has) for each way this cell departs from the one
        cuDNN and torch.nn implement (standard_departures)."""
        return standard_departures(self.cell, self.activation, self.recurrent_activation, self.reset_after)

    def keras_config(self, keras2: bool = False) -> dict:
        """The Keras constructor arguments of this layer (one layer of the stack: neither
        input_size nor num_layers), the cell's own ones included: recurrent_activation (LSTM,
        GRU), reset_after (GRU), unit_forget_bias (LSTM). What a clone, a Keras file written from
        the layer and the benchmarks' Keras peers are built from. keras2: without Keras 3's seed,
        which tf.keras's layers do not take."""
        config = dict(units=self.units, activation=self.activation, use_bias=self.use_bias,
                      kernel_initializer=self.kernel_initializer, recurrent_initializer=self.recurrent_initializer,
                      bias_initializer=self.bias_initializer, dropout=self.dropout,
                      recurrent_dropout=self.recurrent_dropout, return_sequences=self.return_sequences,
                      return_state=self.return_state, go_backwards=self.go_backwards, stateful=self.stateful,
                      unroll=self.unroll, zero_output_for_mask=self.zero_output_for_mask)
        if not keras2:
            config["seed"] = self.seed
        if self.cell != "simple_rnn":
            config["recurrent_activation"] = self.recurrent_activation
        if self.cell == "gru":
            config["reset_after"] = self.reset_after
        if self.cell == "lstm":
            config["unit_forget_bias"] = self.unit_forget_bias
        return config

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.units}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for key, default in (("activation", "tanh"), ("recurrent_activation", "sigmoid"), ("use_bias", True),
                             ("return_sequences", False), ("return_state", False), ("go_backwards", False),
                             ("stateful", False), ("dropout", 0.0), ("recurrent_dropout", 0.0)):
            if getattr(self, key) != default:
                s += f", {key}={getattr(self, key)!r}"
        return s

    # -- dropout ------------------------------------------------------------------------------
    def _dropout_mask(self, shape, rate: float, like: Tensor) -> Tensor:
        return MaskSource.keep_mask(shape, rate, like, self.seed, self._draws)

    def dropout_shapes(self, batch: int, training: bool):
        """Keras's masks as (shape, rate) pairs: one per sequence, shared by every step. With
        recurrent_dropout Keras switches to implementation=1, where each gate draws its own mask.

        Returns (input masks, recurrent masks), one ([1 or G, B, width], rate) per layer, or []."""
        per_gate = self.gates if self.recurrent_dropout > 0 else 1

        def applies(rate: float) -> bool:
            # Keras's LSTM/GRU cells skip a rate of 1; its SimpleRNN cell applies it (all zeros).
            return training and (0.0 < rate <= 1.0 if self.cell == "simple_rnn" else 0.0 < rate < 1.0)

        drop_in, drop_rec = applies(self.dropout), applies(self.recurrent_dropout)
        inputs, recurrent = [], []
        for layer in range(self.num_layers):
            width = self.input_size if layer == 0 else self.inner_input_size
            if drop_in:
                inputs.append(((per_gate, batch, width), self.dropout))
            if drop_rec:
                recurrent.append(((per_gate, batch, self.units), self.recurrent_dropout))
        return inputs, recurrent

    def dropout_masks(self, x: Tensor, training: bool):
        """The masks of dropout_shapes, drawn (from the layer's generator when it has a seed).

        Returns (input masks, recurrent masks), one [1 or G, B, width] tensor per layer, or []."""
        if not training:  # (no masks: the common inference call returns here)
            return [], []
        inputs, recurrent = self.dropout_shapes(x.shape[0], training)
        # Drawn layer by layer, the input mask before the recurrent one: the order a seeded
        # layer's generator has always been consumed in.
        drawn_in, drawn_rec = [], []
        for layer in range(self.num_layers):
            if inputs:
                drawn_in.append(self._dropout_mask(*inputs[layer], x))
            if recurrent:
                drawn_rec.append(self._dropout_mask(*recurrent[layer], x))
        return drawn_in, drawn_rec

    # -- input checks -------------------------------------------------------------------------
    def _check_input(self, x: Tensor, argument: str = "x") -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"{argument} must be a torch.Tensor of shape (batch, time, {self.input_size}); got {type(x).__name__}")
        ref = self._weight("kernel")
        if x.dim() != 3 or x.shape[2] != self.input_size:
            raise ValueError(f"{argument} must have shape (batch, time, {self.input_size}); got {tuple(x.shape)}")
        if x.shape[1] < 1:
            raise ValueError(f"{argument} must have at least one timestep; got shape {tuple(x.shape)}")
        if x.dtype != ref.dtype:
            raise TypeError(f"{argument} must have dtype {ref.dtype} (the layer's parameters); got {x.dtype}")
        if x.device != ref.device:
            raise ValueError(f"{argument} must be on {ref.device} (the layer's parameters); got {x.device}")

    def _check_mask(self, mask: Optional[Tensor], x: Tensor) -> Optional[Tensor]:
        if mask is None:
            return None
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a torch.Tensor of shape {tuple(x.shape[:2])}; got {type(mask).__name__}")
        if tuple(mask.shape) != tuple(x.shape[:2]):
            raise ValueError(f"mask must have shape (batch, time) = {tuple(x.shape[:2])}; got {tuple(mask.shape)}")
        if mask.device != x.device:
            raise ValueError(f"mask must be on {x.device} (the device of x); got {mask.device}")
        return mask if mask.dtype == torch.bool else mask != 0

    def _initial_states(self, initial_state, x: Tensor, directions: int):
        """Keras's list of per-state [B, u] tensors -> (h0, c0) as [L*D, B, u] (or None)."""
        if initial_state is None:
            if self.stateful and self._states is not None:
                if self._states[0].shape[1] != x.shape[0]:
                    raise ValueError(
                        f"stateful layer: x has batch size {x.shape[0]} but the kept states have batch size "
                        f"{self._states[0].shape[1]}; call reset_states() to start over"
                    )
                return self._states[0], self._states[1] if self.cell == "lstm" else None
            return None, None
        if isinstance(initial_state, Tensor):
            initial_state = [initial_state]
        n = self.state_count
        expected = self.num_layers * directions * n
        if not isinstance(initial_state, (list, tuple)) or len(initial_state) != expected:
            got = len(initial_state) if isinstance(initial_state, (list, tuple)) else type(initial_state).__name__
            raise ValueError(f"initial_state must be a list of {expected} tensors of shape (batch, {self.units}); got {got}")
        # (one pass of cheap tests per state: a streaming call runs this every step)
        want, dtype, device = (x.shape[0], self.units), x.dtype, x.device
        for i, s in enumerate(initial_state):
            if not isinstance(s, Tensor) or s.shape != want:
                got = tuple(s.shape) if isinstance(s, Tensor) else type(s).__name__
                raise ValueError(f"initial_state[{i}] must have shape {want}; got {got}")
            if s.dtype != dtype or s.device != device:
                raise TypeError(f"initial_state[{i}] must be {x.dtype} on {x.device}; got {s.dtype} on {s.device}")
        if expected == n:  # one stack: views, no copy (the one-step streaming call)
            return initial_state[0].unsqueeze(0), initial_state[1].unsqueeze(0) if n == 2 else None
        h0 = torch.stack(list(initial_state[0::n]))
        c0 = torch.stack(list(initial_state[1::n])) if n == 2 else None
        return h0, c0

    def reset_states(self, states: Optional[Sequence[Tensor]] = None) -> None:
        """Forget (or set) the states a stateful layer carries between calls."""
        if states is None:
            self._states = None
        else:
            self._states = [s.detach().unsqueeze(0) if s.dim() == 2 else s.detach() for s in states]

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        if self._states is not None:  # the kept states follow .to(), .double(), .cuda() as the parameters do
            self._states = [fn(s) for s in self._states]
        return out

    # -- forward ------------------------------------------------------------------------------
    def run(self, x: Tensor, mask=None, initial_state=None, training: Optional[bool] = None):
        """Checks the inputs and runs the stack: (y [B, T, u] in processing order, h_n, c_n)."""
        self._check_input(x)
        mask = self._check_mask(mask, x)
        training = self.training if training is None else training
        h0, c0 = self._initial_states(initial_state, x, 1)
        unrolled = self.unrolled_zeros(mask)
        # (unrolled: the op returns the previous output at masked steps, zeroed below)
        spec = self.op_spec(zero_output_for_mask=False) if unrolled else self.op_spec()
        if self.quantized:
            y, h_n, c_n = self._run_int8(x, mask, h0, c0, training, spec)
        else:
            dropout_masks, recurrent_masks = self.dropout_masks(x, training)
            weights = [w for layer in range(self.num_layers) for w in self.layer_weights(layer)]
            y, h_n, c_n, _ = rnn_forward(x, weights, mask, h0, c0, dropout_masks, recurrent_masks, spec)
        if unrolled:
            y = keep_where(y, mask)  # y in processing order, the mask in time order: Keras's unrolled zeros
        if self.stateful:
            self._states = [h_n.detach()] + ([c_n.detach()] if self.cell == "lstm" else [])
        return y, h_n, c_n

    def unrolled_zeros(self, mask: Optional[Tensor], zero_output_for_mask: Optional[bool] = None) -> bool:
        """Whether this call's outputs get Keras's unrolled zeros: unroll=True, running backwards,
        returning sequences, with a mask and zero_output_for_mask (this layer's unless given).
        Keras's unrolled loop (keras/src/backend/tensorflow/rnn.py, tf_keras's backend.rnn) zeroes
        the stacked outputs, which are in processing order, where the mask in time order is False;
        its while loop (and this layer otherwise) where the step it processed was masked. (The last
        output alone it zeroes the usual way.) Keras's torch backend cannot run this case, and its
        JAX backend's unrolled loop leaves the previous outputs there."""
        zero = self.zero_output_for_mask if zero_output_for_mask is None else zero_output_for_mask
        return mask is not None and self.unroll and self.go_backwards and zero and self.return_sequences

    def _run_int8(self, x: Tensor, mask, h0, c0, training: bool, spec: RnnSpec):
        """run()'s op call for a layer cudnn_rnn.quantize_dynamic marked: inference on the int8 op."""
        if training:
            raise RuntimeError(f"{type(self).__name__}: a layer quantized by cudnn_rnn.quantize_dynamic runs inference "
                               "only; call model.eval() (or pass training=False)")
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise ValueError(f"{type(self).__name__}: a quantized layer takes float32 CPU tensors; got x as {x.dtype} "
                             f"on {x.device}")
        weights = [w for layer in range(self.num_layers) for w in self.layer_weights(layer)]
        with torch.no_grad():  # the int8 op has no gradient
            return torch.ops.cudnn_rnn.rnn_forward_int8(x, weights, mask, h0, c0, *spec.args())

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, initial_state=None, training: Optional[bool] = None):
        training_now = self.training if training is None else training
        if (mask is None and self._plain_call and not self.quantized
                and not (training_now and (self.dropout or self.recurrent_dropout)) and not _traced_or_overridden()):
            # The everyday call (streaming included) in C++; None: what it does not take runs below.
            out = _layer_call(x, self._parameters, _weight_names(self.use_bias, 0), initial_state,
                              self.op_spec().args(), self.input_size, self.units, STATES[self.cell],
                              self.return_sequences, self.return_state, self.stateful, self._states)
            if out is not None:
                if self.stateful:
                    out, self._states = out
                return out
        ref = self._weight("kernel")
        x, initial_state = autocast_input(x, ref), autocast_input(initial_state, ref)
        y, h_n, c_n = self.run(x, mask, initial_state, training)
        # (select, not indexing: Python's tensor indexing costs microseconds a call)
        output = y if self.return_sequences else y.select(1, -1)
        if not self.return_state:
            return output
        return [output, h_n.select(0, -1), c_n.select(0, -1)] if self.cell == "lstm" else [output, h_n.select(0, -1)]

    # -- torch.nn conversion ------------------------------------------------------------------
    def to_torch(self) -> nn.Module:
        """An equivalent torch.nn.LSTM / GRU / RNN (batch_first=True) with copied weights."""
        return _to_torch([self], torch_incompatibilities([self]))

    @classmethod
    def from_torch(cls, module: nn.Module, **kwargs) -> "nn.Module":
        """A layer (or a Bidirectional for a bidirectional module) with the module's weights.
        Defaults to return_sequences=True, like torch's output; kwargs override."""
        layer = from_torch(module, **kwargs)
        converted = layer.forward_layer if isinstance(layer, Bidirectional) else layer
        if not isinstance(converted, cls):
            raise TypeError(f"{cls.__name__}.from_torch needs a matching torch module; got {type(module).__name__}, "
                            f"which converts to {type(converted).__name__}")
        return layer


def _cached(fn):
    """An lru_cache-wrapped function, or while torch.compile / export traces, the function it
    wraps (the same values; Dynamo warns at every cache wrapper it traces through)."""
    return fn.__wrapped__ if torch.compiler.is_compiling() else fn


@functools.lru_cache(maxsize=None)
def _weight_names(use_bias: bool, layer: int) -> tuple:
    """The attribute names of one layer's weights, in op order."""
    kinds = ("kernel", "recurrent_kernel", "bias") if use_bias else ("kernel", "recurrent_kernel")
    return tuple(_RNNBase._name(kind, layer) for kind in kinds)


@functools.lru_cache(maxsize=1024)
def _spec(cell, activation, recurrent_activation, use_bias, reset_after, num_layers, go_backwards,
          zero_output_for_mask) -> RnnSpec:
    """One RnnSpec per configuration, so that its argument tuple is built once (RnnSpec.args)."""
    return RnnSpec(cell=cell, activation=activation, recurrent_activation=recurrent_activation, use_bias=use_bias,
                   reset_after=reset_after, num_layers=num_layers, go_backwards=go_backwards,
                   zero_output_for_mask=zero_output_for_mask)


def _layer_args(frame_locals: dict) -> dict:
    """A subclass constructor's arguments, to pass on to _RNNBase.__init__."""
    return {k: v for k, v in frame_locals.items() if k not in ("self", "__class__")}


# The arguments LSTM, GRU and SimpleRNN share, written once and placed in each class's docstring
# (help() and the reference pages show the whole text).
_SHARED_ARGS = {
    "{initializer_args}": """        use_bias (bool): whether the layer has a ``bias``. Default: ``True``.
        kernel_initializer (str): Keras initializer name for ``kernel``. Default: ``"glorot_uniform"``.
        recurrent_initializer (str): Keras initializer name for ``recurrent_kernel``.
            Default: ``"orthogonal"``.
        bias_initializer (str): Keras initializer name for ``bias``. Default: ``"zeros"``.""",
    "{dropout_state_args}": """        dropout (float): fraction of the inputs dropped in training (one mask per sequence, as
            Keras). Default: ``0.0``.
        recurrent_dropout (float): fraction of the recurrent state dropped in training (one mask
            per gate and sequence). Default: ``0.0``.
        seed (int, optional): seed of the dropout masks' counter-based generator, which gives the
            same masks eagerly and compiled, on the CPU and on CUDA; ``None`` draws them from
            torch's global generator. Default: ``None``.
        return_sequences (bool): return every step's output instead of the last. Default: ``False``.
        return_state (bool): return ``[output, *states]`` instead of the output. Default: ``False``.
        go_backwards (bool): process the sequence from its end (and return the outputs in that
            order). Default: ``False``.
        stateful (bool): keep the final states as the next call's initial states;
            ``reset_states()`` forgets them. Default: ``False``.
        unroll (bool): Keras's unrolled loop. It computes the same, except that with a mask,
            ``go_backwards`` and ``zero_output_for_mask`` (which Keras's Bidirectional sets when it
            returns sequences) the zeros of the returned sequence follow the mask in time order,
            not in processing order, as Keras's unrolled loop places them (TensorFlow backend and
            tf.keras 2; with ``num_layers``, in the last layer's output). Default: ``False``.""",
    "{shape}": """    Shape:
        - x: :math:`(N, L, H_{in})`, batch first as in Keras.
        - mask: :math:`(N, L)`, optional; True (or non-zero) for real steps, any pattern.
        - initial_state: optional list ``[{states}]``; with ``num_layers=K``, every layer's in order.
        - Output: :math:`(N, L, H)` with ``return_sequences``, else :math:`(N, H)`; with
          ``return_state``, the list ``[output, {final_states}]``, each state :math:`(N, H)` (the
          last layer's).

        where N is the batch size, L the number of steps, :math:`H_{in}` = ``input_size`` and
        H = ``units``. ``forward(x, mask=None, initial_state=None, training=None)``: ``training``
        defaults to ``module.training``; dropout applies only in training.""",
    "{stack_args}": """        zero_output_for_mask (bool): masked steps output zeros instead of the previous output.
            Default: ``False``.
        num_layers (int): a fused stack of this many layers in one op call (the inner ones return
            sequences and pass the mask on; their parameters are ``kernel_l1``, ...). Default: ``1``.
        device (torch.device, optional): device of the parameters. Default: torch's default.
        dtype (torch.dtype, optional): dtype of the parameters (float32, float64, bfloat16,
            float16). Default: torch's default.""",
}


def _with_shared_args(states: str, final_states: str):
    """Fills a layer's docstring: the shared texts, then its state names."""
    def fill(cls):
        for placeholder, text in _SHARED_ARGS.items():
            cls.__doc__ = cls.__doc__.replace(placeholder, text)
        cls.__doc__ = cls.__doc__.replace("{states}", states).replace("{final_states}", final_states)
        return cls
    return fill


@_with_shared_args("h_0, c_0", "h_n, c_n")
class LSTM(_RNNBase):
    r"""Long short-term memory layer that computes what ``keras.layers.LSTM`` computes.

    For each step, with Keras's gate order i, f, c, o::

        i = σ(x_t W_i + h U_i + b_i)      f = σ(x_t W_f + h U_f + b_f)
        g = act(x_t W_c + h U_c + b_c)    o = σ(x_t W_o + h U_o + b_o)
        c = f * c + i * g                 h = o * act(c)

    where σ is ``recurrent_activation`` and act is ``activation``. A masked step keeps both states.

    Args:
        input_size (int): features of each input step.
        units (int): size of the hidden and cell states.
        activation (str or None): Keras name of the cell's activation (``None``: linear).
            Default: ``"tanh"``.
        recurrent_activation (str): Keras name of the gates' activation. Default: ``"sigmoid"``.
{initializer_args}
        unit_forget_bias (bool): start the forget gate's bias at 1. Default: ``True``.
{dropout_state_args}
{stack_args}

{shape}

    Attributes:
        kernel: :math:`(H_{in}, 4H)`, gate blocks i, f, c, o (Keras's layout and initialisation).
        recurrent_kernel: :math:`(H, 4H)`.
        bias: :math:`(4H)`.

    Example:
        >>> lstm = cudnn_rnn.LSTM(16, 32, return_sequences=True, return_state=True)
        >>> out, h, c = lstm(torch.randn(4, 12, 16), mask=torch.ones(4, 12, dtype=torch.bool))
        >>> out.shape, h.shape
        (torch.Size([4, 12, 32]), torch.Size([4, 32]))
    """

    cell = "lstm"

    def __init__(self, input_size: int, units: int, activation="tanh", recurrent_activation="sigmoid",
                 use_bias: bool = True, kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal",
                 bias_initializer="zeros", unit_forget_bias: bool = True, dropout: float = 0.0,
                 recurrent_dropout: float = 0.0, seed: Optional[int] = None, return_sequences: bool = False,
                 return_state: bool = False, go_backwards: bool = False, stateful: bool = False,
                 unroll: bool = False, zero_output_for_mask: bool = False, num_layers: int = 1,
                 device=None, dtype=None):
        super().__init__(**_layer_args(locals()), reset_after=False)


@_with_shared_args("h_0", "h_n")
class GRU(_RNNBase):
    r"""Gated recurrent unit layer that computes what ``keras.layers.GRU`` computes.

    For each step, with Keras's gate order z, r, h::

        z = σ(x_t W_z + h U_z + b_z)      r = σ(x_t W_r + h U_r + b_r)
        ĥ = act(x_t W_h + r * (h U_h + b'_h) + b_h)       (reset_after=True)
        ĥ = act(x_t W_h + (r * h) U_h + b_h)              (reset_after=False)
        h = z * h + (1 - z) * ĥ

    where σ is ``recurrent_activation``, act is ``activation`` and b' the recurrent bias row.

    Args:
        input_size (int): features of each input step.
        units (int): size of the hidden state.
        activation (str or None): Keras name of the candidate's activation (``None``: linear).
            Default: ``"tanh"``.
        recurrent_activation (str): Keras name of the gates' activation. Default: ``"sigmoid"``.
{initializer_args}
{dropout_state_args}
        reset_after (bool): apply the reset gate after the recurrent product (Keras 3's and
            cuDNN's default) instead of before it (Keras 2's). Default: ``True``.
{stack_args}

{shape}

    Attributes:
        kernel: :math:`(H_{in}, 3H)`, gate blocks z, r, h.
        recurrent_kernel: :math:`(H, 3H)`.
        bias: :math:`(2, 3H)` with ``reset_after`` (row 0 input, row 1 recurrent), else :math:`(3H)`.

    Example:
        >>> gru = cudnn_rnn.GRU(16, 24, reset_after=False, recurrent_activation="hard_sigmoid")
        >>> gru(torch.randn(4, 12, 16)).shape
        torch.Size([4, 24])
    """

    cell = "gru"

    def __init__(self, input_size: int, units: int, activation="tanh", recurrent_activation="sigmoid",
                 use_bias: bool = True, kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal",
                 bias_initializer="zeros", dropout: float = 0.0, recurrent_dropout: float = 0.0,
                 seed: Optional[int] = None, return_sequences: bool = False, return_state: bool = False,
                 go_backwards: bool = False, stateful: bool = False, unroll: bool = False,
                 reset_after: bool = True, zero_output_for_mask: bool = False, num_layers: int = 1,
                 device=None, dtype=None):
        super().__init__(**_layer_args(locals()), unit_forget_bias=False)


@_with_shared_args("h_0", "h_n")
class SimpleRNN(_RNNBase):
    r"""Fully connected recurrent layer that computes what ``keras.layers.SimpleRNN`` computes:
    ``h = act(x_t W + h U + b)`` for each step, a masked step keeping ``h``.

    Args:
        input_size (int): features of each input step.
        units (int): size of the hidden state.
        activation (str or None): Keras name of the activation (``None``: linear).
            Default: ``"tanh"``.
{initializer_args}
{dropout_state_args}
{stack_args}

{shape}

    Attributes:
        kernel: :math:`(H_{in}, H)`.
        recurrent_kernel: :math:`(H, H)`.
        bias: :math:`(H)`.

    Example:
        >>> rnn = cudnn_rnn.SimpleRNN(16, 8, activation="relu", return_sequences=True)
        >>> rnn(torch.randn(4, 12, 16)).shape
        torch.Size([4, 12, 8])
    """

    cell = "simple_rnn"

    def __init__(self, input_size: int, units: int, activation="tanh", use_bias: bool = True,
                 kernel_initializer="glorot_uniform", recurrent_initializer="orthogonal", bias_initializer="zeros",
                 dropout: float = 0.0, recurrent_dropout: float = 0.0, seed: Optional[int] = None,
                 return_sequences: bool = False, return_state: bool = False, go_backwards: bool = False,
                 stateful: bool = False, unroll: bool = False, zero_output_for_mask: bool = False,
                 num_layers: int = 1, device=None, dtype=None):
        super().__init__(**_layer_args(locals()), recurrent_activation="sigmoid", reset_after=False,
                         unit_forget_bias=False)


_MERGE_MODES = ("concat", "sum", "mul", "ave", None)


class Bidirectional(nn.Module):
    r"""Runs a recurrent layer over the sequence in both directions and merges the two outputs,
    as ``keras.layers.Bidirectional`` does.

    ``forward_layer`` is ``layer`` itself (its ``zero_output_for_mask`` set as Keras sets it; in a
    ``num_layers`` stack its inner kernels are re-created to read both directions).
    ``backward_layer`` defaults to a freshly initialised copy of its configuration with
    ``go_backwards`` flipped, as tf.keras does (Keras 3 refuses a wrapped layer that already has
    ``go_backwards=True``; here it computes what tf.keras computed). When both sides share a cell
    configuration they run as one two-direction op call. With ``num_layers=N`` the wrapped layer
    stands for N stacked Bidirectional layers (concatenated between layers), which is also
    torch.nn's bidirectional stacking.

    Args:
        layer (LSTM, GRU or SimpleRNN): the forward direction.
        merge_mode (str or None): ``"concat"``, ``"sum"``, ``"mul"``, ``"ave"``, or ``None`` to
            return the two outputs as a list. Default: ``"concat"``.
        backward_layer (LSTM, GRU or SimpleRNN, optional): the backward direction, with the same
            ``return_sequences`` and ``return_state``. Default: a copy of ``layer``'s configuration.

    Shape:
        - x: :math:`(N, L, H_{in})`; mask: :math:`(N, L)`, optional.
        - initial_state: optional list, the forward layer's states then the backward layer's.
        - Output: :math:`(N, L, 2H)` for ``"concat"`` with ``return_sequences`` (:math:`(N, L, H)`
          for the other modes, a list of the two outputs for ``None``; without
          ``return_sequences`` the time axis is dropped); with ``return_state``,
          ``[output, *forward_states, *backward_states]``. ``forward(x, mask=None,
          initial_state=None, training=None)``, as the wrapped layer's.

    Example:
        >>> bi = cudnn_rnn.Bidirectional(cudnn_rnn.LSTM(16, 32, return_sequences=True))
        >>> bi(torch.randn(4, 12, 16)).shape
        torch.Size([4, 12, 64])
    """

    def __init__(self, layer: _RNNBase, merge_mode: Optional[str] = "concat", backward_layer: Optional[_RNNBase] = None):
        super().__init__()
        if not isinstance(layer, _RNNBase):
            raise ValueError(f"layer must be a cudnn_rnn LSTM, GRU or SimpleRNN; got {type(layer).__name__}")
        if merge_mode not in _MERGE_MODES:
            raise ValueError(f"merge_mode must be one of {_MERGE_MODES}; got {merge_mode!r}")
        if backward_layer is None:
            backward_layer = _clone_config(layer, go_backwards=not layer.go_backwards)
        elif not isinstance(backward_layer, _RNNBase):
            raise ValueError(f"backward_layer must be a cudnn_rnn LSTM, GRU or SimpleRNN; got {type(backward_layer).__name__}")
        for attr in ("return_sequences", "return_state"):
            if getattr(layer, attr) != getattr(backward_layer, attr):
                raise ValueError(f"forward layer and backward_layer must have the same {attr}; got "
                                 f"{getattr(layer, attr)} and {getattr(backward_layer, attr)}")
        if layer.go_backwards == backward_layer.go_backwards:
            raise ValueError("forward layer and backward_layer must have different go_backwards; got "
                             f"{layer.go_backwards} for both")
        if backward_layer.input_size != layer.input_size:
            raise ValueError(f"backward_layer.input_size must be {layer.input_size}; got {backward_layer.input_size}")
        if type(layer) is not type(backward_layer) and (layer.num_layers > 1 or backward_layer.num_layers > 1):
            raise ValueError("num_layers > 1 in a Bidirectional needs the same cell on both sides")
        self.forward_layer = layer
        self.backward_layer = backward_layer
        self.merge_mode = merge_mode
        self.return_sequences = layer.return_sequences
        self.return_state = layer.return_state
        # Keras forces this on both sides (bidirectional.py).
        for side in (layer, backward_layer):
            side.zero_output_for_mask = self.return_sequences
            side._widen_for_bidirectional()
        if max(layer.num_layers, backward_layer.num_layers) > 1 and not self.fused:
            raise ValueError("num_layers > 1 in a Bidirectional needs both sides to share cell, units, activations, "
                             "use_bias, reset_after and num_layers, and neither to be stateful")

    @property
    def fused(self) -> bool:
        """Do both directions run as one op call (same cell configuration, not stateful, not
        quantized: a quantized side runs the int8 op on its own)?"""
        f, b = self.forward_layer, self.backward_layer
        return (f.op_spec(go_backwards=False) == b.op_spec(go_backwards=False) and f.units == b.units
                and not f.stateful and not b.stateful and not f.quantized and not b.quantized)

    def _merge(self, y_f: Tensor, y_b: Tensor):
        return merge_directions(y_f, y_b, self.merge_mode)

    def forward(self, x: Tensor, mask: Optional[Tensor] = None, initial_state=None, training: Optional[bool] = None):
        f, b = self.forward_layer, self.backward_layer
        x, initial_state = autocast_input(x, f.kernel), autocast_input(initial_state, f.kernel)
        training = self.training if training is None else training
        if self.fused:
            y_f, y_b, states_f, states_b = self._run_fused(x, mask, initial_state, training)
        else:
            if initial_state is not None:
                if isinstance(initial_state, Tensor) or len(initial_state) != f.state_count + b.state_count:
                    raise ValueError(f"initial_state must be a list of {f.state_count + b.state_count} tensors "
                                     "(forward states then backward states)")
                init_f, init_b = initial_state[: f.state_count], initial_state[f.state_count :]
            else:
                init_f = init_b = None
            yf, hf, cf = f.run(x, mask, init_f, training)
            yb, hb, cb = b.run(x, mask, init_b, training)
            y_f = yf if self.return_sequences else yf[:, -1]
            y_b = yb.flip(1) if self.return_sequences else yb[:, -1]
            states_f = [hf[-1]] + ([cf[-1]] if f.cell == "lstm" else [])
            states_b = [hb[-1]] + ([cb[-1]] if b.cell == "lstm" else [])
        output = self._merge(y_f, y_b)
        if not self.return_state:
            return output
        head = output if isinstance(output, list) else [output]
        return head + states_f + states_b

    def _run_fused(self, x, mask, initial_state, training):
        f, b = self.forward_layer, self.backward_layer
        f._check_input(x)
        mask = f._check_mask(mask, x)
        h0, c0 = f._initial_states(initial_state, x, 2)
        masks_f = f.dropout_masks(x, training)
        masks_b = b.dropout_masks(x, training)
        input_masks = _interleave(masks_f[0], masks_b[0], f, x, recurrent=False)
        recurrent_masks = _interleave(masks_f[1], masks_b[1], f, x, recurrent=True)
        weights = []
        for layer in range(f.num_layers):
            weights += f.layer_weights(layer) + b.layer_weights(layer)
        zero = self.return_sequences
        unrolled = [side.unrolled_zeros(mask, zero) for side in (f, b)]
        spec = f.op_spec(bidirectional=True, zero_output_for_mask=zero and not any(unrolled))
        y, h_n, c_n, _ = rnn_forward(x, weights, mask, h0, c0, input_masks, recurrent_masks, spec)
        u = f.units
        if self.return_sequences:
            y_f, y_b = y[..., :u], y[..., u:]
            if any(unrolled):
                # The op returned the previous output at masked steps; zero them as Keras does. Both
                # halves run from the end of the sequence iff the forward side goes backwards (Keras
                # returns it in processing order and puts the backward side's outputs in time
                # order); a side with unrolled zeros takes the mask the other way round.
                usual, other = (mask.flip(1), mask) if f.go_backwards else (mask, mask.flip(1))
                y_f = keep_where(y_f, other if unrolled[0] else usual)
                y_b = keep_where(y_b, other if unrolled[1] else usual)
        else:
            # Each side's last processing step: direction 0 writes it at T-1, direction 1 at 0.
            y_f, y_b = y[:, -1, :u], y[:, 0, u:]
        lstm = f.cell == "lstm"
        states_f = [h_n[-2]] + ([c_n[-2]] if lstm else [])
        states_b = [h_n[-1]] + ([c_n[-1]] if lstm else [])
        return y_f, y_b, states_f, states_b

    def to_torch(self) -> nn.Module:
        """An equivalent bidirectional torch.nn.LSTM / GRU / RNN (batch_first=True) with copied weights."""
        sides = [self.forward_layer, self.backward_layer]
        reasons = torch_incompatibilities(sides, self.merge_mode, self.fused)
        return _to_torch(sides, reasons)


def keep_where(y: Tensor, mask: Tensor) -> Tensor:
    """y [B, T, ...] where mask [B, T] is True, zeros elsewhere (Keras's where: a NaN or an
    infinity at a zeroed step becomes 0)."""
    keep = mask.reshape(mask.shape + (1,) * (y.dim() - 2))
    return torch.where(keep, y, torch.zeros((), dtype=y.dtype, device=y.device))


def merge_directions(y_f: Tensor, y_b: Tensor, merge_mode: Optional[str]):
    """Keras Bidirectional's merge of the two directions' outputs (both in time order); None
    keeps them apart as a list."""
    if merge_mode == "concat":
        return torch.cat([y_f, y_b], dim=-1)
    if merge_mode == "sum":
        return y_f + y_b
    if merge_mode == "ave":
        return (y_f + y_b) / 2
    if merge_mode == "mul":
        return y_f * y_b
    return [y_f, y_b]


def to_torch(layer: nn.Module) -> nn.Module:
    """A ``torch.nn`` module computing what ``layer`` computes, with its weights copied.

    Args:
        layer (LSTM, GRU, SimpleRNN or Bidirectional): a layer torch.nn can express: tanh /
            sigmoid activations, GRU ``reset_after=True``, no ``go_backwards``, a ``"concat"``
            merge. Dropout settings are not carried over (they differ in kind).

    Returns:
        torch.nn.LSTM, GRU or RNN with ``batch_first=True``, whose output equals the layer's with
        ``return_sequences=True``.

    Raises:
        ValueError: listing what torch.nn cannot express.
        TypeError: for anything but a cudnn_rnn LSTM, GRU, SimpleRNN or Bidirectional.

    Example:
        >>> torch_lstm = cudnn_rnn.to_torch(cudnn_rnn.LSTM(8, 16))
        >>> type(torch_lstm).__name__
        'LSTM'
    """
    if not isinstance(layer, (_RNNBase, Bidirectional)):
        raise TypeError(f"layer must be a cudnn_rnn LSTM, GRU, SimpleRNN or Bidirectional; got {type(layer).__name__}")
    return layer.to_torch()


def from_torch(module: nn.Module, **kwargs) -> nn.Module:
    """A cudnn_rnn layer with a ``torch.nn`` recurrent module's weights.

    Args:
        module (torch.nn.LSTM, GRU or RNN): the module (``batch_first`` either way; the layer takes
            batch-first inputs).
        **kwargs (Any): layer arguments to set, e.g. ``return_state=True``. ``return_sequences``
            defaults to True, as torch returns every step.

    Returns:
        LSTM, GRU or SimpleRNN (a :class:`Bidirectional` for a bidirectional module, with
        ``num_layers`` for a stack) computing what ``module`` computes.

    Example:
        >>> layer = cudnn_rnn.from_torch(torch.nn.LSTM(8, 16, batch_first=True))
        >>> layer(torch.randn(2, 5, 8)).shape
        torch.Size([2, 5, 16])
    """
    cell, options = keras_options(module)
    options.update(kwargs)
    cls = {"lstm": LSTM, "gru": GRU, "simple_rnn": SimpleRNN}[cell]

    def side(go_backwards: bool, suffix: str) -> _RNNBase:
        layer = cls(module.input_size, module.hidden_size, go_backwards=go_backwards, **options)
        if module.bidirectional:
            layer._widen_for_bidirectional()
        copy_from_torch(layer, module, suffix)
        return layer

    if not module.bidirectional:
        return side(False, "")
    return Bidirectional(side(False, ""), merge_mode="concat", backward_layer=side(True, "_reverse"))


def _interleave(masks_f: List[Tensor], masks_b: List[Tensor], layer: _RNNBase, x: Tensor, recurrent: bool):
    """Per-(layer, direction) dropout masks for the fused op; a side without dropout gets ones."""
    if not masks_f and not masks_b:
        return []
    out = []
    for l in range(layer.num_layers):
        width = layer.units if recurrent else (layer.input_size if l == 0 else layer.inner_input_size)
        ones = x.new_ones((1, x.shape[0], width))
        out += [masks_f[l] if masks_f else ones, masks_b[l] if masks_b else ones]
    return out


def _clone_config(layer: _RNNBase, **overrides) -> _RNNBase:
    """A new layer of the same class and configuration (fresh weights), as Keras's from_config."""
    kwargs = dict(layer.keras_config(), input_size=layer.input_size, num_layers=layer.num_layers,
                  device=layer.kernel.device, dtype=layer.kernel.dtype)
    kwargs.update(overrides)
    return type(layer)(**kwargs)
