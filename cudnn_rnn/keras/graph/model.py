"""A rebuilt Keras model as one torch.nn.Module: the layer modules plus a static call schedule
over the graph, with Keras's mask propagation."""
from __future__ import annotations

from collections import deque
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from ..._export_shapes import is_sequence
from ..errors import ConversionError
from .spec import EVERY_OUTPUT, ModelSpec, Ref, keras_run_order, tensor_refs
from ..errors import few


_MODULE_DICT = nn.ModuleDict()


def module_key(name: str) -> str:
    """The key of a Keras layer's module in ``KerasModel.layers``: its name, unless that holds "."
    (which a ModuleDict key may not; TensorFlow's Keras names may), or "%", is empty, or names an
    attribute of the ModuleDict ("keys", "training", "to", ...): then "%" followed by the name
    with "%" and "." percent-encoded. One to one: only such keys begin with "%"."""
    if name and "." not in name and "%" not in name and not hasattr(_MODULE_DICT, name):
        return name
    return "%" + name.replace("%", "%25").replace(".", "%2E")


def layer_name(key: str) -> str:
    """The Keras layer name of a ``KerasModel.layers`` key (module_key's inverse)."""
    return key[1:].replace("%2E", ".").replace("%25", "%") if key.startswith("%") else key


def _takes_time(j: int, size, any_length: bool, dtype: str, rank: int) -> bool:
    """Whether dimension j + 1 of a declared input shape (of `rank` dimensions with the batch)
    takes an example's length: a free one, or with any_length the second dimension of a sequence
    (is_sequence) whatever the file declares."""
    return size is None or (any_length and j == 0 and is_sequence(rank, "float" in dtype))


class KerasModel(nn.Module):
    """Runs the rebuilt graph. forward(*inputs) returns what the Keras model returns: its output
    tensor, or the outputs nested in lists and dicts as the model was built with them (a dict
    model's keys: ``output_keys``); forward_with_masks returns them as a list, in the order Keras
    flattens them (a dict's by sorted key), with the output masks.

    The inputs come as Keras takes them: one argument per input, one list of them, or one dict
    keyed by the model's input keys (``input_keys``: those of a model built on a dict, else its
    Input layers' names; keys besides them are ignored, as Keras ignores them)."""

    def __init__(self, spec: ModelSpec, modules: Dict[str, nn.Module], path: str, input_specs: List[tuple],
                 keras3: bool = False, dtype: torch.dtype = torch.float32):
        super().__init__()
        # The floating dtype the layers compute in, for a model without floating parameters (a
        # preprocessing or merge-only graph): Keras casts float16 / float64 inputs to it. A
        # zero-size buffer, so that .to() / .double() move it as they move parameters.
        self.register_buffer("compute_dtype_anchor", torch.zeros(0, dtype=dtype), persistent=False)
        self.name = spec.name
        self.spec = spec  # the parsed graph (plain data): what save_keras walks
        self.layers = nn.ModuleDict({module_key(n): m for n, m in modules.items()})
        self.input_refs = [(r.layer, r.call, r.output) for r in spec.inputs]
        self.output_refs = [(r.layer, r.call, r.output) for r in spec.outputs]
        # What a dict of inputs is keyed by (the dict's keys of a model built on one, else the
        # Input layers' names), and the keys of a dict of outputs (None: the config lists them)
        self.input_keys = list(spec.input_keys or [r.layer for r in spec.inputs])
        self.output_keys = list(spec.output_keys) if spec.output_keys else None
        self.single_output = spec.single_output and len(spec.outputs) == 1
        # what forward returns: the config's nesting of the outputs (indices into forward_with_masks'
        # list), or None for that list (a tensor where there is one)
        self.output_structure = spec.output_structure
        self.input_specs = input_specs  # (Keras dtype name, batch shape with None for free dims) per input
        # the batch size the model runs at where it runs at one only (a declared batch, a reshape or
        # a constant array that holds it: load.check_runs finds it), else None
        self.batch_size: Optional[int] = None
        # the steps the load's trial ran a free time axis at (it may run at particular lengths only)
        self.trial_length: Optional[int] = None
        self.schedule = self._schedule(spec, path)
        # per scheduled call, the inputs whose Keras mask is gone when Keras 3 runs it
        self.masks_dropped = self._masks_dropped(spec, self.schedule) if keras3 else [()] * len(self.schedule)
        self._floating = self._parameter_dtype()
        self._cast_inputs = [v is None for v in self.input_vocabularies()]
        self._entry_dtypes = [_HALF.get(dtype) for dtype, _ in input_specs]
        # per scheduled call, whether Keras casts its floating inputs to the layer's compute dtype
        # (a layer's autocast). Not: recorded operations and tf.keras's TFOpLambda, which take
        # tensors as they are; the layers that read ids (Keras converts nothing for them); nested
        # models, whose own layers (and input casts) decide
        no_autocast = {layer.name for layer in spec.layers
                       if layer.is_op or layer.class_name in _NO_AUTOCAST or layer.model is not None}
        self._autocast = [name not in no_autocast for name, *_ in self.schedule]
        # per scheduled call, whether the layer computes an integer or bool input in its floating
        # dtype (Keras's matmul and normalizations promote them: a Dense or an LSTM on int32
        # features gives float32)
        promotes = {layer.name: _promotes_integers(layer, keras3) for layer in spec.layers if not layer.is_op}
        self._promote = [promotes.get(name, _NO_PROMOTION) for name, *_ in self.schedule]
        # per scheduled call, the keywords its module takes beyond inputs and masks: which of its
        # layer's calls it runs, for a module that asks (a ReversibleEmbedding looks up on one call
        # and projects back on another)
        self._call_kwargs = [{"call": call} if getattr(self.layers[key], "takes_call", False) else {}
                             for _, key, call, *_ in self.schedule]

    @staticmethod
    def _schedule(spec: ModelSpec, path) -> List[Tuple[str, str, int, list, Optional[list]]]:
        """(layer name, module key, call index, input refs, explicit mask refs) in an order where every input
        is computed before it is read (a topological order, linear in the size of the graph)."""
        produced = {(r.layer, r.call) for r in spec.inputs}
        input_layers = {r.layer for r in spec.inputs}
        known = {layer.name for layer in spec.layers}
        items, waiting, missing = [], {}, []
        for layer in spec.layers:
            if layer.name in input_layers:
                continue
            for i, call in enumerate(layer.calls):
                initial = call.kwargs.get("initial_state")
                if initial is not None and not isinstance(initial, list):
                    raise ConversionError(path, f"call {i} has a malformed initial_state", layer.name)
                # positional tensors, initial states, then every other tensor keyword argument by name
                # (attention_layers.py: query=, value=, key=, attention_mask=)
                extra = [r for k in call.tensor_kwargs() for r in call.kwargs[k]]
                refs = list(call.inputs) + list(initial or []) + extra
                mask_refs = call.kwargs.get("mask") if isinstance(call.kwargs.get("mask"), list) else None
                needed = refs + [r for r in (mask_refs or []) if r is not None]
                for r in needed:
                    if not isinstance(r, Ref):
                        raise ConversionError(path, f"call {i} has an input that is not a tensor reference: "
                                                    f"{str(r)[:80]}", layer.name)
                    if r.layer not in known:
                        raise ConversionError(path, f"call {i} reads layer '{r.layer[:100]}', which the model does not have",
                                              layer.name)
                deps = {(r.layer, r.call) for r in needed} - produced
                for d in deps:
                    waiting.setdefault(d, []).append(len(items))
                missing.append(len(deps))
                items.append((layer.name, module_key(layer.name), i, [(r.layer, r.call, r.output) for r in refs],
                              [(r.layer, r.call, r.output) if r is not None else None for r in mask_refs]
                              if mask_refs else None))
        ready = deque(k for k, n in enumerate(missing) if n == 0)
        schedule = []
        while ready:
            k = ready.popleft()
            schedule.append(items[k])
            for j in waiting.get((items[k][0], items[k][2]), ()):
                missing[j] -= 1
                if missing[j] == 0:
                    ready.append(j)
        if len(schedule) < len(items):
            names = sorted({items[k][0] for k, n in enumerate(missing) if n > 0})
            raise ConversionError(path, f"the graph cannot be ordered: layers {few(names)} wait on inputs that never come")
        return schedule

    @staticmethod
    def _masks_dropped(spec: ModelSpec, schedule) -> List[tuple]:
        """Keras 3's MultiHeadAttention deletes the Keras masks of the tensors it reads as query,
        value and key (keras/src/layers/attention/multi_head_attention.py: set_keras_mask(.., None)
        after Layer.__call__ took them for its own call), so every call Keras runs after it
        (keras_run_order) reads those tensors unmasked; calls before it, and explicit mask=
        arguments, are unaffected. Per scheduled call, the input positions that lose their mask."""
        layers = {layer.name: layer for layer in spec.layers}
        deleting = [(name, call) for name, _, call, _, _ in schedule if layers[name].class_name == "MultiHeadAttention"]
        if not deleting:
            return [()] * len(schedule)
        order = keras_run_order(spec)
        deleted_at: Dict[tuple, int] = {}  # output ref -> the earliest MultiHeadAttention call that deletes its mask
        for name, call in deleting:
            c = layers[name].calls[call]
            refs = list(c.inputs) + [r for k in ("query", "value", "key") for r in tensor_refs(c.kwargs.get(k))]
            at = order.get((name, call), -1)
            for r in refs:
                key = (r.layer, r.call, r.output)
                deleted_at[key] = min(deleted_at.get(key, at), at)
        return [tuple(j for j, r in enumerate(refs) if r in deleted_at and order.get((name, call), -1) > deleted_at[r])
                for name, _, call, refs, _ in schedule]

    def forward_with_masks(self, *inputs: Tensor, masks: Optional[List[Optional[Tensor]]] = None,
                           name_failures: bool = False):
        """name_failures (load_keras's trial run): an exception in a layer comes out as a
        LayerFailure naming the layer (and the nested models it sits in)."""
        inputs = self._positional(inputs)
        if len(inputs) != len(self.input_refs):
            raise ValueError(f"{self.name} takes {len(self.input_refs)} input(s); got {len(inputs)}")
        env: Dict[Tuple[str, int], Tuple[List[Tensor], List[Optional[Tensor]]]] = {}
        # Numeric numpy arrays as tensors of the Input's dtype on the model's device, as Keras
        # takes them (copied: an output never shares the caller's memory); the string inputs'
        # arrays stay as they are (the string layers read them, and name what they got).
        numeric = [isinstance(x, np.ndarray) and x.dtype.kind in "biuf" and self.input_specs[k][0] != "string"
                   for k, x in enumerate(inputs)]
        if any(numeric):
            anchor = next(iter(list(self.parameters()) + list(self.buffers())), None)
            device = anchor.device if anchor is not None else torch.device("cpu")
            inputs = tuple(self._from_numpy(k, x, device) if convert else x
                           for k, (x, convert) in enumerate(zip(inputs, numeric)))
        # Floating inputs in the parameters' dtype, as Keras casts them to each layer's compute
        # dtype; not the ids an Embedding reads (it casts nothing: 257.0 stays 257 in bfloat16).
        # An Input declared float16 / bfloat16 keeps that dtype (Keras converts an input to its
        # Input's dtype: the operations and an output that is the input see it; layers cast it).
        floating = self._floating
        entry = [half or floating for half in self._entry_dtypes]
        inputs = tuple(x.to(entry[k]) if cast and isinstance(x, Tensor) and x.is_floating_point()
                       and x.dtype != entry[k] else x
                       for k, (x, cast) in enumerate(zip(inputs, self._cast_inputs)))
        for k, (ref, x) in enumerate(zip(self.input_refs, inputs)):
            env[(ref[0], ref[1])] = ([x], [masks[k] if masks else None])

        def fetch(ref):  # [(tensor, mask)]: one, or every output of the call (a Sequential's list)
            outs, ms = env[(ref[0], ref[1])]
            return list(zip(outs, ms)) if ref[2] == EVERY_OUTPUT else [(outs[ref[2]], ms[ref[2]])]

        name, xs = "", []
        try:
            for (name, key, call, refs, mask_refs), dropped, autocast, promote, kwargs in zip(
                    self.schedule, self.masks_dropped, self._autocast, self._promote, self._call_kwargs):
                got = [g for r in refs for g in fetch(r)]
                xs = [t for t, _ in got]
                if autocast:  # (a tensor an operation cast to another float dtype)
                    xs = [x.to(floating) if isinstance(x, Tensor) and x.dtype != floating and (
                        x.is_floating_point() or x.dtype in promote) else x for x in xs]
                ms = [m for _, m in got]
                for j in dropped:
                    ms[j] = None
                if mask_refs is not None:  # an explicit mask=, or a list of them (Attention: [query, value])
                    for j, r in enumerate(mask_refs[: len(ms)]):
                        ms[j] = fetch(r)[0][0] if r is not None else None
                if not name_failures:
                    outs, out_masks = self.layers[key](xs, ms, **kwargs)
                else:
                    outs, out_masks = _named_call(self.layers[key], name, xs, ms, kwargs)
                env[(name, call)] = (outs, out_masks)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the layer
            if name_failures or _tracing():
                raise
            kind = next((layer.class_name for layer in self.spec.layers if layer.name == name), "")
            named = _in_layer(e, name, kind, xs)
            if named is e:
                raise
            raise named from e
        results = [g for r in self.output_refs for g in fetch(r)]
        return [t for t, _ in results], [m for _, m in results]

    def _positional(self, inputs: tuple) -> tuple:
        """The inputs one per position, from a dict of them (by input_keys) or a list of them."""
        if len(inputs) != 1:
            return inputs
        only = inputs[0]
        if isinstance(only, dict):
            missing = [k for k in self.input_keys if k not in only]
            if missing:
                raise ValueError(f"{self.name} takes a dict with the keys {few(self.input_keys)}; "
                                 f"the one given lacks {few(missing)} (it has {few([str(k) for k in only])})")
            return tuple(only[k] for k in self.input_keys)
        # a list of the inputs (not a list of strings: one string input's batch)
        if isinstance(only, (list, tuple)) and len(only) == len(self.input_refs) and all(
                isinstance(x, (Tensor, np.ndarray)) for x in only) and (len(only) > 1 or not self.string_inputs()):
            return tuple(only)
        return inputs

    def example_inputs(self, batch: Optional[int] = None, time: int = 5, any_length: bool = False) -> List[Tensor]:
        """Inputs of the declared shapes (free dimensions: batch (by default the one the model
        runs at only, else 2), then time) for tracing, exporting and checking: bool masks, int64
        ids for every integer input (torch's and numpy's default integer, what an exported program
        then takes), floats in the parameters' dtype.
        any_length: the second dimension of a sequence is ``time`` where the file declares a fixed
        length too (length_inputs)."""
        float_dtype = self._floating
        batch = batch if batch is not None else self.batch_size or 2
        out = []
        for k, (dtype, shape) in enumerate(self.input_specs):
            dims = [batch] + [time if _takes_time(j, d, any_length, dtype, len(shape)) else int(d)
                              for j, d in enumerate(shape[1:])]
            known = self._known_value(k)
            if dtype == "bool":  # an explicit mask input
                out.append(torch.ones(dims, dtype=torch.bool))
            elif dtype == "string":  # strings: what the string layers take (layers/text.py, Hashing, HashedCrossing)
                out.append(np.full(dims, known if isinstance(known, str) else "a", dtype=object))
            elif "int" in dtype:
                out.append(torch.full(dims, known if isinstance(known, int) else 1, dtype=torch.int64))
            else:
                out.append(torch.zeros(dims, dtype=float_dtype))
        return out

    def _known_value(self, k: int):
        """A value the lookup layer reading input k directly has in its vocabulary (a
        StringLookup / TextVectorization token, an IntegerLookup value), or None: a lookup without
        out-of-vocabulary indices gives -1 for anything else, which an Embedding after it refuses."""
        ref = self.input_refs[k]
        for _, key, _, refs, _ in self.schedule:
            if not any(r[0] == ref[0] and r[1] == ref[1] for r in refs):
                continue
            vocabulary = getattr(self.layers[key], "vocabulary", None)
            tokens = getattr(vocabulary, "tokens", None)  # (layers/text.py's _Vocabulary)
            if tokens:
                return tokens[0]
            if isinstance(vocabulary, Tensor) and vocabulary.numel() and not getattr(self.layers[key], "invert", True) \
                    and _vocabulary_of(self.spec, self.spec.inputs[k]) is None:  # (IntegerLookup's values)
                return int(vocabulary[0])
        return None

    def shortest_length(self, at_least: int = 2, limit: int = 65536, any_length: bool = False) -> int:
        """The fewest steps from ``at_least`` on that the model runs on, given to every free
        dimension as example_inputs does (with any_length, to every sequence's second too): a
        valid convolution or a pooling over time needs a minimum length (Keras's CNN-LSTM:
        Conv1D(kernel 5), MaxPooling1D(4) runs from 8 steps; an STFT's frames through a stack of
        convolutions, tens of thousands of samples). ``at_least`` where the model declares
        no free dimension, or runs at no length up to ``limit`` (its own run then says why).
        Stateful layers keep no state from the trials."""
        if not self.has_free_length(any_length):
            return at_least

        def runs(time: int) -> bool:
            try:
                with torch.no_grad():
                    self(*self.example_inputs(batch=self.batch_size or 1, time=time, any_length=any_length))
                return True
            except Exception:  # noqa: BLE001 - too short: torch's own size checks
                return False
            finally:
                self.reset_states()

        fails, time = at_least - 1, at_least
        while not runs(time):
            if time >= limit:  # (no length from at_least on, doubling, runs: the trial's, where it does)
                return self.trial_length if self.trial_length and runs(self.trial_length) else at_least
            fails, time = time, min(2 * time, limit)
        while time - fails > 1:  # the first that runs, between one that does not and one that does
            middle = (fails + time) // 2
            fails, time = (fails, middle) if runs(middle) else (middle, time)
        return time

    def has_free_length(self, any_length: bool = False) -> bool:
        """Whether example_inputs' ``time`` reaches some input dimension (a free one; with
        any_length, the second dimension of every sequence too)."""
        return any(_takes_time(j, d, any_length, dtype, len(shape))
                   for dtype, shape in self.input_specs for j, d in enumerate(shape[1:]))

    def length_inputs(self, any_length: bool = False) -> List[int]:
        """The inputs whose second dimension takes example_inputs' ``time`` (an export makes it
        dynamic)."""
        return [i for i, (dtype, shape) in enumerate(self.input_specs)
                if len(shape) > 1 and _takes_time(0, shape[1], any_length, dtype, len(shape))]

    def reset_states(self) -> None:
        """Zero states in every stateful recurrent layer (a trial run leaves nothing behind)."""
        from ... import conv_lstm, layers as rnn_layers

        for module in self.modules():
            if isinstance(module, (rnn_layers._RNNBase, conv_lstm._ConvLSTM)):
                module.reset_states()

    def _parameter_dtype(self) -> torch.dtype:
        """The floating dtype of the parameters, or (none) the one the model was built to compute
        in (compute_dtype_anchor, which .to() moves too); kept in _floating (set at
        construction and by _apply: .to(), .double(), ...), so that forward only reads it.
        Parameters replaced around _apply (load_state_dict(assign=True) of another dtype,
        p.data = ...) leave it as it was."""
        return next((p.dtype for p in self.parameters() if p.is_floating_point()), self.compute_dtype_anchor.dtype)

    def _apply(self, fn, *args, **kwargs):
        out = super()._apply(fn, *args, **kwargs)
        self._floating = self._parameter_dtype()
        return out

    def _from_numpy(self, k: int, x: np.ndarray, device: torch.device) -> Tensor:
        declared = self.input_specs[k][0]
        dtype = getattr(torch, declared, None) if isinstance(declared, str) else None
        t = torch.from_numpy(np.array(x, dtype=x.dtype.newbyteorder("=")))  # (a copy in native byte order)
        return t.to(device, dtype) if isinstance(dtype, torch.dtype) else t.to(device)

    def string_inputs(self) -> List[int]:
        """The inputs that take strings (a TextVectorization, StringLookup, Hashing or
        HashedCrossing reads them: numpy arrays or lists of str, which no exported program takes)."""
        return [i for i, (dtype, _) in enumerate(self.input_specs) if dtype == "string"]

    def input_vocabularies(self) -> List[Optional[int]]:
        """Per input, the smallest vocabulary (input_dim) of the Embedding layers that read it
        (nested models followed), or None: the inputs that must be ids in [0, vocabulary), whatever
        their declared dtype."""
        return [_vocabulary_of(self.spec, r) for r in self.spec.inputs]

    def layer(self, name: str) -> nn.Module:
        """The module that runs the Keras layer called ``name`` (``layers`` holds it under
        ``module_key(name)``)."""
        return self.layers[module_key(name)]

    def forward(self, *inputs: Tensor):
        outputs, _ = self.forward_with_masks(*inputs)
        if self.output_structure is None:
            return outputs[0] if self.single_output else outputs
        return _packed(self.output_structure, outputs)

    def io_names(self) -> Tuple[List[str], Optional[List[str]]]:
        """Names for the inputs and for the outputs as torch flattens what forward returns (an
        exported program's): the inputs' keys (``input_keys``); an output's dict keys and list
        positions joined by "/" ("p/0"), or in a list of outputs its layer's name, as Keras's
        ``output_names`` has it. Distinct across both (a repeat gets "_1", "_2", ...). The
        outputs' are None where the file does not say how many there are (a Sequential ending in
        a layer that returns a list)."""
        taken: set = set()

        def unique(name: str) -> str:
            n, k = name, 0
            while n in taken:
                k += 1
                n = f"{name}_{k}"
            taken.add(n)
            return n

        inputs = [unique(k) for k in self.input_keys]
        refs = self.spec.outputs

        def leaves(structure, path):
            if isinstance(structure, dict):
                return [x for k, v in structure.items() for x in leaves(v, path + [str(k)])]
            if isinstance(structure, list):
                if not path:  # a list of outputs: named by their layers (a nested one by its position)
                    return [x for i, v in enumerate(structure)
                            for x in leaves(v, [refs[v].layer] if isinstance(v, int) else [str(i)])]
                return [x for i, v in enumerate(structure) for x in leaves(v, path + [str(i)])]
            return ["/".join(path) if path else refs[structure].layer]

        if self.output_structure is not None:
            return inputs, [unique(n) for n in leaves(self.output_structure, [])]
        if self.single_output and refs[0].output != EVERY_OUTPUT:
            return inputs, [unique(refs[0].layer)]
        return inputs, None

    def extra_repr(self) -> str:
        params = sum(p.numel() for p in self.parameters())
        inputs = ", ".join(f"{dtype}{tuple(shape)}" for dtype, shape in self.input_specs)
        version = getattr(self, "keras_version", None)
        return (f"'{self.name}': {len(self.layers)} layers, {params:,} parameters, inputs {inputs}"
                + (f", from Keras {version}" if version else ""))


def _packed(structure, outputs: List[Tensor]):
    """The outputs nested as structure nests their indices (lists and dicts)."""
    if isinstance(structure, dict):
        return {k: _packed(v, outputs) for k, v in structure.items()}
    if isinstance(structure, list):
        return [_packed(v, outputs) for v in structure]
    return outputs[structure]


# Keras layers that compute an integer or bool input in their floating dtype (ops.matmul's type
# promotion; tf.keras's Dense casts); wrappers do where their layer does. Keras 3 also takes the
# means of GlobalAveragePooling and Average in floats (tf.keras's are integer means); tf.keras's
# LayerNormalization casts its input, where Keras 3's takes some of its steps in the integers (the
# layer casts its result). (Keras 3's GroupNormalization of integers is not reproduced.)
_PROMOTES_INTEGERS = frozenset(("Dense", "LSTM", "GRU", "SimpleRNN", "CuDNNLSTM", "CuDNNGRU", "RNN",
                                "BatchNormalization", "UnitNormalization", "PReLU"))
_PROMOTES_INTEGERS_KERAS3 = frozenset(("GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAveragePooling3D"))
_PROMOTES_INTEGERS_KERAS2 = frozenset(("LayerNormalization",))
_WRAPPERS = frozenset(("Bidirectional", "TimeDistributed"))
_INTEGERS = frozenset((torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16, torch.uint32,
                       torch.uint64))
_NO_PROMOTION: frozenset = frozenset()
_HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _promotes_integers(layer, keras3: bool) -> frozenset:
    """The input dtypes the layer computes in its floating dtype: integers and bool, or (Average)
    integers only, or none."""
    name = layer.class_name
    if name in _WRAPPERS:
        inner = layer.config.get("layer") if isinstance(layer.config, dict) else None
        name = inner.get("class_name") if isinstance(inner, dict) else None
    if name in _PROMOTES_INTEGERS or (name in (_PROMOTES_INTEGERS_KERAS3 if keras3 else _PROMOTES_INTEGERS_KERAS2)):
        return _INTEGERS | {torch.bool}
    if keras3 and name == "Average":  # (Keras adds bools as logical or)
        return _INTEGERS
    return _NO_PROMOTION


_NO_AUTOCAST = frozenset(("TFOpLambda", "SlicingOpLambda", "Embedding", "ReversibleEmbedding", "CategoryEncoding",
                          "IntegerLookup", "StringLookup", "Hashing", "HashedCrossing", "TextVectorization"))


def _vocabulary_of(spec: ModelSpec, source: Ref) -> Optional[int]:
    key = (source.layer, source.call, source.output)
    found = []
    for layer in spec.layers:
        for call in layer.calls:
            for j, r in enumerate(call.inputs):
                if not isinstance(r, Ref) or (r.layer, r.call, r.output) != key:
                    continue
                if layer.class_name == "Embedding":
                    dim = layer.config.get("input_dim")
                    if isinstance(dim, int) and dim > 0:
                        found.append(dim)
                elif layer.model is not None and j < len(layer.model.inputs):
                    inner = _vocabulary_of(layer.model, layer.model.inputs[j])
                    if inner is not None:
                        found.append(inner)
    return min(found) if found else None


class LayerFailure(Exception):
    """An exception raised by a layer of a rebuilt model (forward_with_masks(name_failures=True))."""

    def __init__(self, layer: str, error: BaseException):
        super().__init__(f"{type(error).__name__}: {error}")
        self.layer, self.error = layer, error


def _tracing() -> bool:
    return torch.compiler.is_compiling() or torch.compiler.is_exporting() or torch.jit.is_tracing()


def _in_layer(error: Exception, name: str, kind: str, xs) -> Exception:
    """The exception a layer raised on a call of the model, of the same type, its message
    prefixed with the layer and the shapes it was given (an input too short for a valid
    convolution or pooling otherwise reads as torch's "Output size is too small"); the error
    itself where its type cannot be rebuilt from a message, or where an inner model named it."""
    if not name or getattr(error, "_cudnn_rnn_layer", False):
        return error
    shapes = ", ".join(str(tuple(x.shape)) if isinstance(x, (Tensor, np.ndarray)) else type(x).__name__ for x in xs)
    try:
        named = type(error)(f"layer '{name}' ({kind}) on input{'s' if len(xs) != 1 else ''} of shape {shapes}: "
                            f"{error}")
    except Exception:  # noqa: BLE001 - a type with other constructor arguments: keep it as raised
        return error
    named._cudnn_rnn_layer = True
    return named


def _named_call(module: nn.Module, name: str, xs, ms, kwargs: dict):
    try:
        if isinstance(module, NestedModel):
            return module.model.forward_with_masks(*xs, masks=ms, name_failures=True)
        return module(xs, ms, **kwargs)
    except LayerFailure as inner:  # from inside a nested model: its path
        raise LayerFailure(f"{name}/{inner.layer}", inner.error) from None
    except Exception as e:  # noqa: BLE001 - named, then re-raised
        raise LayerFailure(name, e) from None


class NestedModel(nn.Module):
    """A Keras model used as a layer inside another: the graph call protocol around KerasModel."""

    def __init__(self, model: KerasModel):
        super().__init__()
        self.model = model

    def forward(self, inputs, masks):
        return self.model.forward_with_masks(*inputs, masks=masks)
