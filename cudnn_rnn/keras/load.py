"""load_keras and rebuild: a parsed checkpoint -> the layer modules -> one KerasModel, checked.

What comes out has been validated as a whole before it is returned: every layer's config values
(types and ranges) and weight shapes when its builder runs, the graph when it is scheduled, and
then the model is run once on inputs of its declared shape (free time dimensions 8, then 128
and 1024 steps: check_runs), so that a model that loads also runs. Any failure on the way, whatever raised it, is one ConversionError
naming the file and the layer.
"""
from __future__ import annotations

import math
import os
from typing import Callable, Mapping, Optional, Union

import numpy as np
import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode,
                                           UnsupportedOperatorException)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from .layers import BUILDERS
from .files.containers import load_json, open_keras_file
from .layers.custom import custom_builders, find_builder, short_name
from .errors import ConversionError
from .graph.spec import ModelSpec, parse_model
from .graph.model import KerasModel, LayerFailure, NestedModel, module_key
from .layers.ops import OP_CLASSES, build_op
from .layers.quantized import policy_mode, unsupported
from .layers.registry import REFUSED, BuildContext, dtype_name, holds_weights, keras_major
from .files.weights import LegacySource, RecordingSource, ReplaySource, WeightSource, weight_source

BACKENDS = ("tensorflow", "jax", "torch")


def load_keras(path: Union[str, os.PathLike], architecture: Optional[Union[str, dict]] = None,
               dtype: Optional[torch.dtype] = None,
               progress: Optional[Callable] = None,
               custom_layers: Optional[Mapping[str, Callable]] = None,
               backend: Optional[str] = None) -> KerasModel:
    """A torch module computing what the Keras model in ``path`` computes.

    Nothing from TensorFlow or Keras is needed, and nothing is unpickled: a file that cannot be
    converted, hostile ones included, raises one :class:`ConversionError` naming the file, the
    layer and what was expected (docs/guides/untrusted-files.md).

    Args:
        path (str or os.PathLike): a ``.keras`` archive (or Keras 3's unzipped model
            directory), a full-model legacy ``.h5``, tf.keras 2's SavedModel directory, or
            weights only (``.weights.h5``, a sharded ``.weights.json``, legacy weights ``.h5``, a
            TensorFlow checkpoint's prefix or ``.index``) with ``architecture``.
        architecture (str or dict, optional): for a weights-only file: a ``.keras`` / full ``.h5``
            file or SavedModel directory, a ``.json`` file ``model.to_json()`` wrote, a model config dict
            (``model.get_config()`` wrapped as ``{"class_name", "config"}``) or a JSON string of
            it. The Keras version it records
            (``keras_version``) decides the layers' defaults and activations. Default: ``None``.
        dtype (torch.dtype, optional): of the converted parameters. Default: ``None``, the
            model's own: ``torch.float64`` where every layer that declares a floating dtype
            declares float64 (``keras.config.set_floatx("float64")``), else ``torch.float32`` (mixed
            precision policies included). Floating inputs are cast to it on the way in, as
            Keras casts them to each layer's compute dtype.
        progress (callable, optional): ``progress(i, n, layer_name)`` called as layers are
            converted. Default: ``None``.
        custom_layers (dict, optional): the model's own layer classes by class name, each a
            ``builder(config, weights) -> torch.nn.Module`` (docs/guides/keras.md, "Custom
            layers"). Default: ``None``.
        backend (str, optional): the backend of the Keras that wrote the file, ``"tensorflow"``,
            ``"jax"`` or ``"torch"``, where the file does not record it (a Keras 3 ``.keras`` or
            ``.weights.h5``). A few computations differ between Keras's backends and follow it:
            bicubic resizes and ``sobel_edges`` (docs/guides/keras.md). Default: ``None``, the
            file's own record; where there is none, torch's bicubic resize and TensorFlow's
            ``sobel_edges``.

    Returns:
        KerasModel: a ``torch.nn.Module`` whose ``forward(*inputs)`` takes the Keras model's
        inputs (a tensor or list of tensors out, as Keras returns them). It keeps
        ``keras_config``, ``keras_version`` (for :func:`save_keras` and the CLI) and
        ``keras_weights`` (the arrays as read, by layer, in Keras order).

    Raises:
        ConversionError: for a file that cannot be converted (the only exception it raises for
            a file's content).

    Example:
        >>> model = cudnn_rnn.load_keras("examples/sentiment.h5")
        >>> model(torch.randint(1, 50, (2, 20))).shape
        torch.Size([2, 3])
    """
    kf = open_keras_file(path)
    config, version, backend, asked = kf.config, kf.keras_version, kf.backend, backend
    if architecture is not None:
        # the Keras that wrote the architecture defines its layers' defaults and activations
        # (a .weights.h5 records no version at all)
        config, arch_version, arch_backend, arch_assets = _architecture_config(architecture, kf.path)
        version, backend = arch_version or version, backend or arch_backend
        # a weights file keeps no vocabularies: the lookup layers read the architecture's .keras
        kf.assets = kf.assets or arch_assets
    if config is None:
        raise ConversionError(kf.path, "holds weights only; pass architecture= (a .keras / .h5 model file or a config)")
    if backend is None and keras_major(version) == 2:  # Keras 2.3+ and tf.keras run on TensorFlow only
        backend = "tensorflow"
    if asked is not None:
        if asked not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {asked!r}")
        if backend is not None and backend != asked:
            raise ConversionError(kf.path, f"records that Keras on {backend} wrote it; backend={asked!r} says otherwise")
        backend = asked
    if keras_major(version) < 2:  # per-gate weights (W_i, U_i, ...), output_dim, inner_activation
        raise ConversionError(kf.path, f"was saved by Keras {str(version)[:20]}; Keras 1 files are not supported "
                                       "(Keras 2 and 3 are: load the model in Keras 2 and save it again)")
    custom = custom_builders(custom_layers)
    with _boundary(kf.path):
        if isinstance(config, dict) and "class_name" not in config and "config" not in config and "layers" in config:
            config = {"class_name": "Functional" if "input_layers" in config else "Sequential", "config": config}
        spec = parse_model(config, kf.path)
        _check_classes(spec, custom, kf.path)
        dtype = dtype or _declared_dtype(spec)
        source = weight_source(kf, spec)
        if isinstance(source, LegacySource) and kf.config is None:
            # (Keras's own order: the layers that hold weights; recorded operations are not layers)
            source.match_by_order([l.name for l in spec.layers if not _is_op(l, custom) and (
                l.model is not None or find_builder(l.class_name, {}, custom) is not None or holds_weights(l.class_name, l.config))])
        records: dict = {}
        model = _build(spec, kf.path, version, RecordingSource(source, records), dtype, spec.name, progress, custom,
                       backend)
        model.keras_config, model.keras_version, model.keras_weights = config, version, records
        model.keras_backend = backend
        return _saved_states(check_runs(model.eval(), kf.path), kf.layer_states, kf.path)


def _saved_states(model: KerasModel, states: dict, where) -> KerasModel:
    """A tf.keras SavedModel's stateful recurrent layers start from the states they had when it
    was saved, as tf.keras's loaded model does on its first call (other files keep no states);
    model.reset_states() zeroes them, as Keras's reset_states does. `states`: by layer path
    ("lstm", or "inner_model/lstm" in a nested model), the (state path, array) pairs; kept as
    model.keras_states (save_converted writes them)."""
    model.keras_states = states
    for name, pairs in states.items():
        module, inner = model, name.split("/")
        for part in inner:  # (through nested models)
            owner = module.model if isinstance(module, NestedModel) else module
            layers = getattr(owner, "layers", None)
            module = layers[module_key(part)] if isinstance(layers, torch.nn.ModuleDict) and \
                module_key(part) in layers else None
        restore = getattr(module, "load_keras_states", None)
        if restore is None:
            continue  # (a layer that keeps no states here: nothing to restore)
        try:
            restore({path: torch.as_tensor(np.asarray(array)) for path, array in pairs}, _declared_batch(model))
        except ValueError as e:
            raise ConversionError(where, f"its saved states do not fit the layer: {str(e)[:300]}", name) from None
    return model


def _declared_batch(model: KerasModel) -> Optional[int]:
    """The batch size the model's inputs declare (a stateful model declares one), else None."""
    return next((shape[0] for _, shape in model.input_specs if shape and shape[0] is not None), None)


def rebuild(config: dict, keras_version: Optional[str], keras_weights: dict, dtype: torch.dtype = torch.float32,
            where: str = "<converted>", custom_layers: Optional[Mapping[str, Callable]] = None,
            keras_backend: Optional[str] = None, keras_states: Optional[dict] = None) -> KerasModel:
    """The model load_keras built, from what it recorded (config, version, backend, weights, kept
    states); the same custom_layers builders as load_keras was given, if any."""
    custom = custom_builders(custom_layers)
    with _boundary(where):
        spec = parse_model(config, where)
        _check_classes(spec, custom, where)
        model = _build(spec, where, keras_version, ReplaySource(keras_weights, where), dtype, spec.name, None, custom,
                       keras_backend)
        model.keras_config, model.keras_version, model.keras_weights = config, keras_version, keras_weights
        model.keras_backend = keras_backend
        return _saved_states(check_runs(model.eval(), where), keras_states or {}, where)


class _boundary:
    """Turns whatever a malformed config makes a builder raise into ConversionError."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if error is None or isinstance(error, ConversionError) or not isinstance(error, Exception):
            return False
        if isinstance(error, MemoryError):
            raise ConversionError(self.path, "converting it ran out of memory") from None
        if isinstance(error, RecursionError):
            raise ConversionError(self.path, "its model config nests too deeply") from None
        raise ConversionError(self.path, f"the model config cannot be converted ({type(error).__name__}: "
                                         f"{str(error)[:300]})") from None


MAX_CHECK_VALUES = 1 << 24   # per sample: a declared input larger than this is refused
ONE_SAMPLE_VALUES = 1 << 20  # beyond this the trial run uses a batch of one
TRIAL_TENSOR_BYTES = 1 << 28  # the trial run makes no tensor larger than this (256 MiB)


class _TooLarge(Exception):
    def __init__(self, func, shape, nbytes):
        super().__init__(f"{func} would make a {nbytes / (1 << 20):.0f} MiB tensor of shape {list(shape)}")


class _TrialBudget(TorchDispatchMode):
    """Every op of the trial run first runs on meta tensors (shapes only, no memory); an output
    above TRIAL_TENSOR_BYTES stops the run before anything is allocated. The declared shapes
    come from the file: a few KB of config can declare a time axis whose attention scores or
    embedding output take tens of GiB (this package's ops too: their Meta kernels are their fake
    impls). An op without a meta kernel or whose output shape depends on the data just runs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            out = func(*tree_map(_meta, args), **tree_map(_meta, kwargs))
        except Exception:  # noqa: BLE001 - no meta kernel, or a data-dependent shape
            out = None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.numel() * t.element_size() > TRIAL_TENSOR_BYTES:
                raise _TooLarge(func, t.shape, t.numel() * t.element_size())
        return func(*args, **kwargs)


def _meta(x):
    """x on the meta device: tensors (same shape, strides and dtype) and device arguments."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="meta")
    return torch.device("meta") if isinstance(x, torch.device) else x


def _trial(model: KerasModel, inputs, path) -> None:
    """One run of the model, its tensors held to TRIAL_TENSOR_BYTES; past that, a run on fake
    tensors (shapes only: the inputs are made fake, as an op whose inputs are all real would run
    for real under the fake mode; the parameters stay real, and an op reading nothing else is as
    large as they are). A model the fake run cannot take (an op's shape depends on the data) is
    refused."""
    def run(xs):  # a layer's failure comes out naming the layer, except the budget's own
        try:
            model.forward_with_masks(*xs, name_failures=True)
        except LayerFailure as failure:
            if isinstance(failure.error, (_TooLarge, DataDependentOutputException, DynamicOutputShapeException,
                                          UnsupportedOperatorException)):
                raise failure.error from None
            raise

    with torch.no_grad():
        try:
            with _TrialBudget():
                run(inputs)
        except _TooLarge as large:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            try:
                with mode:
                    run([mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs])  # (strings)
            except (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException):
                shapes = [tuple(shape) for _, shape in model.input_specs]
                raise ConversionError(path, f"cannot be checked on inputs of its declared shape {shapes}: "
                                            f"{large} (limit {TRIAL_TENSOR_BYTES >> 20} MiB)") from None


_MAX_PINNED = 4  # batch sizes (and lengths) tried beyond the usual ones


def _written_shapes(spec: ModelSpec) -> list:
    """(value, whether it is a reshape's target) for every shape-like list an operation of the
    graph writes with the batch first: an operation's newshape / shape, a tf.keras TFOpLambda's
    list arguments (tf.reshape(x, (4, -1)), a constant array), a TensorFlowOpLayer's constants."""
    found = []
    for layer in _all_layers(spec):
        if layer.is_op:
            found.extend((layer.config.get(key), layer.class_name == "Reshape") for key in ("newshape", "shape"))
        elif layer.class_name == "TFOpLambda" and layer.calls:
            reshape = "reshape" in str(layer.config.get("function"))
            found.extend((value, reshape) for value in [*layer.calls[0].constants, *layer.calls[0].kwargs.values()])
        elif layer.class_name == "TensorFlowOpLayer" and isinstance(layer.config.get("constants"), dict):
            node = layer.config.get("node_def")
            reshape = isinstance(node, dict) and node.get("op") == "Reshape"
            found.extend((value, reshape) for value in layer.config["constants"].values())
    return [(value, reshape) for value, reshape in found if isinstance(value, list) and value]


def _sizes(values, limit: int) -> list:
    """The distinct ints of values in 1..4096, at most limit of them, in order."""
    out = []
    for size in values:
        if isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= 4096 and size not in out:
            out.append(size)
    return out[:limit]


def _pinned_batches(model: KerasModel) -> list:
    """The batch sizes a model may run at only, tried when it does not run at the usual one: the
    batch its inputs declare (batch_shape), the leading size of a constant array an operation
    reads (x + np.ones((4, 3)), a batch of affine transforms) and the first size of a shape an
    operation writes (ops.reshape(x, (4, -1)), ops.full((4, 3), v); tf.keras's tf.reshape and
    constant arguments alike). Keras runs such a model at that batch; at most _MAX_PINNED of them,
    in that order."""
    sizes = [shape[0] for _, shape in model.input_specs if shape and shape[0] is not None]
    sizes += [b.shape[0] for b in _constant_arrays(model) if b.dim() >= 2]
    for value, _ in _written_shapes(model.spec):  # a shape's first size, a nested constant's length
        sizes.append(len(value) if isinstance(value[0], list) else value[0])
    return _sizes(sizes, _MAX_PINNED)


def _reshape_targets(spec: ModelSpec) -> list:
    """The shapes past the batch that the graph's reshapes write: Reshape layers' target_shape,
    reshape operations' and recorded TensorFlow reshapes' shapes."""
    return [list(layer.config.get("target_shape") or []) for layer in _all_layers(spec)
            if layer.class_name == "Reshape" and not layer.is_op] + \
        [value[1:] for value, reshape in _written_shapes(spec) if reshape]


def _constant_arrays(model: KerasModel) -> list:
    """The constant arrays the graph's operations read (their buffers)."""
    from .layers.ops import Op

    return [b for module in model.modules() if isinstance(module, Op)
            for name, b in module.named_buffers(recurse=False) if name.startswith("constant_")]


def _pinned_lengths(model: KerasModel) -> list:
    """The lengths a model whose inputs leave the time free may run at only (Input((None, 4))
    then Reshape((10, 4)) or Reshape((5, 8)), ops.reshape(x, (-1, 10, 4))): the length that gives
    an input with one free dimension the count of values of a reshape's target past the batch,
    then the target's sizes. Keras runs such a model at that length; at most _MAX_PINNED."""
    targets = _reshape_targets(model.spec)
    whole, each = [], []  # (the lengths that keep the batch first: a -1 batch takes the others too)
    for dims in targets:
        if not 0 < len(dims) <= 8 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1 << 24
                                             for d in dims):
            continue  # a -1 (or None) takes any length
        each += dims
        total = math.prod(dims)
        for _, shape in model.input_specs:
            fixed = math.prod(d for d in shape[1:] if d is not None)
            if list(shape[1:]).count(None) == 1 and total % fixed == 0:
                whole.append(total // fixed)
    return _sizes(whole + each, _MAX_PINNED)


def _constant_lengths(model: KerasModel) -> list:
    """The lengths a constant array an operation reads may hold a free time axis to (the token
    embeddings plus an Embedding of ops.arange(20)): its sizes but the last; at most _MAX_PINNED."""
    return _sizes([size for b in _constant_arrays(model) for size in b.shape[:-1]], _MAX_PINNED)


def _multiple_lengths(model: KerasModel) -> list:
    """Lengths for a model whose free time axis a reshape splits into fixed pieces (raw samples
    framed by Reshape((-1, 160)), ops.reshape(x, (2, -1, 3))): a reshape target with one -1 and
    sizes of n values in all takes an input with one free dimension at the lengths that give a
    multiple of n values; the smallest such length from 8, 128 and 1024 on. The model keeps its
    free length (any multiple runs)."""
    targets = _reshape_targets(model.spec)
    out = []
    for dims in targets:
        known = [d for d in dims if d != -1]
        if dims.count(-1) != 1 or not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1 << 24
                                          for d in known):
            continue
        total = math.prod(known)
        for _, shape in model.input_specs:
            if list(shape[1:]).count(None) != 1:
                continue
            step = total // math.gcd(total, math.prod(d for d in shape[1:] if d is not None))
            out += [-(-start // step) * step for start in (8, 128, 1024)]
    return list(dict.fromkeys(t for t in out if t <= 1 << 20))[:3 * _MAX_PINNED]


# Lengths tried, beyond 1024 steps, for a model whose failing layer needs a minimum length (a
# valid convolution or pooling over raw samples, a spectrogram's window): the model keeps its free
# length.
_LONG_LENGTHS = (4096, 16384, 65536)
_NEEDS_LENGTH = ("Conv", "Pool", "Spectrogram", "Stft", "Cropping", "LocallyConnected", "Pad", "Sequences")


def _needs_length(spec: ModelSpec, layer: Optional[str]) -> bool:
    """Whether the layer a trial failed in (its path: nested models' names first) is one that
    needs a minimum length (its class name: a convolution, a pooling, a spectrogram, a crop, a
    padding)."""
    if layer is None:
        return False
    *outer, name = layer.split("/")
    for part in outer:
        nested = next((layer.model for layer in spec.layers if layer.name == part and layer.model is not None), None)
        if nested is None:
            return False
        spec = nested
    kind = next((layer.class_name for layer in spec.layers if layer.name == name), "")
    return any(word in kind for word in _NEEDS_LENGTH)


def _all_layers(spec: ModelSpec) -> list:
    """The layers of spec and of the models nested in it."""
    return [inner for layer in spec.layers
            for inner in (_all_layers(layer.model) if layer.model is not None else [layer])]


def check_runs(model: KerasModel, path) -> KerasModel:
    """Runs the model once on inputs of its declared shapes; a model that cannot is refused.
    An input without a declared shape gets the one its first layer implies.
    Free time dimensions get 8 steps, then 128 and 1024 (convolutions and pooling need a
    minimum length), then the lengths a reshape's target holds them to (_pinned_lengths: the
    model then declares that length), the multiples a reshape splits them into
    (_multiple_lengths: the length stays free), the lengths a constant array holds them to
    (_constant_lengths: declared) and, where the layer that failed at 1024 steps needs a minimum
    length, 4096 to 65536 steps (free; each checked on shapes alone first: _shapes_fit), before
    the model is declared broken (_trial: how a run that would
    make a tensor above TRIAL_TENSOR_BYTES is checked instead); at each, a batch of 2 (1 for large
    samples), then the batch sizes the model may hold to (_pinned_batches)."""
    model.input_specs = [declared if declared[1] else _implied_input(model, ref, declared, path)
                         for ref, declared in zip(model.spec.inputs, model.input_specs)]
    failures, pinned = [], None  # failures: (steps, error type, message, failing layer or None); no tensors kept

    def runs_at(time: int, declare: bool) -> bool:
        """Whether the model runs with free dimensions of `time` steps (and then keeps the batch it
        ran at; with `declare`, its inputs declare that length)."""
        nonlocal pinned
        sizes = [int(np.prod([time if d is None else d for d in shape[1:]], dtype=np.int64))
                 for _, shape in model.input_specs]
        if max(sizes, default=0) > MAX_CHECK_VALUES:
            if not failures and time == 8:
                raise ConversionError(path, f"declares inputs of {max(sizes)} values per sample (limit {MAX_CHECK_VALUES})")
            return False
        usual = 2 if max(sizes, default=0) <= ONE_SAMPLE_VALUES else 1
        batches = [usual]
        while batches:
            batch = batches.pop(0)
            try:
                inputs = model.example_inputs(batch=batch, time=time)
                if time > 1024:  # a long run: first its shapes alone, where a layer that needs length refuses
                    _shapes_fit(model, inputs)
                _trial(model, inputs, path)
                model.batch_size = None if batch == usual else batch
                if declare:  # the graph holds the time to this length: the inputs declare it
                    model.input_specs = [(dtype, [shape[0]] + [time if d is None else d for d in shape[1:]])
                                         for dtype, shape in model.input_specs]
                if model.has_free_length():
                    model.trial_length = time
                return True
            except ConversionError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure means the config and weights disagree
                failures.append((time, type(e).__name__, str(e), e.layer if isinstance(e, LayerFailure) else None))
            finally:  # the trial run leaves nothing behind in stateful layers
                model.reset_states()
            if batch == usual:  # then the batch sizes the model may hold to
                pinned = _pinned_batches(model) if pinned is None else pinned
                batches = [b for b in pinned if b != usual]
        return False

    def failed_in(time: int) -> Optional[str]:
        return next((layer for t, _, _, layer in failures if t == time), None)

    if not model.has_free_length():
        if runs_at(8, False):
            return model
    else:
        first = [8, 128, 1024]
        if any(runs_at(time, False) for time in first):
            return model
        # the lengths a reshape holds the time to (declared), the multiples a reshape splits it
        # into, the lengths constant arrays hold (declared), then long ones where the layer that
        # failed at 1024 steps needs a minimum length
        held = [t for t in _pinned_lengths(model) if t not in first]
        multiples = [t for t in _multiple_lengths(model) if t not in first + held]
        constants = [t for t in _constant_lengths(model) if t not in first + held + multiples]
        longer = [t for t in _LONG_LENGTHS if t not in held + multiples + constants] \
            if _needs_length(model.spec, failed_in(1024)) else []
        if any(runs_at(time, True) for time in held) or any(runs_at(time, False) for time in multiples) or \
                any(runs_at(time, True) for time in constants) or any(runs_at(time, False) for time in longer):
            return model
    _, kind, message, layer = failures[0]
    shapes = [tuple(shape) for _, shape in model.input_specs]
    if model.has_free_length():
        tried = list(dict.fromkeys(t for t, *_ in failures))
        shapes = f"{shapes} at {', '.join(map(str, tried[:-1]))} or {tried[-1]} steps" if len(tried) > 1 else shapes
    if layer is not None:
        raise ConversionError(path, f"the converted model does not run on inputs of its declared shape {shapes}: "
                                    f"the layer raised {message[:300]} (its config and weights disagree, or it is "
                                    "called in a way this converter does not run)", layer)
    raise ConversionError(path, f"the converted model does not run on inputs of its declared shape {shapes} "
                                f"({kind}: {message[:300]}); the config and the weights disagree")


def _shapes_fit(model: KerasModel, inputs) -> None:
    """Raises where a run on fake tensors (shapes only: nothing is computed) fails in a layer that
    needs a minimum length (_needs_length): a long trial of a model too short anyway stops before
    its recurrent layers run for real. Any other outcome leaves the decision to the real run."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with torch.no_grad(), mode:
            model.forward_with_masks(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs],
                                     name_failures=True)
    except LayerFailure as failure:
        shapeless = (DataDependentOutputException, DynamicOutputShapeException, UnsupportedOperatorException)
        if _needs_length(model.spec, failure.layer) and not isinstance(failure.error, shapeless):
            raise LayerFailure(failure.layer, failure.error.with_traceback(None)) from None
    except Exception:  # noqa: BLE001 - the real run decides
        pass
    finally:
        model.reset_states()


def _is_op(layer, custom: Mapping[str, Callable]) -> bool:
    """A Keras 3 operation rather than a layer. Legacy .h5 configs drop the module that says so,
    and the config test (no `trainable`) also fits a custom layer whose get_config skipped
    super(): there, only the operation classes recorded_ops knows count, and never a class the
    user gave a builder for."""
    if not layer.is_op or find_builder(layer.class_name, {}, custom) is not None:
        return False
    return bool(layer.module) or layer.class_name in OP_CLASSES


def _check_classes(spec: ModelSpec, custom: Mapping[str, Callable], path) -> None:
    """One error naming every layer class (and where it is) that nothing here can build."""
    missing: dict = {}

    def walk(s: ModelSpec, where: str):
        for layer in s.layers:
            if layer.model is not None:
                walk(layer.model, f"{where}/{layer.name}")
            elif not _is_op(layer, custom) and find_builder(layer.class_name, BUILDERS, custom) is None:
                missing.setdefault(layer.class_name[:100], []).append((f"{where}/{layer.name}"[:200], layer.name))

    walk(spec, spec.name)
    if missing:
        listed = "; ".join(f"{cls} (at {', '.join(p for p, _ in places[:3])}{', ...' if len(places) > 3 else ''}"
                           f"{': ' + REFUSED[cls] if cls in REFUSED else ''})"
                           for cls, places in list(missing.items())[:10])
        example, places = next(iter(missing.items()))
        example = short_name(example)
        only = places[0][1] if len(missing) == 1 and len(places) == 1 else None
        raise ConversionError(path, f"layer class{'es' if len(missing) > 1 else ''} not supported: {listed}. A model's "
                                    f"own classes can be given builders: load_keras(..., custom_layers="
                                    f"{{{example!r}: builder}}) (docs/guides/keras.md: Custom layers)", only)


def _declared_dtype(spec: ModelSpec) -> torch.dtype:
    """float64 where every layer (nested models included; not the inputs, whose dtype is the
    data's) that declares a floating dtype declares float64, else float32."""
    names = []

    def walk(s: ModelSpec):
        for layer in s.layers:
            if layer.model is not None:
                walk(layer.model)
            elif layer.class_name != "InputLayer" and not layer.is_op and isinstance(layer.config, dict):
                d = dtype_name(layer.config.get("dtype"))  # (an op's dtype, Cast's, is its output's)
                if d is not None and ("float" in d or d.startswith("mixed")):  # not a lookup's int64
                    names.append(d)

    walk(spec)
    return torch.float64 if names and all(n == "float64" for n in names) else torch.float32


def _nested_builder(path: str, version, dtype, where: str, custom: Mapping[str, Callable], backend) -> Callable:
    """BuildContext.nested for a layer at `where`: a model its wrapper holds (TimeDistributed of a
    per-frame CNN), parsed, its classes checked and built like a nested model."""

    def build(serialized: dict, weights) -> NestedModel:
        spec = parse_model(serialized, path)
        _check_classes(spec, custom, path)
        return NestedModel(_build(spec, path, version, weights.child_source(spec), dtype, where, None, custom, backend))

    return build


def _build(spec: ModelSpec, path: str, version, source: WeightSource, dtype, where: str, progress,
           custom: Mapping[str, Callable], backend: Optional[str] = None) -> KerasModel:
    modules = {}
    for i, layer in enumerate(spec.layers):
        if progress is not None:
            progress(i, len(spec.layers), f"{where}/{layer.name}")
        if layer.model is not None:
            child = source.for_layer(layer).child_source(layer.model)
            modules[layer.name] = NestedModel(_build(layer.model, path, version, child, dtype, f"{where}/{layer.name}",
                                                     progress, custom, backend))
            continue
        ctx = BuildContext(path, version, layer, source.for_layer(layer), dtype,
                           nested=_nested_builder(path, version, dtype, f"{where}/{layer.name}", custom, backend),
                           backend=backend)
        if _is_op(layer, custom):
            modules[layer.name] = build_op(layer, ctx)
            continue
        _not_quantized(layer, path)
        build = find_builder(layer.class_name, BUILDERS, custom)  # _check_classes made sure there is one
        try:
            modules[layer.name] = build(layer.config, ctx)
        except ConversionError:
            raise
        except Exception as e:  # noqa: BLE001 - a config value of the wrong type or range
            raise ConversionError(path, f"{layer.class_name} config cannot be converted ({type(e).__name__}: "
                                        f"{str(e)[:300]})", layer.name) from None
    return KerasModel(spec, modules, path, [_input_spec(spec, ref, path) for ref in spec.inputs],
                      keras3=keras_major(version) >= 3, dtype=dtype)


def _not_quantized(layer, path) -> None:
    """Refuses a layer that Keras 3's quantize() turned to int8 / int4 / float8 / gptq / awq (a
    quantized dtype policy) where no builder computes that form (layers/quantized.py)."""
    mode = policy_mode(layer.config.get("dtype")) if isinstance(layer.config, dict) else None
    refused = unsupported(mode, layer.class_name) if mode is not None else None
    if refused:
        raise ConversionError(path, refused, layer.name)


def _implied_input(model: KerasModel, ref, declared: tuple, path) -> tuple:
    """The input shape a config leaves out (a Sequential built by fit; Keras 2.2's Sequential
    whose first layer is a model), from the first layer that reads the input: its weights say how
    wide the input is, or a nested model declares its input."""
    from .layers.activations import ActivationLayer
    from .layers.base import Identity
    from .layers.convolution import Convolution
    from .layers.core import Dense, Embedding, Masking
    from .layers.recurrent import CellStack, Recurrent, recurrent_layers
    from .layers.regularization import Dropout, Noise

    source = (ref.layer, ref.call)
    for _ in range(8):  # through layers that keep the shape (Masking, Dropout, Activation)
        reader = next((item for item in model.schedule if any((r[0], r[1]) == source for r in item[3])), None)
        if reader is None:
            break
        module = model.layers[reader[1]]
        rnns = recurrent_layers(module) if isinstance(module, (Recurrent, CellStack)) else []
        if rnns:
            layer = rnns[0].forward_layer if hasattr(rnns[0], "forward_layer") else rnns[0]
            return (declared[0], (None, None, layer.input_size))
        if isinstance(module, Embedding):
            return ("int32", (None, None))
        if isinstance(module, NestedModel) and len(module.model.input_specs) == 1 and module.model.input_specs[0][1]:
            return module.model.input_specs[0]
        if isinstance(module, Dense):
            return (declared[0], (None, module.kernel.shape[0]))
        if isinstance(module, Convolution) and module.kind == "conv" and module.rank == 1 and module.channels_last:
            return (declared[0], (None, None, module.weight.shape[1] * module.groups))
        if not isinstance(module, (Masking, Dropout, Noise, ActivationLayer, Identity)):
            break
        source = (reader[0], reader[2])
    raise ConversionError(path, f"input {ref.layer} has no declared shape, and its first layer does not imply one",
                          ref.layer)


def _input_spec(spec: ModelSpec, ref, path) -> tuple:
    """(Keras dtype name, batch shape with None for free dims) of one model input; the shape () where
    the config declares none (check_runs then takes the one its first layer implies). A declared
    [None] is an input of one value per example (Input(shape=()))."""
    layer = next((l for l in spec.layers if l.name == ref.layer), None)
    cfg = layer.config if layer is not None else {}
    dtype_cfg = dtype_name(cfg.get("dtype")) or "float32"
    shape = cfg.get("batch_shape") or cfg.get("batch_input_shape") or []
    if not isinstance(shape, list) or len(shape) > 8 or not all(
            d is None or (isinstance(d, int) and not isinstance(d, bool) and 0 < d <= 1 << 16) for d in shape):
        raise ConversionError(path, f"input {ref.layer} declares the shape {str(shape)[:80]}; expected a list of "
                                    "positive sizes or None", ref.layer)
    return (str(dtype_cfg), tuple(shape))


def _architecture_config(architecture, path):
    """(config, keras_version or None, backend or None, vocabulary assets) from a config dict, a
    JSON string, or a model or JSON file (the assets of a .keras one)."""
    if isinstance(architecture, str) and architecture.lstrip().startswith("{"):
        architecture = load_json(path, architecture, "the architecture JSON")
        if not isinstance(architecture, dict):
            return architecture, None, None, {}  # (parse_model says what is wrong with it)
    if isinstance(architecture, dict):
        version, backend = architecture.get("keras_version"), architecture.get("backend")
        return (architecture, version if isinstance(version, str) else None,
                backend if isinstance(backend, str) else None, {})
    if isinstance(architecture, (str, os.PathLike)):
        arch = open_keras_file(architecture, config_only=True)
        if arch.config is None:
            raise ConversionError(architecture, "has no model config to take the architecture from")
        return arch.config, arch.keras_version, arch.backend, arch.assets
    raise TypeError(f"architecture must be a path, a config dict or a JSON string; got {type(architecture).__name__}")
