"""The implementations the benchmark times: ours and the peers, each built for one case with the
same weights and inputs.

Every implementation offers the two timed calls:
  * ``infer()``: inference, the layer in eval mode under no_grad (TF: ``training=False``);
  * ``train_step()``: a training step without optimizer, the gradients of sum(output) with
    respect to the input and every weight (training mode: recurrent dropout is drawn where
    the config has it);
and ``output()``, the inference output as a CPU torch tensor [B, T, F], which the correctness
guard compares with ours before anything is timed.

Peers: torch.nn.LSTM/GRU/RNN (``.to_torch()`` of our layer; on padded workloads both over the
padded batch and through a PackedSequence), Keras 3 on its torch backend and TF Keras (the
``tf_keras`` package: Keras 2 on TensorFlow, run inside ``tf.function`` as model.predict/fit run
it). The Keras peers are built layer by layer from ours with our weights copied in (the Keras
layout is ours: kernel [In, G*H], recurrent_kernel [H, G*H], bias).
"""
from __future__ import annotations

import importlib.util
import os
from typing import Dict, List, Optional, Type

import numpy as np
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import cudnn_rnn

from .workloads import Inputs, Workload


class PeerMismatch(AssertionError):
    """A peer computes a different function from ours on a workload's inputs."""


class Unavailable(Exception):
    """A peer that cannot run in this process (not installed, or wrong device)."""


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _sides(layer) -> List:
    """The one or two (forward, backward) unidirectional stacks of our layer."""
    if isinstance(layer, cudnn_rnn.Bidirectional):
        return [layer.forward_layer, layer.backward_layer]
    return [layer]


class Implementation:
    """One implementation of one case (workload x cell); see the module docstring."""

    name: str = ""
    slow: bool = False  # per-timestep Python or graph loop: fewer repetitions under --quick
    cpu_only: bool = False
    valid_steps_only: bool = False  # the correctness guard compares only the unpadded steps
    note: str = ""

    @staticmethod
    def available(threads: int) -> Optional[str]:
        """None if the implementation can run in this process, else why not."""
        return None

    @classmethod
    def cannot_express(cls, w: Workload, cell: str) -> Optional[str]:
        """Why this implementation cannot compute the case (None when it can)."""
        return None

    def __init__(self, ours: torch.nn.Module, w: Workload, cell: str, inputs: Inputs):
        self.w, self.cell, self.inputs = w, cell, inputs

    def prepare(self, mode: str) -> None:
        """Put the implementation in the state its timed call for `mode` expects."""

    def infer(self):
        raise NotImplementedError

    def train_step(self) -> None:
        raise NotImplementedError

    def output(self) -> torch.Tensor:
        self.prepare("forward")
        return self.infer().detach().cpu()


class _TorchModule(Implementation):
    """Shared by ours and torch.nn: a torch module run on x [B, T, I] (input grad via a leaf copy)."""

    def __init__(self, module, w, cell, inputs):
        super().__init__(module, w, cell, inputs)
        self.module = module
        self.x_grad = inputs.x.detach().clone().requires_grad_(True)
        self.params = [p for p in module.parameters() if p.requires_grad]

    def prepare(self, mode):
        self.module.train(mode != "forward")

    def _grads(self, loss):
        torch.autograd.grad(loss, [self.x_grad] + self.params)


class Ours(_TorchModule):
    name = "cudnn_rnn"

    def __init__(self, ours, w, cell, inputs):
        super().__init__(ours, w, cell, inputs)
        self.mask = inputs.mask

    def infer(self):
        with torch.no_grad():
            return self.module(self.inputs.x, mask=self.mask)

    def train_step(self):
        self._grads(self.module(self.x_grad, mask=self.mask).sum())


def _torch_nn_cannot_express(w: Workload, cell: str) -> Optional[str]:
    if cell == "gru" and not w.reset_after:
        return "cannot express GRU reset_after=False"
    if w.recurrent_dropout:
        return "cannot express recurrent_dropout"
    return None


class TorchNN(_TorchModule):
    """torch.nn.LSTM / GRU / RNN (our layer's .to_torch()) on the padded batch; on a padded
    workload it computes over the padding (its outputs on the real steps equal ours)."""

    name = "torch.nn"

    @classmethod
    def cannot_express(cls, w, cell):
        return _torch_nn_cannot_express(w, cell)

    def __init__(self, ours, w, cell, inputs):
        super().__init__(ours.to_torch(), w, cell, inputs)
        if inputs.lengths is not None:
            self.name, self.note, self.valid_steps_only = "torch.nn padded", "computes over the padding", True

    def infer(self):
        with torch.no_grad():
            return self.module(self.inputs.x)[0]

    def train_step(self):
        self._grads(self.module(self.x_grad)[0].sum())


class TorchNNPacked(_TorchModule):
    """torch.nn through a PackedSequence (padded workloads only): only the real steps are
    computed. Timed calls include pack_padded_sequence (and pad_packed_sequence for inference)."""

    name = "torch.nn packed"
    valid_steps_only = True

    @classmethod
    def cannot_express(cls, w, cell):
        return _torch_nn_cannot_express(w, cell)

    def __init__(self, ours, w, cell, inputs):
        super().__init__(ours.to_torch(), w, cell, inputs)
        self.lengths = inputs.lengths.cpu()

    def _pack(self, x):
        return pack_padded_sequence(x, self.lengths, batch_first=True, enforce_sorted=False)

    def infer(self):
        with torch.no_grad():
            y, _ = self.module(self._pack(self.inputs.x))
            return pad_packed_sequence(y, batch_first=True, total_length=self.w.T)[0]

    def train_step(self):
        y, _ = self.module(self._pack(self.x_grad))
        self._grads(y.data.sum())


# -- Keras ------------------------------------------------------------------------------------
def _keras_layer_kwargs(side, cell: str) -> Dict:
    """Constructor arguments of the Keras layer equivalent to one side of our layer (Keras 3
    and tf_keras spell them alike; without Keras 3's seed, which tf_keras does not take)."""
    return dict(side.keras_config(keras2=True), return_sequences=True, return_state=False, stateful=False)


def build_keras_stack(layers_module, ours, cell: str) -> List:
    """Keras layers (one per layer of our stack, Bidirectional-wrapped where ours is) carrying
    our weights. `layers_module` is keras.layers (Keras 3) or tf_keras.layers."""
    cls = {"lstm": layers_module.LSTM, "gru": layers_module.GRU, "simple_rnn": layers_module.SimpleRNN}[cell]
    sides = _sides(ours)
    first = sides[0]
    stack = []
    for l in range(first.num_layers):
        made = [cls(**_keras_layer_kwargs(side, cell)) for side in sides]
        width = first.input_size if l == 0 else len(sides) * first.units
        if len(sides) == 2:
            layer = layers_module.Bidirectional(made[0], backward_layer=made[1], merge_mode="concat")
            layer.build((None, None, width))
            targets = [layer.forward_layer, layer.backward_layer]
        else:
            layer = made[0]
            layer.build((None, None, width))
            targets = [layer]
        for target, side in zip(targets, sides):
            target.set_weights([_np(w) for w in side.layer_weights(l)])
        stack.append(layer)
    return stack


def _import_keras3():
    if importlib.util.find_spec("keras") is None:
        raise Unavailable("keras is not installed")
    os.environ.setdefault("KERAS_BACKEND", "torch")
    os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")  # a CPU peer, also on a machine with a GPU
    import keras

    if keras.backend.backend() != "torch":
        raise Unavailable(f"Keras 3 runs on the {keras.backend.backend()!r} backend here (KERAS_BACKEND=torch is "
                          "needed before keras is first imported)")
    return keras


def _why_not(load, *args) -> Optional[str]:
    """None if load(*args) succeeds, else the reason it raised Unavailable."""
    try:
        load(*args)
    except Unavailable as e:
        return str(e)
    return None


class Keras3(Implementation):
    """keras.layers.LSTM/GRU/SimpleRNN on the torch backend, called eagerly (Keras 3's torch
    backend runs recurrent layers as a Python loop over timesteps on CPU)."""

    name = "keras3 (torch)"
    slow = True
    cpu_only = True

    @staticmethod
    def available(threads: int) -> Optional[str]:
        """None if Keras 3 runs on the torch backend in this process, else why not."""
        return _why_not(_import_keras3)

    def __init__(self, ours, w, cell, inputs):
        super().__init__(ours, w, cell, inputs)
        keras = _import_keras3()
        self.stack = build_keras_stack(keras.layers, ours, cell)
        self.x_grad = inputs.x.detach().clone().requires_grad_(True)
        self.params = [v.value for layer in self.stack for v in layer.trainable_weights]

    def _run(self, x, training):
        h = x
        for layer in self.stack:
            h = layer(h, mask=self.inputs.mask, training=training)
        return h

    def infer(self):
        with torch.no_grad():
            return self._run(self.inputs.x, False)

    def train_step(self):
        torch.autograd.grad(self._run(self.x_grad, True).sum(), [self.x_grad] + self.params)


_TF = {}


def configure_tf(threads: Optional[int] = None):
    """Imports tensorflow and tf_keras (after torch) and sets TF's thread pools: `threads`
    intra-op threads, one inter-op thread. The first call (with `threads`) must come before any
    TF op; later calls return the same modules."""
    if "tf" not in _TF:
        if threads is None:
            raise RuntimeError("configure_tf(threads) must be called before the first TF peer is built")
        for name in ("tensorflow", "tf_keras"):
            if importlib.util.find_spec(name) is None:
                raise Unavailable(f"{name} is not installed (pip install -r requirements-bench.txt, or "
                                  "CUDNN_RNN_BENCH=1 bash scripts/env.sh ...)")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TF's C++ start-up chatter
        if importlib.util.find_spec("triton") is not None:
            # torch's triton (which Keras 3's torch backend loads) segfaults when its native
            # library is loaded after TensorFlow's; loaded first, both work in one process.
            import triton  # noqa: F401
        import tensorflow as tf
        import tf_keras

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.set_visible_devices([], "GPU")  # the TF peer is a CPU peer
        _TF.update(tf=tf, tf_keras=tf_keras)
    return _TF["tf"], _TF["tf_keras"]


class TFKeras(Implementation):
    """tf_keras.layers.LSTM/GRU/SimpleRNN (Keras 2 on TensorFlow, CPU) inside tf.function, as
    Keras 2's predict/fit run them; the training step takes the gradients with a GradientTape."""

    name = "tf_keras"
    slow = True
    cpu_only = True

    @staticmethod
    def available(threads: int) -> Optional[str]:
        """None if tensorflow and tf_keras import here (then configured for `threads`), else why not."""
        return _why_not(configure_tf, threads)

    def __init__(self, ours, w, cell, inputs):
        super().__init__(ours, w, cell, inputs)
        tf, tf_keras = configure_tf()
        self.stack = build_keras_stack(tf_keras.layers, ours, cell)
        self.x = tf.constant(_np(inputs.x))
        self.mask = None if inputs.mask is None else tf.constant(_np(inputs.mask))
        variables = [v for layer in self.stack for v in layer.trainable_weights]

        def run(x, training):
            h = x
            for layer in self.stack:
                h = layer(h, mask=self.mask, training=training)
            return h

        @tf.function
        def infer(x):
            return run(x, False)

        @tf.function
        def train_step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(run(x, True))
            return tape.gradient(loss, [x] + variables)

        self._infer, self._train_step = infer, train_step

    def infer(self):
        return self._infer(self.x)

    def train_step(self):
        self._train_step(self.x)

    def output(self):
        return torch.from_numpy(self.infer().numpy())


# The peers of a case, in table order, by --peers name.
PEERS: Dict[str, List[Type[Implementation]]] = {
    "torch": [TorchNN, TorchNNPacked],
    "keras3": [Keras3],
    "tf_keras": [TFKeras],
}


def peer_classes(w: Workload, selected: List[str]) -> List[Type[Implementation]]:
    """The peer implementations of a workload: torch.nn padded and packed on padded workloads
    (plain torch.nn otherwise), then the Keras peers, restricted to `selected` keys."""
    out = []
    for key in selected:
        for cls in PEERS[key]:
            if cls is TorchNNPacked and w.lengths is None:
                continue
            out.append(cls)
    return out


def display_name(cls: Type[Implementation], w: Workload) -> str:
    """The row label of an implementation on a workload (before it is built)."""
    if cls is TorchNN and w.lengths is not None:
        return "torch.nn padded"
    return cls.name


def check_same(ours_out: torch.Tensor, peer: Implementation, peer_out: torch.Tensor, case: str,
               atol: float, rtol: float) -> None:
    """The correctness guard: raises PeerMismatch unless the peer's inference output matches
    ours (on the real steps only where the peer pads differently)."""
    if peer_out.shape != ours_out.shape:
        raise PeerMismatch(f"{peer.name} on {case}: output shape {tuple(peer_out.shape)}, ours {tuple(ours_out.shape)}")
    a, b = peer_out.float(), ours_out.float()
    if peer.valid_steps_only and peer.inputs.mask is not None:
        valid = peer.inputs.mask.cpu()
        a, b = a[valid], b[valid]
    try:
        torch.testing.assert_close(a, b, atol=atol, rtol=rtol)
    except AssertionError as e:
        raise PeerMismatch(f"{peer.name} computes a different function from cudnn_rnn on {case}:\n{e}") from None

