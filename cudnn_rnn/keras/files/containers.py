"""Keras containers (the `.keras` zip or its unzipped directory, HDF5 `.weights.h5`, sharded
`.weights.json` and legacy `.h5`, tf.keras 2's SavedModel directories and TensorFlow weights
checkpoints) as plain data.

`open_keras_file` hands a file to the parser boundary (untrusted.py, run in a helper process by
isolation.py; the TensorFlow formats to tf_formats.py's decoders) and builds a KerasFile from what
comes back: the config (JSON parsed here with size,
node and depth limits), the Keras version, and every weight as a numpy array keyed by its place in
the file. Nothing is ever unpickled, and no HDF5 object is left open.
"""
from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import ConversionError
from .isolation import parse_file
from .tf_formats import checkpoint_parts, checkpoint_prefix, inside, is_saved_model, open_inside, saved_model_parts
from .untrusted import MAX_ASSET_BYTES, MAX_ASSETS, MAX_CONFIG_BYTES, MAX_METADATA_BYTES, ParseError

MAX_JSON_NODES = 2_000_000
MAX_JSON_DEPTH = 100

_DTYPES = {np.dtype(t).str: np.dtype(t) for t in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")}


@dataclass
class KerasFile:
    """What a Keras file holds: the model config (None for weights-only files), the Keras
    version that wrote it, which layout the weights use, and the weights themselves.

    layout "keras3" (layers/<name>/vars/i): `arrays` maps each dataset's path to its array and
    `groups` lists every group path; layout "legacy" (layer_names / weight_names): `layer_names`
    in file order and `layer_weights[name]` the (weight name, array) pairs in weight_names order."""

    path: str
    config: Optional[Dict[str, Any]]
    keras_version: Optional[str]
    layout: Optional[str]
    # the backend of the Keras that wrote it, where the file says (legacy .h5, model.to_json())
    backend: Optional[str] = None
    arrays: Dict[str, np.ndarray] = field(default_factory=dict)
    groups: frozenset = frozenset()
    layer_names: List[str] = field(default_factory=list)
    layer_weights: Dict[str, List[Tuple[str, np.ndarray]]] = field(default_factory=dict)
    assets: Dict[str, str] = field(default_factory=dict)  # .keras: assets/<layer path>/vocabulary.txt
    # a tf.keras SavedModel's stateful recurrent layers: their states when saved, by layer name
    # ((path below the layer: "states/0", "forward_layer/states/1", ..., array) pairs)
    layer_states: Dict[str, List[Tuple[str, np.ndarray]]] = field(default_factory=dict)


def load_json(path, text: str, what: str):
    """JSON from an untrusted text: bounded size, node count and depth; valid Unicode only."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConversionError(path, f"{what} exceeds {MAX_CONFIG_BYTES} bytes")
    if text.count("{") + text.count("[") + text.count(",") > MAX_JSON_NODES:
        raise ConversionError(path, f"{what} holds more than {MAX_JSON_NODES} values")
    # nesting depth from the brackets outside strings, before the parser recurses into them
    brackets = _NOT_BRACKET.sub("", _STRINGS.sub("", text))
    if len(brackets) > MAX_JSON_DEPTH and max(accumulate(1 if c in "[{" else -1 for c in brackets)) > MAX_JSON_DEPTH:
        raise ConversionError(path, f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ConversionError(path, f"{what} nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as e:  # JSONDecodeError, and integers beyond Python's digit limit
        raise ConversionError(path, f"{what} is not valid JSON: {str(e)[:200]}") from None
    if _SURROGATE.search(text):  # an escaped surrogate: fine in a pair, refused alone
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ConversionError(path, f"{what} holds a string that is not valid Unicode (a lone surrogate)") from None
    if _RAW_SURROGATE.search(text):  # a str handed in by the caller (architecture=...)
        raise ConversionError(path, f"{what} holds a string that is not valid Unicode (a lone surrogate)")
    return value


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_RAW_SURROGATE = re.compile("[\ud800-\udfff]")


def check_array(path, name: str, array: np.ndarray, layer: str, expected_shape=None) -> np.ndarray:
    """A weight as a float array (float64 kept, everything else float32), its shape checked."""
    shape = tuple(array.shape)
    if expected_shape is not None and shape != tuple(expected_shape):
        raise ConversionError(path, f"weight {name} has shape {shape}; the config implies {tuple(expected_shape)}", layer)
    if array.dtype == np.float64 or array.dtype == np.float32:
        return array
    return array.astype(np.float32)


def _directory_message(path: str) -> str:
    """What a directory handed in as a checkpoint is, and what to hand in instead."""
    try:
        names = set(os.listdir(path))
    except OSError:
        names = set()
    if names & {"saved_model.pb", "saved_model.pbtxt", "keras_metadata.pb"}:
        return "is a TensorFlow SavedModel directory (cudnn_rnn.load_keras converts it), not a converted model"
    files = sorted(n for n in names if n.endswith((".keras", ".h5", ".hdf5")))
    hint = f" (it holds {', '.join(files[:3])}{', ...' if len(files) > 3 else ''})" if files else ""
    prefixes = sorted(n[:-len(".index")] for n in names if n.endswith(".index"))
    if prefixes and not files:
        hint = (f" (it holds a TensorFlow checkpoint: pass its prefix, "
                f"{os.path.join(path, prefixes[0])!r}, with architecture=)")
    return f"is a directory; expected a Keras file: .keras, .weights.h5 or .h5, a SavedModel directory{hint}"


def open_regular(path: str):
    """The file opened for reading, if it is a regular file (a FIFO or a device would block or
    never end)."""
    if "\0" in path:
        raise ConversionError(path, "cannot be opened (a NUL character in the path)")
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise ConversionError(path, _directory_message(path))
        if not stat.S_ISREG(mode):
            raise ConversionError(path, "is not a regular file")
        return open(path, "rb")
    except OSError as e:
        raise ConversionError(path, f"cannot be opened ({e.strerror})") from None


def open_keras_file(path, config_only: bool = False) -> KerasFile:
    """Opens any Keras container. Weights-only files have config None; with config_only, no
    weights are read (a .keras archive's vocabularies are)."""
    path = os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
    if is_saved_model(path):
        config, version, backend, names, weights, states = saved_model_parts(path, load_json, config_only)
        return KerasFile(path, config, version, "legacy", backend, layer_names=names, layer_weights=weights,
                         layer_states=states)
    prefix = checkpoint_prefix(path)
    if prefix is not None:  # weights only, layers matched by order
        names, weights = ([], {}) if config_only else checkpoint_parts(prefix, path)
        return KerasFile(path, None, None, "legacy", None, layer_names=names, layer_weights=weights)
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        return _unzipped_keras(path, config_only)
    if path.endswith(".weights.json"):
        return _sharded_weights(path, config_only)
    f = open_regular(path)
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            header, blob = parse_file(f, size, config_only)
        except ParseError as e:
            raise ConversionError(path, e.message, e.layer) from None
        except OSError as e:
            raise ConversionError(path, f"cannot be read ({e.strerror or e})") from None
    return _keras_file(path, header, blob)


def _read_text(path: str, where: str, what: str, limit: int, root: Optional[str], too_long: str = "") -> str:
    """A text file of the checkpoint `where`, inside the directory root (None: the file the user
    named)."""
    with (open_regular(path) if root is None else open_inside(path, root, where, what)) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ConversionError(where, too_long or f"{what} exceeds {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(where, f"{what} is not UTF-8 text ({e})") from None


def _keras3_weights(path: str, where: str, what: str, root: str) -> KerasFile:
    weights = open_keras_file(inside(path, root, where, what))
    if weights.layout != "keras3" or weights.config is not None:
        raise ConversionError(where, f"{what} is not a Keras 3 weights file (layers/<name>/vars/<i>)")
    return weights


def _unzipped_keras(path: str, config_only: bool) -> KerasFile:
    """Keras 3's unzipped model directory (model.save("dir", zipped=False)): the members of a
    .keras archive as files."""
    header = {"container": "zip", "config": _read_text(os.path.join(path, "config.json"), path, "config.json",
                                                         MAX_CONFIG_BYTES, path)}
    if os.path.exists(os.path.join(path, "metadata.json")):
        header["metadata"] = _read_text(os.path.join(path, "metadata.json"), path, "metadata.json", MAX_METADATA_BYTES,
                                        path)
    kf = _keras_file(path, header, bytearray())
    kf.assets = _vocabularies(path)
    if config_only:
        return kf
    if not os.path.exists(os.path.join(path, "model.weights.h5")):
        raise ConversionError(path, "has no model.weights.h5 (npz weights are not supported)")
    weights = _keras3_weights(os.path.join(path, "model.weights.h5"), path, "model.weights.h5", path)
    kf.layout, kf.arrays, kf.groups = "keras3", weights.arrays, weights.groups
    return kf


def _vocabularies(path: str) -> Dict[str, str]:
    """assets/<layer path>/vocabulary.txt of an unzipped model directory, as a .keras archive's
    are read: at most MAX_ASSETS of them and MAX_ASSET_BYTES together; the walk itself bounded."""
    assets: Dict[str, str] = {}
    total, seen = 0, 0
    top = os.path.join(path, "assets")
    if not os.path.isdir(top):
        return assets
    inside(top, path, path, "assets/")

    def failed(error: OSError):
        raise ConversionError(path, f"assets/ cannot be read ({error.strerror})")

    for root, dirs, files in os.walk(top, onerror=failed):  # (links to folders are not followed)
        seen += len(dirs) + len(files)
        if seen > 100 * MAX_ASSETS:
            raise ConversionError(path, f"assets/ holds more than {100 * MAX_ASSETS} entries")
        if "vocabulary.txt" in files:
            if len(assets) == MAX_ASSETS:
                raise ConversionError(path, f"assets/ holds more than {MAX_ASSETS} vocabularies")
            name = os.path.relpath(os.path.join(root, "vocabulary.txt"), path).replace(os.sep, "/")
            text = _read_text(os.path.join(root, "vocabulary.txt"), path, name, MAX_ASSET_BYTES - total, path,
                              f"the vocabularies in assets/ exceed {MAX_ASSET_BYTES} bytes together")
            total += len(text.encode("utf-8"))
            assets[name] = text
    return assets


MAX_SHARD_FILES = 10_000  # the shard files a sharded weights map (.weights.json) may name


def _sharded_weights(path: str, config_only: bool) -> KerasFile:
    """Keras 3's sharded weights (model.save_weights("w.weights.json", max_shard_size=...)): a JSON
    map naming the .weights.h5 shards beside it, whose trees together are one weights file; the
    shards that hold only optimizer variables are not read."""
    kf = KerasFile(path, None, None, "keras3")
    if config_only:
        return kf
    folder = os.path.dirname(path) or "."
    index = load_json(path, _read_text(path, path, "the shard map", MAX_CONFIG_BYTES, None), "the shard map")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ConversionError(path, "is not a Keras sharded-weights map (no weight_map object)")
    shards: Dict[str, None] = {}  # (in order, each once)
    for key, files in weight_map.items():
        for name in files if isinstance(files, list) else [files]:
            if not isinstance(name, str) or not name.endswith(".weights.h5") or os.path.basename(name) != name \
                    or "\\" in name or "\0" in name or name.startswith("."):
                raise ConversionError(path, f"names the shard {str(name)[:80]!r}; expected a .weights.h5 file name "
                                            "beside the map")
            # (a trained model's optimizer variables may fill shards of their own: not read)
            if not (isinstance(key, str) and key.lstrip("/").startswith("optimizer/")):
                shards[name] = None
            if len(shards) > MAX_SHARD_FILES:
                raise ConversionError(path, f"names more than {MAX_SHARD_FILES} shards")
    if not shards:
        raise ConversionError(path, "names no shards")
    for name in shards:
        shard = _keras3_weights(os.path.join(folder, name), path, f"shard {name}", folder)
        twice = kf.arrays.keys() & shard.arrays.keys()
        if twice:
            raise ConversionError(path, f"shard {name} holds {sorted(twice)[0]} again")
        kf.arrays.update(shard.arrays)
        kf.groups = kf.groups | shard.groups
    return kf


def _keras_file(path: str, header: dict, blob: bytearray) -> KerasFile:
    from_zip = header.get("container") == "zip"
    what = "config.json" if from_zip else "the model config"
    config = load_json(path, header["config"], what) if header.get("config") is not None else None
    if header.get("container") == "json":  # model.to_json(): the version beside the config
        if not isinstance(config, dict) or "class_name" not in config:
            raise ConversionError(path, "the JSON does not describe a Keras model (no class_name)")
        version = config.get("keras_version")
        header = dict(header, backend=config.get("backend"))
    elif from_zip:
        if not isinstance(config, dict) or "class_name" not in config:
            raise ConversionError(path, "config.json does not describe a Keras object (no class_name)")
        metadata = load_json(path, header["metadata"], "metadata.json") if header.get("metadata") is not None else None
        version = metadata.get("keras_version") if isinstance(metadata, dict) else None
    else:
        version = header.get("keras_version")
    if version is not None and not isinstance(version, str):
        version = None
    backend = header.get("backend")
    kf = KerasFile(path, config, version, header.get("layout"), backend if isinstance(backend, str) else None)
    assets = header.get("assets") or {}
    if not isinstance(assets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in assets.items()):
        raise ConversionError(path, "the parser's assets are malformed")
    kf.assets = dict(assets)
    arrays = [_array(path, blob, entry) for entry in header.get("arrays", ())]
    if kf.layout == "keras3":
        kf.arrays = {entry[0]: a for entry, a in zip(header["arrays"], arrays)}
        kf.groups = frozenset(header.get("groups", ()))
    elif kf.layout == "legacy":
        kf.layer_names = list(header["layer_names"])
        kf.layer_weights = {name: [(w, arrays[i]) for w, i in pairs] for name, pairs in header["layer_weights"].items()}
    return kf


def _array(path, blob: bytearray, entry) -> np.ndarray:
    key, dtype, shape, offset = entry
    dt = np.dtype("u2") if dtype == "bfloat16" else _DTYPES.get(dtype)  # bfloat16: its 16-bit patterns
    if dt is None or any(not isinstance(d, int) or d < 0 for d in shape):
        raise ConversionError(path, f"the parser returned a malformed entry for {key}")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if offset < 0 or offset + count * dt.itemsize > len(blob):
        raise ConversionError(path, f"the parser returned a malformed entry for {key}")
    array = np.frombuffer(blob, dtype=dt, count=count, offset=offset).reshape(shape)
    # a bfloat16 value is the top half of the float32 with the same bits: exact
    return (array.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else array


__all__ = ["KerasFile", "open_keras_file", "open_regular", "load_json", "check_array"]
