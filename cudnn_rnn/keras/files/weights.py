"""Finding each layer's weights in a Keras file.

Two layouts:
- "keras3" (.keras, .weights.h5): `layers/<snake_case class>[_N]/<sub-object>/vars/<i>`, keyed by
  class occurrence order in the model's layer list, never by layer name (tf.keras 2.13-2.14
  wrote `_layer_checkpoint_dependencies` for `layers`);
- "legacy" (.h5): a group per layer named by the layer, its datasets listed in order by the
  `weight_names` attribute (names vary by producer: `lstm_1/kernel:0`,
  `lstm/lstm_cell_1/kernel:0`, no `:0` in Keras 3), so weights are taken by that order only.

A builder asks for its weights as groups [(sub-path, count), ...] in Keras's own variable order,
e.g. Bidirectional [("forward_layer/cell", 3), ("backward_layer/cell", 3)] (a sub-path may be a
tuple of alternatives: MultiHeadAttention's "query_dense" is "_query_dense" in tf.keras files);
the legacy layout splits the layer's flat list by the same counts.
"""
from __future__ import annotations

import abc
import re

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .containers import KerasFile, check_array
from ..errors import ConversionError
from ..graph.spec import LayerSpec, ModelSpec, snake_case
from ..errors import few

Groups = Sequence[Tuple[str, int]]


class LayerWeights(abc.ABC):
    """The weights of one layer, served by groups."""

    @abc.abstractmethod
    def take(self, groups: Groups, shapes: Optional[Sequence[Sequence[tuple]]] = None,
             order: Optional[Sequence[str]] = None) -> List[List[np.ndarray]]:
        """Arrays per group, in Keras order, shapes checked against `shapes` where given. `order`:
        the variables' names in Keras's saving order, for a layer whose legacy .h5 list (its
        trainable variables first) may differ from it (a quantized Dense's bias comes first)."""

    @abc.abstractmethod
    def child_source(self, spec: ModelSpec, sub: str = "") -> "WeightSource":
        """Where a nested model held by this layer finds its layers' weights; `sub`: the model's
        sub-path below the layer where a wrapper holds it (TimeDistributed's "layer")."""

    def vocabulary(self) -> Optional[List[str]]:
        """The lines of the layer's vocabulary asset (a .keras file's
        assets/<layer path>/vocabulary.txt: a lookup layer's special tokens, then its vocabulary)
        as Keras reads them (asset_lines), or None where the file keeps none (legacy .h5 files
        keep no assets)."""
        return None

    @abc.abstractmethod
    def take_all(self) -> List[np.ndarray]:
        """Every weight the layer holds, for a layer whose variables this package does not know
        (a custom_layers builder): in the keras3 layout its own vars/0.. first, then those of
        its sub-objects by group path; in the legacy layout its weight_names order."""


class WeightSource(abc.ABC):
    @abc.abstractmethod
    def for_layer(self, layer: LayerSpec) -> LayerWeights:
        """The weights of one layer of the model."""


def _check_count(kf: KerasFile, layer: str, found: int, expected: int, where: str) -> None:
    if found == 0 and expected and not kf.arrays and not any(kf.layer_weights.values()):
        raise ConversionError(kf.path, "holds no weights at all: the model was saved before it was built (Keras "
                                       "creates a model's weights on its first call, or once its input shape is "
                                       "given), so there are no trained values to convert", layer)
    if found != expected:
        raise ConversionError(kf.path, f"{where} holds {found} weight(s); the config implies {expected}", layer)


def _older_spelling(path: str) -> str:
    """A weights path as tf.keras 2.13-2.14 wrote it: each `layers` component
    `_layer_checkpoint_dependencies` (a layer whose name holds "layers" keeps it)."""
    return "/".join("_layer_checkpoint_dependencies" if part == "layers" else part for part in path.split("/"))


class _Keras3Layer(LayerWeights):
    def __init__(self, kf: KerasFile, index: Dict[str, Dict[str, np.ndarray]], layer: str, path: str):
        self.kf, self.index, self.layer, self.path = kf, index, layer, path

    def _group(self, sub):
        """(the group path found or None, the path named in errors); `sub` may be a tuple of
        alternative sub-paths (Keras 3 and tf.keras name some sub-objects differently)."""
        fulls = ["/".join(p for p in (self.path, alt) if p) for alt in (sub if isinstance(sub, tuple) else (sub,))]
        for full in fulls:
            for candidate in (full, _older_spelling(full)):
                if candidate in self.kf.groups:
                    return candidate, candidate
        return None, fulls[0]

    def take(self, groups, shapes=None, order=None):
        out = []
        for k, (sub, count) in enumerate(groups):
            group, where = self._group(sub)
            if count == 0:
                out.append([])
                continue
            if group is None or f"{group}/vars" not in self.kf.groups:
                raise ConversionError(self.kf.path, f"missing weights: no group {where}/vars in the weights file", self.layer)
            vars_ = self.index.get(f"{group}/vars", {})
            keys = sorted(vars_, key=lambda s: int(s) if s.isdigit() else -1)
            _check_count(self.kf, self.layer, len(keys), count, f"{where}/vars")
            expected = shapes[k] if shapes is not None else [None] * count
            out.append([check_array(self.kf.path, f"{where}/vars/{key}", vars_[key], self.layer, exp)
                        for key, exp in zip(keys, expected)])
        return out

    def child_source(self, spec: ModelSpec, sub: str = "") -> "WeightSource":
        return Keras3Source(self.kf, spec, prefix="/".join(p for p in (self.path, sub) if p), index=self.index)

    def vocabulary(self):
        # (tf.keras 2.13-2.14 wrote the assets under _layer_checkpoint_dependencies, as the weights)
        text = next((self.kf.assets[k] for k in (f"assets/{self.path}/vocabulary.txt",
                                                 f"assets/{_older_spelling(self.path)}/vocabulary.txt")
                     if k in self.kf.assets), None)
        return None if text is None else asset_lines(text)

    def take_all(self):
        base, _ = self._group("")
        if base is None:
            return []
        own = f"{base}/vars"
        subs = sorted((g for g in self.kf.groups if g.startswith(base + "/") and g.endswith("/vars") and g != own),
                      key=_natural)
        out = []
        for group in ([own] if own in self.kf.groups else []) + subs:
            vars_ = self.index.get(group, {})
            for key in sorted(vars_, key=lambda k: int(k) if k.isdigit() else -1):
                out.append(check_array(self.kf.path, f"{group}/{key}", vars_[key], self.layer))
        return out


def asset_lines(text: str) -> List[str]:
    """A vocabulary asset's lines as Keras's lookup layers read them back (load_assets): split
    at every line boundary Python knows (\\r, \\v, \\f, \\x1c-\\x1e, \\x85, \\u2028, \\u2029 too, not
    only \\n), trailing empty lines dropped. A token holding one of those was one line when Keras
    wrote it and is several when Keras reads it: the file's model is the one Keras reads."""
    lines = text.splitlines()
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def _natural(path: str) -> list:
    """A sort key that orders dense_2 before dense_10."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


# Config class names whose Python class is named otherwise: the weights file is keyed by the
# class's own name (keras.layers.GroupQueryAttention is the class GroupedQueryAttention).
_CLASS_NAMES = {"GroupQueryAttention": "GroupedQueryAttention"}


class Keras3Source(WeightSource):
    def __init__(self, kf: KerasFile, spec: ModelSpec, prefix: str = "", index=None):
        self.kf = kf
        if index is None:  # group path -> {dataset name: array}
            index = {}
            for key, array in kf.arrays.items():
                parent, _, name = key.rpartition("/")
                index.setdefault(parent, {})[name] = array
        self.index = index
        layers = [l for l in (spec.layers[1:] if spec.class_name == "Sequential" else spec.layers)
                  if not l.is_op]  # (operations hold no weights and are not in model.layers)
        self.paths = self._numbered(layers, prefix, False)
        if any(not self._holds(p) for p in self.paths.values()):
            # tf.keras 2.12-2.13 numbered a class's layers counting each weighted one twice (its
            # checkpoint dependencies list it as layer_with_weights-i and as layer-k): dense,
            # dense_2, dense_4. Taken where it finds more of the layers' weights.
            twice = self._numbered(layers, prefix, True)
            if sum(map(self._holds, twice.values())) > sum(map(self._holds, self.paths.values())):
                self.paths = twice

    def _holds(self, path: str) -> bool:
        """Whether the file holds arrays below the layer path (in either Keras's spelling)."""
        if not hasattr(self, "_prefixes"):
            self._prefixes = {k[:i] for k in self.index for i in range(len(k) + 1) if i == len(k) or k[i] == "/"}
        return path in self._prefixes or _older_spelling(path) in self._prefixes

    def _numbered(self, layers, prefix: str, twice: bool) -> Dict[str, str]:
        """Each layer's path: layers/<snake_case class>[_N], N counting the class's earlier layers
        (`twice`: a weighted one twice)."""
        paths, used = {}, {}
        for layer in layers:
            base = snake_case(_CLASS_NAMES.get(layer.class_name, layer.class_name))
            n = used.get(base, 0)
            path = "/".join(p for p in (prefix, "layers", base if n == 0 else f"{base}_{n}") if p)
            used[base] = n + (2 if twice and self._holds(path) else 1)
            paths[layer.name] = path
        return paths

    def for_layer(self, layer: LayerSpec) -> LayerWeights:
        return _Keras3Layer(self.kf, self.index, layer.name, self.paths.get(layer.name, ""))


class _FlatLayer(LayerWeights):
    """A layer's weights as one ordered list of datasets (legacy layout)."""

    def __init__(self, kf: KerasFile, layer: str, datasets: List[Tuple[str, np.ndarray]], where: str):
        self.kf, self.layer, self.datasets, self.where = kf, layer, datasets, where

    def take(self, groups, shapes=None, order=None):
        _check_count(self.kf, self.layer, len(self.datasets), sum(c for _, c in groups), self.where)
        datasets = self.datasets
        if order is not None:  # by the names' last part ("sequential/dense/kernel_scale:0" is kernel_scale)
            keys = [str(name).split("/")[-1].split(":")[0] for name, _ in datasets]
            if len(set(keys)) == len(keys) and all(k in order for k in keys):
                datasets = sorted(datasets, key=lambda d: order.index(str(d[0]).split("/")[-1].split(":")[0]))
        out, i = [], 0
        for k, (_, count) in enumerate(groups):
            expected = shapes[k] if shapes is not None else [None] * count
            out.append([check_array(self.kf.path, datasets[i + j][0], datasets[i + j][1], self.layer, expected[j])
                        for j in range(count)])
            i += count
        return out

    def child_source(self, spec: ModelSpec, sub: str = "") -> "WeightSource":
        return _PoolSource(self.kf, self.datasets, self.where, spec)  # (one flat list, wrapped or not)

    def take_all(self):
        return [check_array(self.kf.path, name, array, self.layer) for name, array in self.datasets]


_NOT_LAYERS = ("dtype", "initializer", "regularizer", "constraint")  # config keys of serialized non-layers


def _serialized_names(value, out: set, depth: int = 0) -> set:
    """The names of every layer serialized inside a config (a wrapper's layer, a model's
    layers, theirs in turn)."""
    if depth > 64:
        return out
    if isinstance(value, dict):
        inner = value.get("config")
        if isinstance(value.get("class_name"), str) and isinstance(inner, dict) and isinstance(inner.get("name"), str):
            out.add(inner["name"])
        for k, v in value.items():
            if not str(k).endswith(_NOT_LAYERS):
                _serialized_names(v, out, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _serialized_names(v, out, depth + 1)
    return out


def _by_layer_name(datasets, spec: Optional[ModelSpec]) -> Optional[Dict[str, list]]:
    """A nested model's flat list split by the layer each weight name starts with, or None where
    the names do not tell. Keras writes a nested model's weights trainable ones first, then the
    rest (a BatchNormalization's moving statistics, every weight of a frozen layer), each part in
    layer order, and names each weight `<layer>/<variable>` (tf.keras: `:0` after, and sometimes
    an enclosing scope before): the names put them back with their layers. A name is read at its
    first part that names a layer of the model, or a layer inside one (a wrapper's, a nested
    model's), which counts for the model's layer holding it."""
    if spec is None:
        return None
    owner: Dict[str, Optional[str]] = {}
    for layer in spec.layers:
        for name in _serialized_names(layer.config, {layer.name}):
            owner[name] = layer.name if owner.get(name, layer.name) == layer.name else None  # None: two claim it
    out: Dict[str, list] = {}
    for name, array in datasets:
        parts = str(name).split("/")
        found = next((owner[p] for p in parts[:-1] if p in owner), None)
        if found is None:
            return None
        out.setdefault(found, []).append((name, array))
    return out


class _PoolSource(WeightSource):
    """A nested model's weights in a legacy file: one flat list, split by weight name where the
    names tell (_by_layer_name), else taken layer by layer in order."""

    def __init__(self, kf, datasets, where, spec: Optional[ModelSpec] = None):
        self.kf, self.datasets, self.where, self.pos = kf, datasets, where, 0
        self.by_name = _by_layer_name(datasets, spec)

    def for_layer(self, layer: LayerSpec) -> LayerWeights:
        if self.by_name is not None:
            return _FlatLayer(self.kf, layer.name, self.by_name.get(layer.name, []), self.where)
        source = self

        class _Slice(LayerWeights):
            def take(self, groups, shapes=None, order=None):
                n = sum(c for _, c in groups)
                chunk = source.datasets[source.pos : source.pos + n]
                if len(chunk) < n:
                    raise ConversionError(source.kf.path, f"{source.where} runs out of weights at layer '{layer.name}'", layer.name)
                source.pos += n
                return _FlatLayer(source.kf, layer.name, chunk, source.where).take(groups, shapes, order)

            def child_source(self, spec, sub=""):
                return source

            def take_all(self):
                raise ConversionError(source.kf.path, f"{source.where} keeps a nested model's weights in one list: "
                                                      "where a custom layer's weights end cannot be told", layer.name)

        return _Slice()


class LegacySource(WeightSource):
    def __init__(self, kf: KerasFile, spec: Optional[ModelSpec]):
        self.kf = kf
        self.names = kf.layer_names
        self.groups = kf.layer_weights
        self.by_order: Dict[str, str] = {}

    def match_by_order(self, weighted_layers: List[str]) -> None:
        """Weights-only Keras 2 files are loaded by order of the layers that have weights."""
        with_weights = [n for n in self.names if self.groups[n]]
        if len(with_weights) != len(weighted_layers):
            raise ConversionError(self.kf.path, f"the file has weights for {len(with_weights)} layers "
                                                f"({few(with_weights)}); the model has {len(weighted_layers)} "
                                                f"({few(weighted_layers)})")
        self.by_order = dict(zip(weighted_layers, with_weights))

    def for_layer(self, layer: LayerSpec) -> LayerWeights:
        name = self.by_order.get(layer.name, layer.name)
        return _FlatLayer(self.kf, layer.name, self.groups.get(name, []), f"group '{name}'")


def weight_source(kf: KerasFile, spec: ModelSpec) -> WeightSource:
    return Keras3Source(kf, spec) if kf.layout == "keras3" else LegacySource(kf, spec)


class RecordingSource(WeightSource):
    """Wraps a source and keeps every array a builder took, by layer path, so a conversion can
    be saved and rebuilt later without the Keras file (ReplaySource)."""

    def __init__(self, inner: WeightSource, records: Dict[str, list], prefix: str = ""):
        self.inner, self.records, self.prefix = inner, records, prefix

    def for_layer(self, layer: LayerSpec) -> LayerWeights:
        inner = self.inner.for_layer(layer)
        key = f"{self.prefix}{layer.name}"
        records = self.records

        class _Recorded(LayerWeights):
            def take(self, groups, shapes=None, order=None):
                got = inner.take(groups, shapes, order)
                records.setdefault(key, []).append([[np.asarray(a) for a in g] for g in got])
                return got

            def child_source(self, spec, sub=""):
                return RecordingSource(inner.child_source(spec, sub), records, f"{key}/")

            def take_all(self):
                got = inner.take_all()
                records.setdefault(key, []).append([[np.asarray(a) for a in got]])
                return got

            def vocabulary(self):  # the asset's UTF-8 bytes as float32 (a converted file holds float arrays)
                got = inner.vocabulary()
                if got is not None:
                    records.setdefault(key, []).append([[np.frombuffer("\n".join(got).encode("utf-8"), np.uint8).astype(np.float32)]])
                return got

        return _Recorded()


class ReplaySource(WeightSource):
    """Serves the arrays a RecordingSource kept, in the order they were taken."""

    def __init__(self, records: Dict[str, list], path: str, prefix: str = ""):
        self.records, self.path, self.prefix = records, path, prefix
        self.used: Dict[str, int] = {}

    def for_layer(self, layer: LayerSpec) -> LayerWeights:
        key = f"{self.prefix}{layer.name}"
        source = self

        class _Replayed(LayerWeights):
            def _next(self):
                takes = source.records.get(key, [])
                i = source.used.get(key, 0)
                if i >= len(takes):
                    raise ConversionError(source.path, "the converted file has no weights for this layer", layer.name)
                source.used[key] = i + 1
                return takes[i]

            def take_all(self):
                got = self._next()
                if len(got) != 1:
                    raise ConversionError(source.path, "the converted file holds this layer's weights in "
                                                       f"{len(got)} groups; a custom layer takes one", layer.name)
                return [np.asarray(a) for a in got[0]]

            def take(self, groups, shapes=None, order=None):  # (recorded in Keras order)
                takes, i = source.records.get(key, []), source.used.get(key, 0)
                got = takes[i] if i < len(takes) else None
                if got is None or [len(g) for g in got] != [n for _, n in groups]:
                    # (not consumed: a builder may ask again with other counts)
                    raise ConversionError(source.path, f"the converted file holds {[len(g) for g in got or []]} "
                                                       f"weights; the config implies {[n for _, n in groups]}", layer.name)
                source.used[key] = i + 1
                return [[np.asarray(a) for a in g] for g in got]

            def child_source(self, spec, sub=""):
                return ReplaySource(source.records, source.path, f"{key}/")

            def vocabulary(self):
                got = self._next()
                if len(got) != 1 or len(got[0]) != 1 or np.ndim(got[0][0]) != 1:
                    raise ConversionError(source.path, "the converted file holds no vocabulary for this layer", layer.name)
                codes = np.asarray(got[0][0])
                if not np.all((codes >= 0) & (codes <= 255) & (codes == np.round(codes))):
                    raise ConversionError(source.path, "the converted file's vocabulary is not text", layer.name)
                try:
                    return asset_lines(bytes(codes.astype(np.uint8)).decode("utf-8"))
                except UnicodeDecodeError:
                    raise ConversionError(source.path, "the converted file's vocabulary is not UTF-8", layer.name) from None

        return _Replayed()
