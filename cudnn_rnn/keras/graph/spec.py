"""Keras model configs (Keras 3, tf.keras 2.x, Keras 2 / 1 multi-backend) as one graph form.

A model is a list of layers, each called one or more times; a call's inputs are references
(layer name, call index, output index) to earlier calls' outputs. Sequential models become a
chain; nested models are layers whose spec is itself a ModelSpec.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

from ..errors import ConversionError
from ..errors import few

MODEL_CLASSES = ("Sequential", "Functional", "Model")


@dataclass(frozen=True)
class Ref:
    layer: str
    call: int = 0
    output: int = 0  # EVERY_OUTPUT: all of the call's outputs, in order


# A Sequential passes a layer's whole result to the next layer: where that is a list (an RNN with
# return_state, a Bidirectional with merge_mode=None), the next layer reads every element of it.
EVERY_OUTPUT = -1


@dataclass(frozen=True)
class TensorArg:
    """The i-th tensor input of a call, where it stands among the positional arguments."""
    index: int


@dataclass
class Call:
    inputs: List[Ref]
    kwargs: Dict[str, Any] = field(default_factory=dict)  # tensors in kwargs are Refs (or lists of Refs)
    constants: List[Any] = field(default_factory=list)    # non-tensor positional args (Keras 3 ops)
    # The positional arguments as written (Keras 3): TensorArg(i) for inputs[i], constants as
    # given, lists as lists; what a recorded operation is called with (layers/ops.py).
    args: List[Any] = field(default_factory=list)

    def tensor_kwargs(self) -> List[str]:
        """The keyword arguments other than initial_state and mask that hold tensors, in the order
        a layer module receives them: after the positional inputs and initial_state, by name
        (model.py passes them so; attention_layers.py reads MultiHeadAttention's key= and value=)."""
        return sorted(k for k, v in self.kwargs.items() if k not in ("initial_state", "mask") and isinstance(v, list)
                      and v and all(isinstance(r, Ref) for r in v))


@dataclass
class LayerSpec:
    name: str
    class_name: str
    config: Dict[str, Any]
    calls: List[Call]
    model: Optional["ModelSpec"] = None  # for nested models
    module: str = ""                     # Keras 3: "keras.layers", or "keras.src.ops.numpy" for ops

    @property
    def is_op(self) -> bool:
        """A Keras 3 operation recorded in a functional graph (e.g. the mask computations).
        Legacy .h5 configs drop `module`; there an op is told by its config, which (unlike a
        layer's) has no `trainable` (an op may have a `dtype`: Cast, ConvertToTensor)."""
        if self.module:
            return self.module.startswith("keras.src.ops")
        return (bool(self.calls) and isinstance(self.calls[0].inputs, list) and "trainable" not in self.config
                and self.class_name not in MODEL_CLASSES)


@dataclass
class ModelSpec:
    name: str
    class_name: str
    layers: List[LayerSpec]
    inputs: List[Ref]
    outputs: List[Ref]
    single_output: bool = True
    # The keys of a model built on dicts (keras.Model({"a": x, ...}, {"y": out, ...})), one per
    # input / output, None where the config lists them: the inputs' sorted (`inputs` follows them,
    # the order of Keras's model.inputs, which a list given to the model follows), the outputs'
    # in the config's order.
    input_keys: Optional[List[str]] = None
    output_keys: Optional[List[str]] = None
    # What the model returns, as the config nests its outputs: an index into `outputs` (one
    # tensor), or lists and dicts (in the config's key order) of such. None: `outputs` as a list.
    output_structure: Union[int, list, dict, None] = None


def snake_case(name: str) -> str:
    """keras.src.utils.naming.to_snake_case: how .keras files name a layer's weight group."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _layer_name(entry: dict) -> str:
    cfg = entry.get("config", {})
    name = entry.get("name") or (cfg.get("name") if isinstance(cfg, dict) else None) or entry.get("class_name", "?")
    return name if isinstance(name, str) else str(name)[:100]


def _index(value, path, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 20:
        raise ConversionError(path, f"{what} holds {str(value)[:60]!r} where a small non-negative integer belongs")
    return value


def _ref(history, path, what: str = "a tensor reference") -> Ref:
    """(layer name, call index, output index), as Keras 3's keras_history or a Keras 2 node item."""
    if not isinstance(history, (list, tuple)) or len(history) < 3 or not isinstance(history[0], str):
        raise ConversionError(path, f"{what} is malformed: {str(history)[:120]}")
    return Ref(history[0], _index(history[1], path, what), _index(history[2], path, what))


def _refs_in(value, path) -> List[Ref]:
    """Every Keras-tensor reference in a Keras 3 call-argument structure, in order."""
    out = []
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            cfg = value.get("config")
            return [_ref(cfg.get("keras_history") if isinstance(cfg, dict) else None, path)]
        for v in value.values():
            out += _refs_in(v, path)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += _refs_in(v, path)
    return out


def _template(value, counter):
    """A Keras 3 call argument with each Keras tensor replaced by TensorArg (numbered in the order
    _refs_in finds them)."""
    if isinstance(value, dict):
        if value.get("class_name") == "__keras_tensor__":
            counter[0] += 1
            return TensorArg(counter[0] - 1)
        return {k: _template(v, counter) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_template(v, counter) for v in value]
    return value


def _plain_dict(value) -> bool:
    """A dict of call arguments (a Keras 3 call on a dict of tensors), not one Keras tensor."""
    return isinstance(value, dict) and value.get("class_name") != "__keras_tensor__"


def _parse_calls(entry: dict, path) -> List[Call]:
    calls = []
    nodes = entry.get("inbound_nodes", []) or []
    if not isinstance(nodes, list):
        raise ConversionError(path, "inbound_nodes is not a list", _layer_name(entry))
    for node in nodes:
        if isinstance(node, dict) and node and "args" not in node and "kwargs" not in node and all(
                _is_node_item(v) for v in node.values()):  # tf.keras: a call on a dict of tensors
            keys = [k for k in node if isinstance(k, str)]
            if len(keys) != len(node):
                raise ConversionError(path, f"malformed inbound node {str(node)[:200]}", _layer_name(entry))
            calls.append(Call([_ref(node[k], path, "an inbound node") for k in keys], {}, [],
                              [{k: TensorArg(i) for i, k in enumerate(keys)}]))
        elif isinstance(node, dict):  # Keras 3: {"args": [...], "kwargs": {...}}
            args, kw = node.get("args", []), node.get("kwargs") or {}
            if not isinstance(args, list) or not isinstance(kw, dict):
                raise ConversionError(path, f"malformed inbound node {str(node)[:200]}", _layer_name(entry))
            inputs = _refs_in(args, path)
            constants = [a for a in args if not _refs_in(a, path)]
            counter = [0]
            template = [_template(a, counter) for a in args]
            kwargs = {}
            for k, v in kw.items():
                if k == "mask" and isinstance(v, list):  # per input, None where a position has none
                    kwargs[k] = [(_refs_in(e, path) or [None])[0] for e in v]
                    continue
                if (k == "mask" and len(args) == 1 and _plain_dict(v) and _plain_dict(args[0])
                        and set(v) == set(args[0])):  # a dict of inputs' masks: in the inputs' order
                    kwargs[k] = [(_refs_in(v[key], path) or [None])[0] for key in args[0]]
                    continue
                refs = _refs_in(v, path)
                kwargs[k] = refs if refs else v
            calls.append(Call(inputs, kwargs, constants, template))
        elif isinstance(node, list):  # Keras 2: [[name, call, output, kwargs], ...]
            inputs, kwargs = [], {}
            # tf.keras's TFOpLambda / SlicingOpLambda: a node that is one item is a call on one
            # tensor; a list of items, a call on a list of tensors (tf.concat([a, b], ...))
            single = _is_node_item(node)
            if single:
                node = [node]
            args: List[Any] = []
            for item in _legacy_items(node, path, entry):
                if item[0] == "_CONSTANT_VALUE":  # a constant argument (0.1 * x): its value in the index slot
                    if entry.get("class_name") not in ("TFOpLambda", "SlicingOpLambda"):
                        raise ConversionError(path, f"a constant input {str(item[2])[:40]} to a "
                                                    f"{str(entry.get('class_name'))[:40]} layer is not supported",
                                              _layer_name(entry))
                    args.append(item[2])
                else:
                    inputs.append(_ref(item, path, "an inbound node"))
                    args.append(TensorArg(len(inputs) - 1))
                if len(item) > 3 and isinstance(item[3], dict):
                    for k, v in item[3].items():
                        if entry.get("class_name") in ("TFOpLambda", "SlicingOpLambda"):
                            # a TensorFlow call's keyword argument: tensors anywhere in it (y=t,
                            # shape=[tf.shape(x)[0], -1]) become inputs, TensorArg in its place
                            kwargs[k] = _tensor_args(v, inputs, path, k)
                        elif isinstance(v, list) and v and all(_is_node_item(r) for r in v):  # initial_state refs
                            kwargs[k] = [_ref(r, path, f"the {k} argument") for r in v]
                        elif k == "mask" and isinstance(v, list) and any(_is_node_item(r) for r in v) and all(
                                r is None or _is_node_item(r) for r in v):  # per input, None where one has none
                            kwargs[k] = [_ref(r, path, "the mask argument") if r is not None else None for r in v]
                        elif _is_node_item(v):
                            kwargs[k] = [_ref(v, path, f"the {k} argument")]
                        else:
                            kwargs[k] = v
            template = args if single else [args]
            calls.append(Call(inputs, kwargs, [a for a in args if not isinstance(a, TensorArg)], template))
        else:
            raise ConversionError(path, f"malformed inbound node {str(node)[:200]}", _layer_name(entry))
    return calls


def _tensor_args(value, inputs: list, path, key: str, depth: int = 0):
    """value with each Keras 2 reference in it (nested in lists) appended to `inputs` and
    replaced by its TensorArg."""
    if _is_node_item(value):
        inputs.append(_ref(value, path, f"the {key} argument"))
        return TensorArg(len(inputs) - 1)
    if isinstance(value, list) and depth < 4:
        return [_tensor_args(v, inputs, path, key, depth + 1) for v in value]
    return value


def _is_node_item(value) -> bool:
    """A Keras 2 reference [layer name, node index, tensor index(, kwargs)]; a list of numbers
    (tf.pad's paddings) is not one."""
    return isinstance(value, list) and 3 <= len(value) <= 4 and isinstance(value[0], str)


def _legacy_items(node: list, path, entry) -> List[list]:
    """A Keras 2 node's [name, node index, tensor index, kwargs] items in order (name
    "_CONSTANT_VALUE", index -1: a constant, its value in the third place). tf.keras nests
    them as the call's input was nested: RNN(StackedRNNCells) called with initial_state holds
    [x, [h1, [h2, c2]]]; the flat order is initial_state's flat order."""
    items = []
    for item in node:
        if _is_node_item(item):
            items.append(item)
        elif isinstance(item, list) and item:
            items += _legacy_items(item, path, entry)
        else:
            raise ConversionError(path, f"malformed inbound node {str(item)[:200]}", _layer_name(entry))
    return items


def _endpoint_refs(value, path, what) -> List[Ref]:
    if not value:
        raise ConversionError(path, f"the model config has no {what}")
    if isinstance(value, list) and len(value) >= 3 and isinstance(value[0], str):
        return [_ref(value, path, what)]
    if not isinstance(value, (list, dict)):
        raise ConversionError(path, f"the model config's {what} is malformed: {str(value)[:120]}")
    refs = []
    for item in (value.values() if isinstance(value, dict) else value):
        if isinstance(item, dict):
            refs += _refs_in(item, path)
        else:
            refs += _endpoint_refs(item, path, what)
    return refs


def _inputs_by_key(layer: LayerSpec) -> None:
    """A nested model called on a dict takes its inputs by key (Keras matches the dict to the
    model's own input_layers: keras.Model({"a": x, "b": y}) called with {"b": q, "a": p}, which
    Keras 3 writes by sorted key): such calls' inputs and masks put in the model's input order."""
    keys = layer.model.input_keys or [r.layer for r in layer.model.inputs]
    for call in layer.calls:
        given = call.args[0] if len(call.args) == 1 else None
        if not (isinstance(given, dict) and list(given) != keys and set(given) == set(keys)
                and all(isinstance(v, TensorArg) for v in given.values())
                and sorted(v.index for v in given.values()) == list(range(len(call.inputs)))):
            continue
        order = [given[k].index for k in keys]
        call.inputs = [call.inputs[i] for i in order]
        mask = call.kwargs.get("mask")
        if isinstance(mask, list) and len(mask) == len(order):
            call.kwargs["mask"] = [mask[i] for i in order]
        call.args = [{k: TensorArg(j) for j, k in enumerate(keys)}]


def _output_structure(value, path) -> Tuple[List[Ref], Union[int, list, dict]]:
    """A Functional config's output_layers as (refs, structure): refs in the order Keras flattens
    the outputs (keras.tree / tf.nest: a dict's values by sorted key, depth first), which is how
    an outer model's nodes number a nested model's outputs; structure the config's nesting, with
    each reference replaced by its index in refs. A list of one output is that output (Keras's
    Functional returns the tensor)."""
    if not value:
        raise ConversionError(path, "the model config has no output_layers")
    refs: List[Ref] = []

    def leaf(item):
        if isinstance(item, dict) and item.get("class_name") == "__keras_tensor__":
            return True
        return isinstance(item, list) and len(item) >= 3 and isinstance(item[0], str)

    def walk(item, depth):
        if depth > 64:
            raise ConversionError(path, "the model config's output_layers nest deeper than 64 levels")
        if leaf(item):
            refs.append(_endpoint_refs(item, path, "output_layers")[0] if isinstance(item, list)
                        else _refs_in(item, path)[0])
            return len(refs) - 1
        if isinstance(item, dict) and item and all(isinstance(k, str) for k in item):
            indices = {k: walk(item[k], depth + 1) for k in sorted(item)}
            return {k: indices[k] for k in item}
        if isinstance(item, list) and item:
            return [walk(v, depth + 1) for v in item]
        raise ConversionError(path, f"the model config's output_layers are malformed: {str(item)[:120]}")

    structure = walk(value, 0)
    if isinstance(structure, list) and len(structure) == 1 and isinstance(structure[0], int):
        structure = structure[0]
    return refs, structure


def _endpoint_keys(value, refs: List[Ref]) -> Optional[List[str]]:
    """The keys of a dict of endpoints, each naming one of refs (in order); None otherwise."""
    if not isinstance(value, dict) or len(value) != len(refs) or not all(isinstance(k, str) for k in value):
        return None
    return list(value)


def parse_model(config: dict, path) -> ModelSpec:
    """A ModelSpec from a serialized model ({"class_name": ..., "config": ...})."""
    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str):
        raise ConversionError(path, "the model config has no class_name")
    cls = config["class_name"]
    body = config.get("config")
    if cls == "Sequential":
        return _parse_sequential(body, path)
    if cls in ("Functional", "Model"):
        return _parse_functional(body, path)
    raise ConversionError(path, f"the file holds a {cls[:100]}, not a Sequential or Functional model "
                                "(subclassed models have no config to rebuild from)")


def _layer_spec(entry: dict, path, calls: List[Call]) -> LayerSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
        raise ConversionError(path, f"malformed layer entry {str(entry)[:200]}")
    config = entry.get("config") or {}
    if not isinstance(config, dict):
        raise ConversionError(path, f"the config of a {entry['class_name'][:100]} is not a JSON object", _layer_name(entry))
    spec = LayerSpec(_layer_name(entry), entry["class_name"], config, calls, module=str(entry.get("module") or ""))
    if spec.class_name in MODEL_CLASSES:
        spec.model = parse_model({"class_name": spec.class_name, "config": spec.config}, path)
    return spec


def _unique_names(layers: List[LayerSpec], path) -> None:
    seen, twice = set(), []
    for layer in layers:
        if layer.name in seen:
            twice.append(layer.name)
        seen.add(layer.name)
    if twice:
        raise ConversionError(path, f"the model config names {few(sorted(set(twice)))} more than once")


def _parse_sequential(body, path) -> ModelSpec:
    if isinstance(body, list):  # Keras <= 2.1: the config is the layer list
        body = {"name": "sequential", "layers": body}
    if not isinstance(body, dict) or not isinstance(body.get("layers"), list):
        raise ConversionError(path, "the Sequential config has no layer list")
    entries = list(body["layers"])
    if not entries:
        raise ConversionError(path, "the Sequential model has no layers")
    if not all(isinstance(e, dict) for e in entries):
        raise ConversionError(path, "the Sequential layer list holds something that is not a layer")
    if entries[0].get("class_name") != "InputLayer":
        first = entries[0].get("config", {})
        first = first if isinstance(first, dict) else {}
        shape = first.get("batch_input_shape") or first.get("batch_shape") or body.get("build_input_shape")
        entries.insert(0, {"class_name": "InputLayer", "config": {"name": "input", "batch_shape": shape,
                                                                  "dtype": first.get("dtype", "float32")}})
    layers, prev = [], None
    for entry in entries:
        calls = [] if entry.get("class_name") == "InputLayer" else [Call([prev])]
        spec = _layer_spec(entry, path, calls)
        layers.append(spec)
        prev = Ref(spec.name, 0, EVERY_OUTPUT if _returns_list(spec) else 0)
    _unique_names(layers, path)
    return ModelSpec(_name(body, "sequential"), "Sequential", layers, [Ref(layers[0].name)], [prev],
                     single_output=prev.output != EVERY_OUTPUT)


def _returns_list(layer: LayerSpec) -> bool:
    """Whether a layer returns a list when called (keras/src/layers/rnn/rnn.py, bidirectional.py):
    an RNN with return_state, a Bidirectional with merge_mode=None or around one, a nested model
    with several outputs (or a Sequential ending in such a layer)."""
    if layer.model is not None:
        return not layer.model.single_output or len(layer.model.outputs) > 1
    class_name, config = layer.class_name, layer.config
    if not isinstance(config, dict):
        return False
    if class_name == "Bidirectional":
        inner = config.get("layer")
        inner = inner.get("config") if isinstance(inner, dict) else None
        return config.get("merge_mode", "concat") is None or (isinstance(inner, dict) and inner.get("return_state") is True)
    return config.get("return_state") is True


def _name(body: dict, default: str) -> str:
    name = body.get("name", default)
    return name if isinstance(name, str) else default


def _parse_functional(body, path) -> ModelSpec:
    if not isinstance(body, dict) or not isinstance(body.get("layers"), list):
        raise ConversionError(path, "the Functional config has no layer list")
    if not all(isinstance(e, dict) for e in body["layers"]):
        raise ConversionError(path, "the Functional layer list holds something that is not a layer")
    layers = [_layer_spec(e, path, [] if e.get("class_name") == "InputLayer" else _parse_calls(e, path))
              for e in body["layers"]]
    _unique_names(layers, path)
    for layer in layers:
        if layer.model is not None:
            _inputs_by_key(layer)
    outputs, structure = _output_structure(body.get("output_layers"), path)
    inputs_cfg = body.get("input_layers")
    inputs = _endpoint_refs(inputs_cfg, path, "input_layers")
    input_keys = _endpoint_keys(inputs_cfg, inputs)
    if input_keys:  # a model built on a dict: its inputs by sorted key, as Keras lists them (model.inputs)
        order = sorted(range(len(inputs)), key=lambda i: input_keys[i])
        inputs, input_keys = [inputs[i] for i in order], [input_keys[i] for i in order]
    spec = ModelSpec(_name(body, "model"), "Functional", layers, inputs, outputs,
                     single_output=isinstance(structure, int) or len(outputs) == 1,
                     input_keys=input_keys,
                     output_keys=list(structure) if isinstance(structure, dict) else None,
                     output_structure=structure)
    if _keras3_nodes(body["layers"]):
        _renumber_nested_outputs(spec)
    else:
        _renumber_nested_calls(spec)
    return spec


def _keras3_nodes(entries: list) -> bool:
    """Whether the layers' inbound nodes are Keras 3's ({"args": ..., "kwargs": ...} each; a
    tf.keras call on a dict is a dict of node items)."""
    return any(isinstance(node, dict) and ("args" in node or "kwargs" in node) for e in entries for node in (e.get("inbound_nodes") or [])
               if isinstance(e.get("inbound_nodes"), list))


def _renumber_nested_outputs(spec: ModelSpec) -> None:
    """Keras 3 numbers a nested Functional model's calls from 0 where layers read them, but from
    1 in the model's output_layers and input_layers (Functional.get_config counts a first node of
    its own; functional_from_config's get_tensor takes it off again): renumber those from 0."""
    nested = {layer.name for layer in spec.layers if layer.class_name == "Functional"}
    if not nested:
        return

    def fix(r):
        return Ref(r.layer, r.call - 1, r.output) if r.layer in nested and r.call >= 1 else r

    spec.outputs = [fix(r) for r in spec.outputs]
    spec.inputs = [fix(r) for r in spec.inputs]


def _renumber_nested_calls(spec: ModelSpec) -> None:
    """Keras 2: a nested model built on its own Input has a first node of its own that configs
    leave out (Keras's _should_skip_first_node), so references to its calls, the layers' and the
    outputs' alike, count from 1: renumber them from 0 wherever the references say so (every index
    >= 1 and the largest one past the calls)."""
    referenced: Dict[str, List[int]] = {}

    def refs_of(call: Call):
        for r in call.inputs:
            yield r
        for v in call.kwargs.values():
            if isinstance(v, list):
                for r in v:
                    if isinstance(r, Ref):
                        yield r

    for layer in spec.layers:
        for call in layer.calls:
            for r in refs_of(call):
                referenced.setdefault(r.layer, []).append(r.call)
    for r in spec.outputs:
        referenced.setdefault(r.layer, []).append(r.call)
    n_calls = {layer.name: len(layer.calls) for layer in spec.layers}
    shifted = {name for name, idx in referenced.items()
               if n_calls.get(name) and min(idx) >= 1 and max(idx) >= n_calls[name]}
    if not shifted:
        return

    def fix(r):
        return Ref(r.layer, r.call - 1, r.output) if isinstance(r, Ref) and r.layer in shifted else r

    for layer in spec.layers:
        for call in layer.calls:
            call.inputs = [fix(r) for r in call.inputs]
            call.kwargs = {k: [fix(r) for r in v] if isinstance(v, list) else v for k, v in call.kwargs.items()}
    spec.outputs = [fix(r) for r in spec.outputs]


def tensor_refs(value) -> List[Ref]:
    """The Refs in a parsed call argument (a Ref, or nested lists of them), in order."""
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, (list, tuple)):
        return [r for v in value for r in tensor_refs(v)]
    return []


def keras_run_order(spec: ModelSpec) -> Dict[tuple, int]:
    """Where each call (layer name, call index) comes when Keras 3 runs the functional graph
    (keras/src/ops/function.py): _build_map's depth-first post-order from the outputs, then
    map_graph's depths (a node one deeper than its deepest reader, every call of a layer as
    deep as its deepest), run deepest first and, within a depth, in the order the nodes got
    theirs. A call's parents are its tensor arguments, positional first, then keyword
    arguments by sorted name (tree.flatten of (args, kwargs))."""
    calls = {(layer.name, i): call for layer in spec.layers for i, call in enumerate(layer.calls)}

    def parents(node):
        call = calls.get(node)
        if call is None:  # an input layer's node
            return []
        refs = list(call.inputs) + [r for k in sorted(call.kwargs) for r in tensor_refs(call.kwargs[k])]
        return [(r.layer, r.call) for r in refs]

    post, finished, stack = [], set(), []
    for out in spec.outputs:  # the recursion of _build_map_helper, iteratively (graphs can be deep)
        root = (out.layer, out.call)
        if root in finished:
            continue
        stack.append((root, iter(parents(root))))
        finished.add(root)
        while stack:
            node, pending = stack[-1]
            nxt = next((p for p in pending if p not in finished), None)
            if nxt is None:
                stack.pop()
                post.append(node)
            else:
                finished.add(nxt)
                stack.append((nxt, iter(parents(nxt))))
    depths: Dict[tuple, int] = {}
    layer_depths: Dict[str, int] = {}
    for node in reversed(post):
        depth = max(depths.setdefault(node, 0), layer_depths.get(node[0], 0))
        layer_depths[node[0]] = depth
        depths[node] = depth
        for p in parents(node):
            depths[p] = max(depth + 1, depths.get(p, 0))
    ranked = sorted(enumerate(depths.items()), key=lambda e: (-e[1][1], e[0]))
    return {node: k for k, (_, (node, _)) in enumerate(ranked)}
