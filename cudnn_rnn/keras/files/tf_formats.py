"""tf.keras 2's SavedModel directory (`model.save("dir")`) and TensorFlow weights
checkpoint (`model.save_weights("ckpt")`) as a KerasFile's parts.

Read without TensorFlow, and without the traced graphs in saved_model.pb:
- `keras_metadata.pb` (a SavedMetadata message): one JSON document per Keras object, keyed by its
  node id in the object graph; the root's holds the model config (`model_config`, tuples written
  as {"class_name": "__tuple__", "items": [...]}), `keras_version` and `backend`. TensorFlow
  before 2.5 kept the same documents in saved_model.pb, in each Keras object's node of the
  object graph (read only there, and only then).
- `variables/variables.index`, a LevelDB table (footer, index block, data blocks of
  prefix-compressed keys) mapping each checkpoint key to a BundleEntryProto (dtype, shape, shard,
  offset, size), and `variables/variables.data-SSSSS-of-NNNNN`, the tensors' raw bytes.
- The checkpoint's object graph (the `_CHECKPOINTABLE_OBJECT_GRAPH` string tensor): the root's
  children `layer-K` are the model's layers, each layer's child `variables` lists its weights in
  Keras's `layer.weights` order (the order a legacy .h5 records), and each weight node names its
  checkpoint key.
The result has the legacy .h5 layout (layer names, and each layer's (weight name, array) list).
Everything is read in this process by the bounded decoders below (no native parser is involved):
every length, offset, count and nesting depth is checked against the bytes actually present,
and only the tensors the model's layers list are read.
"""
from __future__ import annotations

import math
import os
import re
import stat
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..errors import ConversionError

MAX_INDEX_BYTES = 256 << 20
MAX_METADATA_BYTES = 256 << 20
MAX_SAVED_MODEL_BYTES = 2 << 30  # (protocol buffers' own limit)
MAX_ENTRIES = 1_000_000
MAX_KEY_BYTES = 4096              # one checkpoint key (a path of object names)
MAX_KEYS_BYTES = 256 << 20        # all of them: prefix compression cannot blow up past this
MAX_DATA_SHARDS = 4096            # a checkpoint's data files (variables.data-K-of-N)
MAX_NODES = 1_000_000             # objects of the object graph
MAX_REFERENCES = 2_000_000        # the fields of all of them together (children, attributes)
MAX_NDIM = 8
MAX_DIM = (1 << 31) - 1
MAX_GRAPH_BYTES = 512 << 20       # the serialized object graph
TABLE_MAGIC = 0xDB4775248B80FB57
GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
# TensorFlow's DataType enum: the numeric ones a Keras weight can hold
_TF_DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "|u1", 5: "<i2", 6: "|i1", 9: "<i8", 14: "bfloat16", 17: "<u2",
              19: "<f2", 22: "<u4", 23: "<u8"}
DT_STRING = 7


class _Bad(Exception):
    """Malformed bytes; the message says where."""


def is_saved_model(path: str) -> bool:
    """Whether path is a SavedModel directory, or one of the files at its top."""
    if os.path.isdir(path):
        return any(os.path.exists(os.path.join(path, n)) for n in ("saved_model.pb", "saved_model.pbtxt",
                                                                 "keras_metadata.pb"))
    return os.path.basename(path) in ("saved_model.pb", "saved_model.pbtxt", "keras_metadata.pb", "fingerprint.pb")


# ------------------------------------------------------------------------------------------------
# protocol buffers' wire format
# ------------------------------------------------------------------------------------------------
def _varint(buf, pos: int, end: int) -> Tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end:
            raise _Bad("a varint runs past its message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Bad("a varint is longer than 10 bytes")


def _fields(buf, start: int = 0, end: Optional[int] = None) -> Iterator[Tuple[int, int, object]]:
    """(field number, wire type, value) of one message: an int for varints and fixed-width
    fields, a (start, end) span of buf for length-delimited ones."""
    end = len(buf) if end is None else end
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise _Bad("a field's length runs past its message")
            value, pos = (pos, pos + length), pos + length
        elif wire == 1 or wire == 5:
            width = 8 if wire == 1 else 4
            if width > end - pos:
                raise _Bad("a fixed-width field runs past its message")
            value, pos = int.from_bytes(buf[pos:pos + width], "little"), pos + width
        else:
            raise _Bad(f"wire type {wire} (groups are not used by these messages)")
        yield number, wire, value


def _text(buf, span) -> str:
    try:
        return bytes(buf[span[0]:span[1]]).decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad("a string is not UTF-8") from None


def _span(wire: int, value, what: str):
    if wire != 2:
        raise _Bad(f"{what} has wire type {wire}; expected a length-delimited field")
    return value


def _number(wire: int, value, what: str) -> int:
    if wire != 0:
        raise _Bad(f"{what} has wire type {wire}; expected a varint")
    return value


# ------------------------------------------------------------------------------------------------
# the LevelDB table of variables.index
# ------------------------------------------------------------------------------------------------
def _block_handle(buf, pos: int, end: int) -> Tuple[int, int, int]:
    offset, pos = _varint(buf, pos, end)
    size, pos = _varint(buf, pos, end)
    return offset, size, pos


def _block(buf, offset: int, size: int) -> Iterator[Tuple[bytes, memoryview]]:
    """The (key, value) entries of one uncompressed block."""
    if offset + size + 5 > len(buf) or size < 4:
        raise _Bad("a block lies outside the index file")
    if buf[offset + size] != 0:
        raise _Bad(f"a block is compressed (type {buf[offset + size]}); TensorFlow writes them uncompressed")
    restarts = int.from_bytes(buf[offset + size - 4:offset + size], "little")
    end = offset + size - 4 * (restarts + 1)
    if restarts == 0 or end < offset:
        raise _Bad("a block's restart array is malformed")
    pos, key = offset, b""
    while pos < end:
        shared, pos = _varint(buf, pos, end)
        unshared, pos = _varint(buf, pos, end)
        length, pos = _varint(buf, pos, end)
        if shared > len(key) or unshared + length > end - pos:
            raise _Bad("a block entry runs past its block")
        if shared + unshared > MAX_KEY_BYTES:
            raise _Bad(f"a key is longer than {MAX_KEY_BYTES} bytes")
        key = key[:shared] + bytes(buf[pos:pos + unshared])
        pos += unshared
        yield key, buf[pos:pos + length]
        pos += length


def read_index(data: bytes) -> Dict[str, Tuple[int, tuple, int, int, int]]:
    """variables.index: checkpoint key -> (dtype code, shape, shard, offset, size); the header's
    shard count under the key ""."""
    buf = memoryview(data)
    if len(buf) < 48 or int.from_bytes(buf[-8:], "little") != TABLE_MAGIC:
        raise _Bad("is not a TensorFlow checkpoint index (no table footer)")
    footer = len(buf) - 48
    _, _, pos = _block_handle(buf, footer, len(buf) - 8)            # metaindex: unused
    index_offset, index_size, _ = _block_handle(buf, pos, len(buf) - 8)
    entries: Dict[str, tuple] = {}
    key_bytes, count, last = 0, 0, None
    for _, handle in _block(buf, index_offset, index_size):
        offset, size, _ = _block_handle(handle, 0, len(handle))
        for key, value in _block(buf, offset, size):
            key_bytes, count = key_bytes + len(key), count + 1
            if count > MAX_ENTRIES or key_bytes > MAX_KEYS_BYTES:
                raise _Bad(f"holds more than {MAX_ENTRIES} entries or {MAX_KEYS_BYTES} bytes of keys")
            if last is not None and key <= last:  # a table's keys are strictly increasing
                raise _Bad("its keys are out of order (a block read twice, or a key repeated)")
            last = key
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError:
                raise _Bad("a checkpoint key is not UTF-8") from None
            entries[name] = _header(value) if name == "" else _entry(value, name)
    if "" not in entries:
        raise _Bad("has no bundle header")
    return entries


def _header(value) -> tuple:
    shards, endianness = 1, 0
    for number, wire, v in _fields(value):
        if number == 1:
            shards = _number(wire, v, "the header's shard count")
        elif number == 2:
            endianness = _number(wire, v, "the header's endianness")
    if endianness != 0:
        raise _Bad("was written big-endian; only little-endian checkpoints are read")
    if not 1 <= shards <= MAX_DATA_SHARDS:
        raise _Bad(f"declares {shards} data shards; expected 1 to {MAX_DATA_SHARDS}")
    return (0, (), shards, 0, 0)


def _entry(value, key: str) -> tuple:
    dtype, shape, shard, offset, size = 0, [], 0, 0, 0
    for number, wire, v in _fields(value):
        if number == 1:
            dtype = _number(wire, v, f"{key}'s dtype")
        elif number == 2:
            s, e = _span(wire, v, f"{key}'s shape")
            for n, w, dim in _fields(value, s, e):
                if n == 2:  # Dim { int64 size = 1; string name = 2; }
                    ds, de = _span(w, dim, f"{key}'s dimension")
                    size_ = 0
                    for n2, w2, d in _fields(value, ds, de):
                        if n2 == 1:
                            size_ = _number(w2, d, f"{key}'s dimension")
                    shape.append(size_)
                    if len(shape) > MAX_NDIM:
                        raise _Bad(f"{key} has more than {MAX_NDIM} dimensions")
                elif n == 3 and _number(w, dim, "unknown_rank"):
                    raise _Bad(f"{key} has an unknown rank")
        elif number == 3:
            shard = _number(wire, v, f"{key}'s shard")
        elif number == 4:
            offset = _number(wire, v, f"{key}'s offset")
        elif number == 5:
            size = _number(wire, v, f"{key}'s size")
        elif number == 7:
            raise _Bad(f"{key} is a partitioned (sliced) variable, which Keras does not write")
    return (dtype, tuple(d if d < 1 << 62 else -1 for d in shape), shard, offset, size)


# ------------------------------------------------------------------------------------------------
# the directory
# ------------------------------------------------------------------------------------------------
def _read_file(path: str, where: str, what: str, limit: int, root: str) -> bytes:
    with open_inside(path, root, where, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ConversionError(where, f"{what} is {size} bytes; more than the {limit} allowed")
        data = f.read(limit + 1)
    if len(data) != size:
        raise ConversionError(where, f"{what} changed while it was read")
    return data


def inside(path: str, root: str, where: str, what: str) -> str:
    """The real path of path (a member `what` of the checkpoint `where`), which links must not
    take outside the directory root: a link cannot bring in a file from elsewhere."""
    try:
        real, top = os.path.realpath(path), os.path.realpath(root)
        within = os.path.commonpath([real, top]) == top
    except ValueError as e:  # a NUL in the name, or paths on different drives
        raise ConversionError(where, f"{what} cannot be opened ({e})") from None
    if not within:
        raise ConversionError(where, f"{what} lies outside {root!r} (a link to {real!r}); refusing it")
    return real


def open_inside(path: str, root: str, where: str, what: str):
    """path (a member `what` of the checkpoint `where`) opened for reading: a regular file inside
    the directory root (inside)."""
    real = inside(path, root, where, what)
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise ConversionError(where, f"{what} is not a regular file")
        return open(real, "rb")
    except FileNotFoundError:
        raise ConversionError(where, f"has no {what}") from None
    except OSError as e:
        raise ConversionError(where, f"{what} cannot be opened ({e.strerror})") from None


class _Checkpoint:
    """A TensorFlow checkpoint: PREFIX.index and its data shards PREFIX.data-SSSSS-of-NNNNN;
    `what` names the prefix in errors (relative to `where`, the path the user gave)."""

    def __init__(self, prefix: str, where: str, what: str, root: str):
        self.prefix, self.where, self.what, self.root = prefix, where, what, root
        try:
            self.index = read_index(_read_file(prefix + ".index", where, what + ".index", MAX_INDEX_BYTES, root))
        except _Bad as e:
            raise ConversionError(where, f"{what}.index: {e}") from None
        self.shards = self.index[""][2]
        self.read: Dict[str, np.ndarray] = {}

    def graph(self):
        return _object_graph(self.tensor(GRAPH_KEY, strings=True))

    def _bytes(self, key: str, strings: bool = False) -> bytes:
        """The entry's bytes from its shard (opened for this read only: a checkpoint may have
        thousands of shards)."""
        entry = self.index.get(key)
        if entry is None or key == "":
            raise _Bad(f"has no tensor {key!r}")
        dtype, shape, shard, offset, size = entry
        if strings and (dtype != DT_STRING or shape != ()):
            raise _Bad(f"{key} is not a string scalar")
        if strings and size > MAX_GRAPH_BYTES:
            raise _Bad(f"{key} is {size} bytes; more than the {MAX_GRAPH_BYTES} allowed")
        if not 0 <= shard < self.shards:
            raise _Bad(f"names data shard {shard} of {self.shards}")
        suffix = f".data-{shard:05d}-of-{self.shards:05d}"
        with open_inside(self.prefix + suffix, self.root, self.where, self.what + suffix) as f:
            file_size = os.fstat(f.fileno()).st_size
            if offset + size > file_size:
                raise _Bad(f"{key} lies past the end of its data file ({offset} + {size} > {file_size} bytes)")
            f.seek(offset)
            raw = f.read(size)
        if len(raw) != size:
            raise _Bad(f"{key} is cut short")
        return raw

    def tensor(self, key: str, strings: bool = False):
        if strings:
            raw = self._bytes(key, strings=True)
            length, pos = _varint(raw, 0, len(raw))
            pos += 4  # the masked CRC32C of the lengths
            if pos + length != len(raw):
                raise _Bad(f"{key}'s string does not fill its entry")
            return memoryview(raw)[pos:]
        if key in self.read:  # (a variable listed again: read once)
            return self.read[key]
        dtype, shape, _, _, size = self.index.get(key) or (None, (), 0, 0, 0)
        if dtype not in _TF_DTYPES:
            raise _Bad(f"{key} has TensorFlow dtype {dtype}; expected a numeric tensor")
        if any(not 0 <= d <= MAX_DIM for d in shape):
            raise _Bad(f"{key} declares shape {shape}: a size outside 0 to {MAX_DIM}")
        numpy_dtype = np.dtype("<u2") if _TF_DTYPES[dtype] == "bfloat16" else np.dtype(_TF_DTYPES[dtype])
        if math.prod(shape) * numpy_dtype.itemsize != size:
            raise _Bad(f"{key} declares shape {shape} but holds {size} bytes")
        array = np.frombuffer(self._bytes(key), dtype=numpy_dtype).reshape(shape)
        if _TF_DTYPES[dtype] == "bfloat16":  # a bfloat16 is the top half of the float32 with its bits
            array = (array.astype(np.uint32) << 16).view(np.float32)
        else:
            array = array.astype(numpy_dtype.newbyteorder("="))
        self.read[key] = array
        return array

    def layers(self, names_of=None):
        """(layer names, {name: [(weight name, array)]}, {name: [(state path, array)]}) of the
        model at the graph's root (or under its one child, as tf.train.Checkpoint(model=...)
        writes it); names_of(node id) gives a layer's name, else the layers are named layer-K.
        The states are a stateful recurrent layer's, where the graph records them (_states)."""
        try:
            graph = self.graph()
            names, keys, states = _layers(graph, names_of)
            return (names, {name: [(w, self.tensor(key)) for w, key in keys[name]] for name in names},
                    {name: [(path, self.tensor(key)) for path, key in states[name]] for name in states})
        except _Bad as e:
            raise ConversionError(self.where, f"the checkpoint {self.what}: {e}") from None


def _given_vocabularies(model: dict, saved: dict, depth: int = 0) -> None:
    """A lookup layer's vocabulary given to its constructor, which the SavedModel's model_config
    writes as null (has_input_vocabulary true) and the root's get_config ("config") keeps: put
    back into the model config, layer by layer name (nested models too)."""
    layers, others = model.get("layers"), saved.get("layers")
    if depth > 16 or not isinstance(layers, list) or not isinstance(others, list):
        return
    by_name = {o["config"]["name"]: o for o in others
               if isinstance(o, dict) and isinstance(o.get("config"), dict) and isinstance(o["config"].get("name"), str)}
    for entry in layers:
        cfg = entry.get("config") if isinstance(entry, dict) else None
        other = by_name.get(cfg.get("name")) if isinstance(cfg, dict) and isinstance(cfg.get("name"), str) else None
        if other is None or other.get("class_name") != entry.get("class_name"):
            continue
        if "layers" in cfg:
            _given_vocabularies(cfg, other["config"], depth + 1)
        elif cfg.get("vocabulary") is None and isinstance(other["config"].get("vocabulary"), list):
            cfg["vocabulary"] = other["config"]["vocabulary"]


def saved_model_parts(path: str, load_json, config_only: bool = False):
    """(config, keras_version, backend, layer_names, layer_weights, layer_states) of the
    SavedModel directory path (or a file at its top); no weights with config_only. load_json(path, text, what) parses
    the metadata's JSON texts (containers.load_json, with its limits)."""
    root = path if os.path.isdir(path) else (os.path.dirname(path) or ".")
    source = "keras_metadata.pb"
    try:
        if os.path.exists(os.path.join(root, source)):
            nodes = _metadata_nodes(_read_file(os.path.join(root, source), root, source, MAX_METADATA_BYTES, root))
        elif os.path.exists(os.path.join(root, "saved_model.pb")):  # TensorFlow before 2.5: in the object graph
            source = "saved_model.pb"
            nodes = _user_object_metadata(_read_file(os.path.join(root, source), root, source, MAX_SAVED_MODEL_BYTES,
                                                       root))
        else:
            source, nodes = "", {}
    except _Bad as e:
        raise ConversionError(root, f"{source}: {e}") from None
    if not nodes and source != "keras_metadata.pb":
        raise ConversionError(root, "is a TensorFlow SavedModel without Keras metadata (no keras_metadata.pb, none in "
                                    "saved_model.pb): not written by Keras's model.save (Keras 3's model.export() "
                                    "and tf.saved_model.save write such directories for serving only)")
    if 0 not in nodes:
        raise ConversionError(root, f"{source} describes no root object")
    meta = load_json(root, nodes[0], f"{source}'s root metadata")
    model_config = meta.get("model_config") if isinstance(meta, dict) else None
    if not isinstance(model_config, dict) or "class_name" not in model_config:
        kind = meta.get("class_name") if isinstance(meta, dict) else None
        raise ConversionError(root, f"holds a Keras object ({str(kind)[:60]}) without a model config: a subclassed "
                                    "model has none (Keras itself needs its Python class to rebuild it)")
    config = untuple(model_config)
    if isinstance(config.get("config"), dict) and isinstance(meta.get("config"), dict):
        _given_vocabularies(config["config"], untuple(meta["config"]))
    version = meta.get("keras_version") if isinstance(meta.get("keras_version"), str) else None
    backend = meta.get("backend") if isinstance(meta.get("backend"), str) else None
    if config_only:
        return config, version, backend, [], {}, {}

    def names_of(node: int) -> Optional[str]:
        layer = load_json(root, nodes[node], "a layer's metadata") if node in nodes else None
        name = layer.get("name") if isinstance(layer, dict) else None
        return name if isinstance(name, str) else None

    names, weights, states = _Checkpoint(os.path.join(root, "variables", "variables"), root, "variables/variables",
                                         root).layers(names_of)
    return config, version, backend, names, weights, states


def checkpoint_prefix(path: str) -> Optional[str]:
    """The prefix of the TensorFlow checkpoint path names (PREFIX.index, or PREFIX itself), if it
    names one."""
    if path.endswith(".index") and os.path.isfile(path):
        return path[:-len(".index")]
    if not os.path.exists(path) and os.path.isfile(path + ".index"):
        return path
    return None


def checkpoint_parts(prefix: str, where: str):
    """(layer names, layer weights) of a TensorFlow weights checkpoint (tf.keras 2's
    model.save_weights("ckpt")): the layers are named layer-K, matched by order."""
    return _Checkpoint(prefix, where, os.path.basename(prefix), os.path.dirname(prefix) or ".").layers()[:2]


def _metadata_nodes(buf) -> Dict[int, str]:
    """keras_metadata.pb: node id -> metadata JSON text (SavedMetadata.nodes: SavedObject {
    node_id = 2; node_path = 3; identifier = 4; metadata = 5; })."""
    out: Dict[int, str] = {}
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        node_id, text = 0, None  # (proto3 leaves zeros out)
        s, e = _span(wire, value, "a node")
        for n, w, v in _fields(buf, s, e):
            if n == 2:
                node_id = _number(w, v, "a node id")
            elif n == 5:
                text = _text(buf, _span(w, v, "a node's metadata"))
        if text is not None:
            out[node_id] = text
        if len(out) > MAX_NODES:
            raise _Bad(f"describes more than {MAX_NODES} objects")
    return out


def _user_object_metadata(buf) -> Dict[int, str]:
    """saved_model.pb as TensorFlow before 2.5 wrote it: node id -> the Keras metadata of each
    Keras object (SavedModel.meta_graphs[0].object_graph_def.nodes[i].user_object, whose
    identifier starts with _tf_keras_, its metadata field)."""
    meta_graph = next((v for n, w, v in _fields(buf) if n == 2 and _span(w, v, "a meta graph")), None)
    if meta_graph is None:
        raise _Bad("holds no meta graph")
    graph = next((v for n, w, v in _fields(buf, *meta_graph) if n == 7 and _span(w, v, "the object graph")), None)
    out: Dict[int, str] = {}
    for node_id, (s, e) in enumerate(v for n, w, v in (_fields(buf, *graph) if graph else ()) if n == 1 and
                                       _span(w, v, "an object")):
        if node_id >= MAX_NODES:
            raise _Bad(f"holds more than {MAX_NODES} objects")
        for n, w, v in _fields(buf, s, e):
            if n != 4:
                continue
            identifier, text = "", None
            for n2, w2, v2 in _fields(buf, *_span(w, v, "a user object")):
                if n2 == 1:
                    identifier = _text(buf, _span(w2, v2, "an identifier"))
                elif n2 == 3:
                    text = _text(buf, _span(w2, v2, "a user object's metadata"))
            if identifier.startswith("_tf_keras_") and text:
                out[node_id] = text
    return out


def untuple(value):
    """A SavedModel metadata config with its encoded tuples ({"class_name": "__tuple__",
    "items": [...]}) and shapes as the lists a .h5 config holds (load_json bounded its depth)."""
    if isinstance(value, dict):
        if value.get("class_name") in ("__tuple__", "TensorShape") and set(value) == {"class_name", "items"}:
            return untuple(value["items"])
        return {k: untuple(v) for k, v in value.items()}
    if isinstance(value, list):
        return [untuple(v) for v in value]
    return value


def _object_graph(buf) -> List[Tuple[List[Tuple[int, str]], Dict[str, str]]]:
    """TrackableObjectGraph: per node, its children (node id, local name) and its attributes
    (name -> checkpoint key, with the full name under "name:" + name)."""
    nodes = []
    references = 0
    for number, wire, value in _fields(buf):
        if number != 1:
            continue
        children, attributes = [], {}
        s, e = _span(wire, value, "an object")
        for n, w, v in _fields(buf, s, e):
            references += 1
            if references > MAX_REFERENCES:
                raise _Bad(f"holds more than {MAX_REFERENCES} references")
            if n == 1:  # ObjectReference { int32 node_id = 1; string local_name = 2; }
                cs, ce = _span(w, v, "a child reference")
                node, name = 0, ""
                for n2, w2, v2 in _fields(buf, cs, ce):
                    if n2 == 1:
                        node = _number(w2, v2, "a child's node id")
                    elif n2 == 2:
                        name = _text(buf, _span(w2, v2, "a child's name"))
                children.append((node, name))
            elif n == 2:  # SerializedTensor { string name = 1; string full_name = 2; string checkpoint_key = 3; }
                a_s, a_e = _span(w, v, "an attribute")
                parts = {}
                for n2, w2, v2 in _fields(buf, a_s, a_e):
                    if n2 in (1, 2, 3):
                        parts[n2] = _text(buf, _span(w2, v2, "an attribute's name"))
                if 1 in parts and 3 in parts:
                    attributes[parts[1]] = parts[3]
                    attributes["name:" + parts[1]] = parts.get(2, "")
        nodes.append((children, attributes))
        if len(nodes) > MAX_NODES:
            raise _Bad(f"holds more than {MAX_NODES} objects")
    return nodes


# children that are not a layer's sub-objects: traced functions, SavedModel views of the same
# variables, optimizer and metric state, random-generator seeds, stateful RNN states
_NOT_WEIGHTS = frozenset(("variables", "trainable_variables", "non_trainable_variables", "regularization_losses",
                          "keras_api", "signatures", "__call__", "call_and_return_all_conditional_losses",
                          "call_and_return_conditional_losses", "_default_save_signature", "optimizer", "metrics",
                          "_random_generator", "states", "state_spec", "save_counter", "layer_metrics",
                          "layer_regularization_losses"))
MAX_DEPTH = 100


def _created(graph, node: int, budget: List[int]) -> List[int]:
    """The variables under node, depth first in child order (each sub-object's creation order);
    each once. Every child looked at is taken from budget[0]."""
    out: List[int] = []
    seen = {node}
    stack = [(node, 0, iter(graph[node][0]))]
    while stack:
        _, depth, children = stack[-1]
        step = next(children, None)
        if step is None:
            stack.pop()
            continue
        budget[0] -= 1
        if budget[0] < 0:
            raise _Bad(f"takes more than {MAX_REFERENCES} steps to walk")
        c, n = step
        if n in _NOT_WEIGHTS or c in seen:
            continue
        if not 0 <= c < len(graph):
            raise _Bad(f"names object {c} of {len(graph)}")
        seen.add(c)
        if "VARIABLE_VALUE" in graph[c][1]:
            out.append(c)
        elif depth + 1 >= MAX_DEPTH:
            raise _Bad(f"nests objects deeper than {MAX_DEPTH} levels")
        else:
            stack.append((c, depth + 1, iter(graph[c][0])))
    return out


_LAYER_CHILD = re.compile(r"layer-(\d{1,9})")
_STATE_SIDES = ("forward_layer", "backward_layer")  # Bidirectional's layers keep their own


def _states(graph, node: int, budget: List[int]) -> List[Tuple[str, str]]:
    """(path, checkpoint key) of each state variable a stateful recurrent layer's object
    records under keras_api/states, as tf.keras 2's SavedModel saves them: "states/0" (h),
    "states/1" (c); a stack of cells' "states/<cell>" or "states/<cell>/<k>"; a Bidirectional's
    "forward_layer/states/0", ...; at most 64 of them. Every child looked at is taken from
    budget[0]."""
    out: List[Tuple[str, str]] = []

    def spend(children):
        budget[0] -= len(children)
        if budget[0] < 0:
            raise _Bad(f"takes more than {MAX_REFERENCES} steps to walk")
        return children

    def walk(n: int, path: str, depth: int):
        for c, name in spend(graph[n][0]):
            if not 0 <= c < len(graph) or len(out) >= 64:
                continue
            if depth == 0 and name in _STATE_SIDES:
                walk(c, f"{name}/", 1)
            elif name == "keras_api" and depth < 2:
                for s, sub in spend(graph[c][0]):
                    if sub == "states" and 0 <= s < len(graph):
                        collect(s, f"{path}states", 0)

    def collect(n: int, path: str, depth: int):
        for c, name in spend(graph[n][0]):
            if not 0 <= c < len(graph) or not name.isdigit() or len(name) > 3 or len(out) >= 64:
                continue
            if "VARIABLE_VALUE" in graph[c][1]:
                out.append((f"{path}/{name}", graph[c][1]["VARIABLE_VALUE"]))
            elif depth < 1:
                collect(c, f"{path}/{name}", depth + 1)

    walk(node, "", 0)
    return out


def _layers(graph, names_of=None):
    """The model's layers in order (the root's `layer-K` children), each with its (weight name,
    checkpoint key) list: from its `variables` child (layer.weights, as a SavedModel with traces
    records it), else from its sub-objects; and the recorded states of those that have them
    (_states)."""
    if not graph:
        raise _Bad("has an empty object graph")

    def checked(node: int) -> int:
        if not 0 <= node < len(graph):
            raise _Bad(f"names object {node} of {len(graph)}")
        return node

    model = 0
    if not any(_LAYER_CHILD.fullmatch(n) for _, n in graph[0][0]):
        # a tf.train.Checkpoint(model=..., step=tf.Variable(...), optimizer=...): the one child that
        # holds layers (a counter or an optimizer beside it holds none)
        below = [(checked(c), n) for c, n in graph[0][0] if n not in _NOT_WEIGHTS and c != 0]
        models = [(c, n) for c, n in below if any(_LAYER_CHILD.fullmatch(m) for _, m in graph[c][0])]
        if len(models) > 1:
            raise _Bad(f"holds several Keras models ({', '.join(repr(n[:40]) for _, n in models[:4])}); expected one")
        if not models:
            raise _Bad("holds no Keras model (no layer-K objects at its root)")
        model = models[0][0]
    numbered = sorted((int(m.group(1)), checked(c)) for c, n in graph[model][0] for m in [_LAYER_CHILD.fullmatch(n)]
                      if m)
    names: List[str] = []
    weights: Dict[str, List[Tuple[str, str]]] = {}
    states: Dict[str, List[Tuple[str, str]]] = {}
    layers, budget = {model}, [MAX_REFERENCES]  # (the objects walked, over all layers)
    for k, node in numbered:
        if node in layers:
            raise _Bad(f"layer-{k} is object {node}, which is the model or another layer")
        layers.add(node)
        name = names_of(node) if names_of is not None else f"layer-{k}"
        if name is None or name in weights:
            raise _Bad(f"layer object {node} has {'a repeated' if name in weights else 'no'} name in keras_metadata.pb")
        listed = [checked(c) for c, n in graph[node][0] if n == "variables"]
        if listed:  # layer.weights, in order
            variables, once = [], set()
            for index, (variable, local) in enumerate(graph[listed[0]][0]):
                if local != str(index) or checked(variable) in once:
                    raise _Bad(f"layer {name}'s variable list is malformed (out of order, or a variable twice)")
                variables.append(variable)
                once.add(variable)
            budget[0] -= len(variables)
        else:  # written without traces: each sub-object's weights in creation order
            variables = _created(graph, node, budget)
        if budget[0] < 0:
            raise _Bad(f"lists more than {MAX_REFERENCES} weights over all layers")
        pairs = []
        for variable in variables:
            attributes = graph[variable][1]
            if "VARIABLE_VALUE" not in attributes:
                raise _Bad(f"layer {name}'s variable object {variable} has no saved value")
            pairs.append((attributes["name:VARIABLE_VALUE"] + ":0", attributes["VARIABLE_VALUE"]))
        names.append(name)
        weights[name] = pairs
        _layer_states(graph, node, name, names_of, budget, states, 0)
    return names, weights, states


def _layer_states(graph, node: int, name: str, names_of, budget: List[int], states: dict, depth: int) -> None:
    """The kept states of the layer at node (_states), and those of the layers of a model nested
    there (its layer-K children, named "<model>/<layer>" by their metadata), into states."""
    held = _states(graph, node, budget)
    if held:
        states[name] = held
    if depth >= 4 or names_of is None:
        return
    for c, n in graph[node][0]:
        if _LAYER_CHILD.fullmatch(n) and 0 <= c < len(graph) and c != node:
            inner = names_of(c)
            if inner is not None:
                _layer_states(graph, c, f"{name}/{inner}", names_of, budget, states, depth + 1)


__all__ = ["is_saved_model", "saved_model_parts", "checkpoint_prefix", "checkpoint_parts", "read_index", "untuple",
           "inside", "open_inside"]
