"""A seeded mutation fuzzer for the checkpoint loaders (load_keras, load_converted).

It mutates real Keras-written files (the committed fixtures, and a converted .pt made from one)
at every level: bytes (flips, truncation, zeroed / duplicated / deleted ranges), zip (header
size and CRC lies, compression methods, encryption flags, bombs, duplicated and traversal
members), HDF5 (shapes, dtypes, opaque data as Keras writes bfloat16 and lies about its size or
tag, huge declared datasets, soft / external / cyclic links, external
raw storage and virtual datasets pointing at a canary file, duplicated layer_names, filters) and
the config JSON (type confusion, depth, huge and non-finite numbers, lone surrogates, unknown
names). hypothesis draws every choice, so a run is reproducible from its seed.

Each mutant is loaded in a worker process (a fresh one after a hang or a crash), then, if it
loaded, called once on inputs of its declared shape and on the fixture's own inputs. Outcomes:
  clean      loaded and ran
  refused    cudnn_rnn.ConversionError
  escape     any other exception from the loader          (a failure)
  first-call loaded, then failed on its first call        (a failure)
  domain     ran on inputs of its declared shape; the fixture's own inputs then fall outside
             what the mutated config accepts (a vocabulary lost a token: ids out of an
             Embedding's range), refused by that layer's own check with its message
  outside    loaded although it reads data outside the file (a failure)
  memory     the worker or the parser helper grew by more than MEMORY_LIMIT (a failure)
  hang       no answer within the time limit              (a failure)
  crash      the worker died                              (a failure)

    python -m tests.fuzz_checkpoints --minutes 30 [--seed N] [--save DIR]   # the long run
The test suite (tests/test_fuzz_checkpoints.py) runs a short budget.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "fixtures", "data")
MEMORY_LIMIT = 1 << 30
MUTANT_TIMEOUT_S = 20.0
PARSE_TIMEOUT_S = "2"      # the loader's own limit inside the worker: hangs end as ConversionError
CANARY = struct.pack("<4f", 1234.5, -4321.25, 777.0, 31337.0) * 64   # what must never be read

# (name, file, architecture, fixture npz, loader)
BASES = [
    ("keras-sequential", "k3_sequential.keras", None, "k3_sequential.npz", "keras"),
    ("keras-functional", "k3_functional.keras", None, "k3_functional.npz", "keras"),
    ("keras-lookup", "k3_lookup.keras", None, "k3_lookup.npz", "keras"),   # a vocabulary asset
    ("legacy-tf-ops", "tfk_tf_ops.h5", None, "tfk_tf_ops.npz", "keras"),    # recorded TensorFlow calls
    ("legacy-layers", "tfk_layers.h5", None, "tfk_layers.npz", "keras"),    # the layer library, tf.keras
    ("legacy-k3", "k3_functional.h5", None, "k3_functional.npz", "keras"),
    ("legacy-tfk", "tfk_sequential.h5", None, "tfk_sequential.npz", "keras"),
    ("legacy-cudnn", "tfk_cudnn.h5", None, "tfk_cudnn.npz", "keras"),
    ("weights-k3", "k3_sequential.weights.h5", "k3_sequential.keras", "k3_sequential.npz", "keras"),
    ("weights-legacy", "tfk_sequential_weights.h5", "tfk_sequential.json", "tfk_sequential.npz", "keras"),
    ("converted", "k3_functional.pt", None, "k3_functional.npz", "converted"),
    # tf.keras's constant arguments, nested nodes, several-output calls; its .keras zip; its
    # versionless weights-only file read with a JSON architecture
    ("legacy-more-tf-ops", "tfk_more_tf_ops.h5", None, "tfk_more_tf_ops.npz", "keras"),
    ("tfk-zip-tf-ops", "tfk_more_tf_ops.keras", None, "tfk_more_tf_ops.npz", "keras"),
    ("weights-tfk-v3", "tfk_stacked_states.weights.h5", "tfk_stacked_states.json", "tfk_stacked_states.npz", "keras"),
    # keras.applications' own classes (LayerScale, StochasticDepth, CustomScaleLayer), both Kerases
    ("k3-applications", "k3_applications_layers.keras", None, "k3_applications_layers.npz", "keras"),
    ("k3-operations", "k3_operations.keras", None, "k3_operations.npz", "keras"),
    ("k3-updates-transforms", "k3_updates_transforms.keras", None, "k3_updates_transforms.npz", "keras"),
    ("legacy-tf-calls", "tfk_tf_calls.h5", None, "tfk_tf_calls.npz", "keras"),
    ("legacy-tf-gathers-losses", "tfk_tf_gathers_losses.h5", None, "tfk_tf_gathers_losses.npz", "keras"),
    ("legacy-applications", "tfk_applications_layers.h5", None, "tfk_applications_layers.npz", "keras"),
    # an image preprocessing layer whose numbers follow the backend the file records
    ("legacy-clahe", "k3_clahe.h5", None, "k3_clahe.npz", "keras"),
    # string inputs: TextVectorization and StringLookup with vocabulary assets
    ("keras-text", "k3_text.keras", None, "k3_text.npz", "keras"),
    # string and integer features hashed and crossed (HashedCrossing, Hashing), tf.keras 2's .h5
    ("legacy-crossing", "tk_crossing.h5", None, "tk_crossing.npz", "keras"),
    # salted hashes (SipHash keyed by a config's salt) in Hashing and the lookups' OOV indices
    ("keras-salted-hashing", "k3_salted_hashing.keras", None, "k3_salted_hashing.npz", "keras"),
    # a FeatureSpace's graph: dict inputs, its own TFDConcat beside the preprocessing layers
    ("keras-feature-space", "k3_feature_space.keras", None, "k3_feature_space.npz", "keras"),
    # integer and uint8 / int8 inputs into float layers and TensorFlow reductions, an explicit
    # mask list with a None (tf.keras 2's Attention)
    ("legacy-int-inputs", "tfk_int_inputs.h5", None, "tfk_int_inputs.npz", "keras"),
    # dict inputs of one value per example (float, string, int64) through lookups without OOV
    # indices and a TextVectorization; a dict of outputs
    ("keras-scalar-inputs", "k3_scalar_inputs.keras", None, "k3_scalar_inputs.npz", "keras"),
    # models built on dicts, one inside the other (called on a dict in another key order), the
    # outer one's outputs a dict holding a list: Keras 3 and tf.keras 2
    ("keras-nested-dicts", "k3_nested_dicts.keras", None, "k3_nested_dicts.npz", "keras"),
    ("legacy-nested-dicts", "tfk_nested_dicts.h5", None, "tfk_nested_dicts.npz", "keras"),
    # layer names a ModuleDict cannot hold as they are ("a.b" beside "a_b", "keys", "to")
    ("legacy-layer-names", "tfk_layer_names.h5", None, "tfk_layer_names.npz", "keras"),
    # layers Keras's quantize() rewrote: int4 / int8 / float8 kernels, scales, zero points, groups
    ("keras-quantized", "k3_quantized.keras", None, "k3_quantized.npz", "keras"),
    # tf.keras 2's LocallyConnected1D / 2D (dense masked and per-position kernels), RandomFourierFeatures
    ("legacy-locally-connected", "tfk_locally_connected.h5", None, "tfk_locally_connected.npz", "keras"),
    # Keras 3.13's int4 (packed along the summed axis) and Keras 3.9's keras.ops call arguments
    ("keras313-int4", "k3.13.2_int4_row_packed.keras", None, "k3.13.2_int4_row_packed.npz", "keras"),
    ("keras39-ops", "k3.9.2_ops_call_args.keras", None, "k3.9.2_ops_call_args.npz", "keras"),
    # Keras 3's save_weights of the text model, its vocabularies read from the .keras architecture
    ("weights-k3-text", "k3_text.weights.h5", "k3_text.keras", "k3_text.npz", "keras"),
    # the weights tree as tf.keras 2.13-2.15 wrote it on Windows (groups at the root, named with
    # backslashes): made from k3_sequential.keras when the seeds are prepared
    ("windows-tree", "k3_sequential.keras", None, "k3_sequential.npz", "windows"),
]


# ------------------------------------------------------------------------------------------------
# mutations: each takes (bytes of the file, draw) and returns (new bytes, description, must_refuse)
# `draw` is a hypothesis `data.draw`; strategies come from hypothesis.strategies
# ------------------------------------------------------------------------------------------------
def _st():
    from hypothesis import strategies as st

    return st


def _int(draw, lo, hi, label):
    return draw(_st().integers(lo, hi), label=label)


def _pos(ctx, n: int) -> int:
    """A position in a file of n bytes, uniform (hypothesis's integers favour the small ones)."""
    return ctx["rng"].randrange(max(n, 1))


def _nonempty(fn):
    def mutate(data: bytes, draw, ctx):
        return fn(data, draw, ctx) if data else (b"\xff", "an empty file given one byte", False)

    mutate.__name__ = fn.__name__
    return mutate


@_nonempty
def m_flip(data: bytes, draw, ctx):
    out = bytearray(data)
    n = _int(draw, 1, 16, "flips")
    for _ in range(n):
        i = _pos(ctx, len(out))
        out[i] ^= 1 << _int(draw, 0, 7, "bit")
    return bytes(out), f"{n} bit flips", False


@_nonempty
def m_bytes(data: bytes, draw, ctx):
    out = bytearray(data)
    i = _pos(ctx, len(out))
    n = _int(draw, 1, 8, "n")
    out[i:i + n] = bytes(draw(_st().sampled_from([0x00, 0xFF, 0x7F, 0x80]), label="v") for _ in range(n))
    return bytes(out), f"{n} bytes set at {i}", False


@_nonempty
def m_truncate(data: bytes, draw, ctx):
    k = _pos(ctx, len(data))
    return data[:k], f"truncated to {k}", False


@_nonempty
def m_zero(data: bytes, draw, ctx):
    i = _pos(ctx, len(data))
    n = _int(draw, 1, 4096, "n")
    return data[:i] + b"\0" * min(n, len(data) - i) + data[i + n:], f"zeroed {n} at {i}", False


@_nonempty
def m_splice(data: bytes, draw, ctx):
    i = _pos(ctx, len(data))
    n = _int(draw, 1, 2048, "n")
    if draw(_st().booleans(), label="delete"):
        return data[:i] + data[i + n:], f"deleted {n} at {i}", False
    return data[:i] + data[i:i + n] + data[i:], f"duplicated {n} at {i}", False


BYTE_MUTATIONS = [m_flip, m_bytes, m_truncate, m_zero, m_splice]


def _zip_members(data: bytes) -> List[Tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i, z.read(i.filename)) for i in z.infolist()]


def _write_zip(members, compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    import warnings

    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", compression) as z:
        warnings.simplefilter("ignore")  # duplicated names are the point
        for name, payload in members:
            z.writestr(name, payload)
    return buf.getvalue()


def _headers(data: bytes):
    """Offsets of local (PK\\3\\4) and central (PK\\1\\2) headers."""
    local, central, i = [], [], 0
    while True:
        i = data.find(b"PK", i)
        if i < 0:
            return local, central
        if data[i:i + 4] == b"PK\x03\x04":
            local.append(i)
        elif data[i:i + 4] == b"PK\x01\x02":
            central.append(i)
        i += 2


def m_zip_header(data: bytes, draw, ctx):
    """Lies in a zip header: sizes, CRC, compression method, flags (encryption)."""
    local, central = _headers(data)
    if not local:
        return m_flip(data, draw, ctx)
    which = draw(_st().sampled_from(["local", "central"] if central else ["local"]), label="header")
    at = draw(_st().sampled_from(local if which == "local" else central), label="entry")
    # field offsets: local: flags 6, method 8, crc 14, csize 18, usize 22; central: +2
    shift = 0 if which == "local" else 2
    field = draw(_st().sampled_from(["flags", "method", "crc", "csize", "usize"]), label="field")
    off, fmt = {"flags": (6, "<H"), "method": (8, "<H"), "crc": (14, "<I"), "csize": (18, "<I"),
                "usize": (22, "<I")}[field]
    if field == "flags":
        value = draw(_st().sampled_from([0x1, 0x41, 0x8, 0x800, 0xFFFF]), label="v")
    elif field == "method":
        value = draw(_st().sampled_from([1, 6, 8, 9, 12, 14, 93, 95, 98, 99, 0xFFFF]), label="v")
    elif field == "crc":
        value = draw(_st().integers(0, 0xFFFFFFFF), label="v")
    else:
        value = draw(_st().sampled_from([0, 1, 100, 1 << 20, 1 << 30, 0xFFFFFFFE, 0xFFFFFFFF]), label="v")
    out = bytearray(data)
    struct.pack_into(fmt, out, at + off + shift, value)
    return bytes(out), f"zip {which} header {field}={value}", False


def m_zip_member(data: bytes, draw, ctx):
    """Whole-member edits: bombs, duplicated and traversal names, a member replaced or dropped."""
    members = [(i.filename, d) for i, d in _zip_members(data)]
    kind = draw(_st().sampled_from(["bomb", "ratio", "lying-bomb", "duplicate", "traversal", "drop", "deflate"]),
                label="kind")
    names = [n for n, _ in members]
    target = draw(_st().sampled_from(names), label="member")
    if kind == "bomb":
        size = _int(draw, 1, 256, "MiB") << 20
        members = [(n, b"\0" * size if n == target else d) for n, d in members]
        return _write_zip(members, zipfile.ZIP_DEFLATED), f"{target} -> {size >> 20} MiB of zeros, deflated", False
    if kind == "ratio":  # compresses about 100x: repeated short random runs
        rng = random.Random(_int(draw, 0, 1 << 30, "seed"))
        unit = bytes(rng.getrandbits(8) for _ in range(64)) + b"\0" * 6000
        size = _int(draw, 4, 64, "MiB") << 20
        payload = (unit * (size // len(unit) + 1))[:size]
        members = [(n, payload if n == target else d) for n, d in members]
        return _write_zip(members, zipfile.ZIP_DEFLATED), f"{target} -> {size >> 20} MiB at ~100x", False
    if kind == "lying-bomb":  # the header under-states the size
        size = _int(draw, 16, 512, "MiB") << 20
        out = bytearray(_write_zip([(n, b"\0" * size if n == target else d) for n, d in members], zipfile.ZIP_DEFLATED))
        local, central = _headers(bytes(out))
        for at in local:
            struct.pack_into("<I", out, at + 22, 4096)
        for at in central:
            struct.pack_into("<I", out, at + 24, 4096)
        return bytes(out), f"{target} -> {size >> 20} MiB of zeros, headers say 4096", False
    if kind == "duplicate":
        extra = draw(_st().sampled_from([d for _, d in members] + [b"{}", b""]), label="payload")
        return _write_zip(members + [(target, extra)]), f"{target} twice", False
    if kind == "traversal":
        name = draw(_st().sampled_from(["../evil", "/etc/evil", "a/../../evil", "C:\\evil", "x\\..\\y"]), label="name")
        return _write_zip(members + [(name, b"x")]), f"member {name!r}", False
    if kind == "drop":
        return _write_zip([(n, d) for n, d in members if n != target]), f"{target} dropped", False
    return _write_zip(members, zipfile.ZIP_DEFLATED), "all members deflated", False


# -- JSON ----------------------------------------------------------------------------------------
def _json_paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _json_paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _json_paths(v, path + (i,))


def _json_set(value, path, new):
    if not path:
        return new
    node = value
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return value


RAW_MARK = "@@RAW@@"
ODD_VALUES = [None, True, False, 0, -1, 1, 2, 3, 7, 2147483648, -2147483649, 1 << 63, 1e308, -1e308, 0.5, -0.0,
              float("inf"), float("-inf"), float("nan"), "", "x", "lstm", "LSTM", "Dense", "sigmoid", "same",
              "channels_first", [], {}, [None], [1, 2], {"class_name": 5}, {"class_name": "Foo", "config": {}},
              ["a", 0, 0], RAW_MARK + "1" + "0" * 5000, RAW_MARK + '"\\ud800"', RAW_MARK + '"\\udfff x"']


def m_json_value(text: str, draw) -> Tuple[str, str]:
    value = json.loads(text)
    paths = list(_json_paths(value))
    path = draw(_st().sampled_from(paths), label="path")
    kind = draw(_st().sampled_from(["replace", "replace", "replace", "delete", "deep", "unknown-class"]), label="kind")
    if kind == "delete" and path:
        parent = value
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
        return json.dumps(value), f"deleted {list(path)}"
    if kind == "deep":
        depth = draw(_st().sampled_from([50, 101, 1000, 5000, 100000]), label="depth")
        value = _json_set(value, path, RAW_MARK + "[" * depth + "]" * depth)
        desc = f"{list(path)} nested {depth} deep"
    elif kind == "unknown-class":
        classes = [p for p in paths if p and p[-1] == "class_name"]
        path = draw(_st().sampled_from(classes), label="class") if classes else path
        value = _json_set(value, path, draw(_st().sampled_from(["ConvLSTM9D", 5, None, ["LSTM"], "Lambda"]), label="v"))
        desc = f"{list(path)} unknown class"
    else:
        new = draw(_st().sampled_from(ODD_VALUES), label="value")
        value = _json_set(value, path, new)
        desc = f"{list(path)} = {str(new)[:40]}"
    text = json.dumps(value, allow_nan=True)
    # raw fragments (huge integers, lone surrogates, deep nesting) that json.dumps cannot write
    while RAW_MARK in text:
        i = text.index('"' + RAW_MARK)
        j = i + 1
        while True:  # the end of the JSON string literal that holds the marker
            j = text.index('"', j + 1)
            if text[j - 1] != "\\" or text[j - 2] == "\\":
                break
        raw = json.loads(text[i:j + 1])[len(RAW_MARK):]
        text = text[:i] + raw + text[j + 1:]
    return text, desc


def m_config(data: bytes, draw, ctx):
    """The model config, wherever the file keeps it, with one JSON edit."""
    if data[:2] == b"PK":
        members = [(i.filename, d) for i, d in _zip_members(data)]
        if "config.json" not in [n for n, _ in members]:
            return m_flip(data, draw, ctx)
        out = []
        for n, d in members:
            if n == "config.json":
                text, desc = m_json_value(d.decode(), draw)
                d = text.encode("utf-8", "surrogatepass")
            out.append((n, d))
        return _write_zip(out), f"config.json: {desc}", False

    def edit(f, draw):
        if "model_config" not in f.attrs:
            raise _Skip
        raw = f.attrs["model_config"]
        text, desc = m_json_value(raw.decode() if isinstance(raw, bytes) else str(raw), draw)
        f.attrs["model_config"] = np.bytes_(text.encode("utf-8", "surrogatepass"))
        return f"model_config: {desc}", False

    return _h5_edit(data, draw, edit, ctx)


# -- HDF5 ----------------------------------------------------------------------------------------
class _Skip(Exception):
    pass


def _h5_bytes_of(data: bytes) -> Tuple[bytes, Optional[Callable[[bytes], bytes]]]:
    """The HDF5 image inside a file (the weights member of a .keras) and how to put it back."""
    if data[:2] != b"PK":
        return data, None
    members = [(i.filename, d) for i, d in _zip_members(data)]
    h5 = dict(members)["model.weights.h5"]
    return h5, lambda new: _write_zip([(n, new if n == "model.weights.h5" else d) for n, d in members])


def _h5_edit(data: bytes, draw, edit, ctx):
    import h5py

    image, put_back = _h5_bytes_of(data)
    buf = io.BytesIO(image)
    try:
        with h5py.File(buf, "r+") as f:
            desc, must_refuse = edit(f, draw)
    except _Skip:
        return m_flip(data, draw, ctx)
    new = buf.getvalue()
    return (put_back(new) if put_back else new), desc, must_refuse


def _datasets(f) -> List[str]:
    import h5py

    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
    return out


def _groups(f) -> List[str]:
    import h5py

    out = []
    f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Group) else None)
    return out


def m_h5(data: bytes, draw, ctx):
    import h5py

    canary = ctx["canary"]
    kind = draw(_st().sampled_from(["shape", "dtype", "huge", "scalar", "soft", "soft-cycle", "external-link",
                                    "external-storage", "virtual", "virtual-missing", "hard-cycle", "alias",
                                    "layer-names", "weight-names", "filter", "delete", "string-data", "attr-type",
                                    "opaque"]),
                label="kind")

    def edit(f, draw):
        names = _datasets(f)
        groups = _groups(f)
        if not names:
            raise _Skip
        target = draw(_st().sampled_from(names), label="dataset")
        old = f[target]
        parent = f[target].parent
        leaf = target.rsplit("/", 1)[-1]
        if kind in ("shape", "dtype", "huge", "scalar", "filter", "string-data", "opaque"):
            arr = old[()]
            del f[target]
            if kind == "shape":
                shape = tuple(max(0, d + draw(_st().integers(-2, 2), label="delta")) for d in np.shape(arr)) or (2,)
                parent.create_dataset(leaf, data=np.zeros(shape, np.float32))
                return f"{target} reshaped to {shape}", False
            if kind == "dtype":
                dt = draw(_st().sampled_from(["f2", "f8", "i1", "u8", "c8", "S4", "?"]), label="dtype")
                parent.create_dataset(leaf, data=np.zeros(np.shape(arr), dt))
                return f"{target} as {dt}", False
            if kind == "opaque":  # Keras 3's bfloat16 form (2-byte opaque, tagged), or a lie about it
                size = draw(_st().sampled_from([1, 2, 4, 8]), label="opaque size")
                tag = draw(_st().sampled_from([b"NUMPY:V2", b"NUMPY:V8", b"bfloat16", b""]), label="opaque tag")
                tid = h5py.h5t.create(h5py.h5t.OPAQUE, size)
                if tag:
                    tid.set_tag(tag)
                shape = np.shape(arr) or (1,)
                dsid = h5py.h5d.create(parent.id, leaf.encode(), tid, h5py.h5s.create_simple(shape))
                count = int(np.prod(shape))
                dsid.write(h5py.h5s.ALL, h5py.h5s.ALL,
                           np.frombuffer(bytes(ctx["rng"].randrange(256) for _ in range(count * size)), f"V{size}")
                           .reshape(shape), mtype=tid)
                attr = draw(_st().sampled_from(["bfloat16", "float16", None]), label="dtype attribute")
                if attr is not None:
                    h5py.AttributeManager(h5py.Dataset(dsid))["dtype"] = attr
                return f"{target} as {size}-byte opaque data tagged {tag!r}, dtype attribute {attr!r}", False
            if kind == "huge":
                shape = draw(_st().sampled_from([(65536, 32768), (1 << 31,), (1 << 20, 1 << 20), (3, 1 << 40)]), label="shape")
                parent.create_dataset(leaf, shape=shape, dtype="f4")
                return f"{target} declared {shape}, never written", False
            if kind == "scalar":
                parent.create_dataset(leaf, data=np.float32(1.5))
                return f"{target} as a scalar", False
            if kind == "string-data":
                parent.create_dataset(leaf, data=np.array([b"abc"] * max(1, np.size(arr))))
                return f"{target} as strings", False
            parent.create_dataset(leaf, data=arr, compression="gzip", chunks=True)
            return f"{target} gzip-filtered", False
        if kind == "soft":
            del f[target]
            parent[leaf] = h5py.SoftLink(draw(_st().sampled_from(["/nowhere", "/" + names[0], "."]), label="to"))
            return f"{target} -> soft link", False
        if kind == "soft-cycle":
            del f[target]
            parent[leaf] = h5py.SoftLink("/" + target)
            return f"{target} -> soft link to itself", False
        if kind == "external-link":
            del f[target]
            parent[leaf] = h5py.ExternalLink(ctx["canary_h5"], "/data")
            return f"{target} -> external link", True
        if kind in ("external-storage", "virtual", "virtual-missing"):
            shape, dt = old.shape, old.dtype
            del f[target]
            if kind == "external-storage":
                nbytes = int(np.prod(shape)) * dt.itemsize
                parent.create_dataset(leaf, shape=shape, dtype=dt, external=[(canary, 0, max(nbytes, 1))])
                return f"{target} -> external raw storage", True
            layout = h5py.VirtualLayout(shape=shape, dtype=dt)
            source = ctx["canary_h5"] if kind == "virtual" else "/nonexistent/missing.h5"
            layout[...] = h5py.VirtualSource(source, "data", shape=shape, dtype=dt) if shape else h5py.VirtualSource(source, "data", shape=(1,))
            parent.create_virtual_dataset(leaf, layout, fillvalue=0)
            return f"{target} -> virtual dataset from {source}", True
        if kind == "hard-cycle":
            g = draw(_st().sampled_from(groups), label="group") if groups else None
            if g is None:
                raise _Skip
            f[g]["loop"] = f[g]
            return f"{g}/loop -> {g} (hard)", False
        if kind == "alias":
            others = [n for n in names if n != target]
            if not others:
                raise _Skip
            other = draw(_st().sampled_from(others), label="other")
            del f[target]
            parent[leaf] = f[other]
            return f"{target} -> hard link to {other}", False
        if kind in ("layer-names", "weight-names"):
            holders = [g for g in ["", "model_weights"] if (f[g] if g else f).attrs.get("layer_names") is not None]
            if not holders:
                raise _Skip
            holder = f[holders[0]] if holders[0] else f
            names_attr = list(holder.attrs["layer_names"])
            if kind == "layer-names":
                how = draw(_st().sampled_from(["dup", "many-dup", "missing", "drop", "reorder"]), label="how")
                if how == "dup":
                    names_attr.append(names_attr[0])
                elif how == "many-dup":
                    names_attr = names_attr * (20000 // max(1, len(names_attr)))
                elif how == "missing":
                    names_attr.append(b"no_such_layer")
                elif how == "drop":
                    names_attr = names_attr[1:]
                else:
                    names_attr = names_attr[::-1]
                holder.attrs["layer_names"] = np.array(names_attr, dtype="S")
                return f"layer_names {how}", False
            layer = draw(_st().sampled_from(names_attr), label="layer").decode()
            group = holder[layer]
            w = list(group.attrs.get("weight_names", []))
            how = draw(_st().sampled_from(["dup", "missing", "drop", "absolute", "dotdot"]), label="how")
            if how == "dup" and w:
                w.append(w[0])
            elif how == "missing":
                w.append(b"nowhere:0")
            elif how == "drop" and w:
                w = w[1:]
            elif how == "absolute":
                w.append(b"/" + target.encode())
            else:
                w.append(b"../" + layer.encode())
            group.attrs["weight_names"] = np.array(w, dtype="S")
            return f"{layer} weight_names {how}", False
        if kind == "delete":
            del f[target]
            return f"{target} deleted", False
        # attr-type: a text attribute of the wrong type
        holders = [o for o in (f, f.get("model_weights")) if o is not None]
        for h in holders:
            for a in ("layer_names", "keras_version", "model_config"):
                if a in h.attrs:
                    h.attrs[a] = draw(_st().sampled_from([np.arange(3.0), np.int64(5), np.zeros((2, 2), "S3")]), label="v")
                    return f"{a} attribute retyped", False
        raise _Skip

    return _h5_edit(data, draw, edit, ctx)


def m_pt(data: bytes, draw, ctx):
    """Edits of a converted .pt's contents (torch.save of plain data)."""
    import torch

    if data[:2] != b"PK":
        return m_flip(data, draw, ctx)
    obj = torch.load(io.BytesIO(data), weights_only=True)
    kind = draw(_st().sampled_from(["expand", "shape", "config", "drop-key", "state-key", "dtype", "type"]), label="kind")
    sd = obj["state_dict"]
    key = draw(_st().sampled_from(sorted(sd)), label="key")
    if kind == "expand":
        obj["state_dict"][key] = torch.zeros(1).expand(1 << 16, 1 << 16)
        desc = f"{key} a zero-stride 16 GiB view"
    elif kind == "shape":
        obj["state_dict"][key] = torch.zeros(tuple(d + 1 for d in sd[key].shape) or (3,))
        desc = f"{key} reshaped"
    elif kind == "config":
        text, desc = m_json_value(obj["keras_config"], draw)
        obj["keras_config"] = text
    elif kind == "drop-key":
        k = draw(_st().sampled_from(sorted(obj)), label="k")
        del obj[k]
        desc = f"{k} dropped"
    elif kind == "state-key":
        obj["state_dict"]["extra.weight"] = torch.zeros(2)
        desc = "extra state_dict key"
    elif kind == "dtype":
        obj["state_dict"][key] = sd[key].to(torch.int64)
        desc = f"{key} as int64"
    else:
        k = draw(_st().sampled_from(sorted(obj)), label="k")
        obj[k] = draw(_st().sampled_from([5, None, [1, 2], "x", {"a": 1}]), label="v")
        desc = f"{k} retyped"
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue(), desc, False


# ------------------------------------------------------------------------------------------------
# the worker: loads one mutant at a time and says what happened
# ------------------------------------------------------------------------------------------------
def _vm(pid="self", field="VmHWM") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _reset_peak(pid="self") -> None:
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _worker() -> None:
    import torch

    from cudnn_rnn.keras import ConversionError, load_converted, load_keras
    from cudnn_rnn.keras.files import isolation

    torch.set_num_threads(1)
    out = sys.stdout
    sys.stdout = sys.stderr
    for line in sys.stdin:
        job = json.loads(line)
        helper = isolation._HELPER.pid if isolation._HELPER is not None and isolation._HELPER.pid else None
        _reset_peak()
        base = _vm(field="VmRSS")
        helper_base = 0
        if helper:
            _reset_peak(helper)
            helper_base = _vm(helper, "VmRSS")
        result = {"outcome": "clean", "detail": ""}
        try:
            arch = job["arch"]
            if arch and arch.endswith(".json"):
                with open(arch) as f:
                    arch = f.read()
            model = load_converted(job["path"]) if job["loader"] == "converted" else load_keras(job["path"], architecture=arch)
        except ConversionError as e:
            result = {"outcome": "refused", "detail": str(e)[:300]}
            if len(str(e)) > 2000:
                result = {"outcome": "escape", "detail": f"a {len(str(e))}-character message: {str(e)[:200]}"}
        except BaseException as e:  # noqa: BLE001
            result = {"outcome": "escape", "detail": f"{type(e).__name__}: {str(e)[:300]}"}
        else:
            declared = False
            try:
                with torch.no_grad():
                    model(*model.example_inputs())
                    declared = True
                    for module in model.modules():  # a stateful layer (a config may make one) starts over:
                        if hasattr(module, "reset_states"):  # the next inputs' batch may differ
                            module.reset_states()
                    if job["npz"]:
                        stored = np.load(job["npz"])
                        # (by position, or by the model's input names: a dict model's fixture)
                        names = [f"input_{k}" for k in (model.input_keys or [])]
                        keys = [f"input_{i}" for i in range(len(model.input_specs))]
                        keys = keys if all(k in stored.files for k in keys) or not names else names
                        inputs = [stored[k] for k in keys if k in stored.files]
                        inputs = [x if x.dtype.kind in "USO" else torch.as_tensor(x) for x in inputs]  # (strings)
                        # (the fixture's inputs where they fit the mutated model's declared shapes, and the
                        # batch it runs at only, where its trial found one)
                        if len(inputs) == len(model.input_specs) and all(
                                len(x.shape) == len(s) and all(d is None or d == n for d, n in zip(s[1:], x.shape[1:]))
                                and model.batch_size in (None, x.shape[0])
                                for x, (_, s) in zip(inputs, model.input_specs)):
                            model(*inputs)
            except BaseException as e:  # noqa: BLE001
                outside = declared and isinstance(e, IndexError) and "ids must be in [" in str(e) and "layer '" in str(e)
                result = {"outcome": "domain" if outside else "first-call",
                          "detail": f"{type(e).__name__}: {str(e)[:300]}"}
            else:
                if job["must_refuse"]:
                    result = {"outcome": "outside", "detail": "loaded although it points outside the file"}
                elif _has_canary(model):
                    result = {"outcome": "outside", "detail": "the canary file's bytes are in the weights"}
        grew = _vm() - base
        if isolation._HELPER is not None and isolation._HELPER.pid:
            if isolation._HELPER.pid == helper:
                grew = max(grew, _vm(helper) - helper_base)
        result["grew_mb"] = grew >> 20
        if grew > MEMORY_LIMIT and result["outcome"] in ("clean", "refused", "domain"):
            result = {"outcome": "memory", "detail": f"grew by {grew >> 20} MiB ({result['detail'][:200]})",
                      "grew_mb": grew >> 20}
        out.write(json.dumps(result) + "\n")
        out.flush()


def _has_canary(model) -> bool:
    marks = np.frombuffer(CANARY[:16], np.float32)
    for p in list(model.parameters()) + list(model.buffers()):
        a = p.detach().float().reshape(-1).numpy()
        if a.size and np.isin(marks, a).sum() >= 3:
            return True
    return False


class Worker:
    def __init__(self):
        env = dict(os.environ, CUDNN_RNN_PARSE_TIMEOUT=PARSE_TIMEOUT_S, KERAS_BACKEND="torch",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fuzz_checkpoints", "--worker"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def run(self, job: dict, timeout: float) -> dict:
        import selectors

        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        if not ready:
            self.close()
            return {"outcome": "hang", "detail": f"no answer in {timeout:.0f} s"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"outcome": "crash", "detail": f"worker exited with {code}"}
        return json.loads(line)

    def close(self):
        self.proc.kill()
        self.proc.wait()


# ------------------------------------------------------------------------------------------------
# the driver
# ------------------------------------------------------------------------------------------------
MUTATIONS = {
    "bytes": BYTE_MUTATIONS,
    "zip-header": [m_zip_header],
    "zip-member": [m_zip_member],
    "config": [m_config],
    "h5": [m_h5],
    "pt": [m_pt],
}
FAILURES = ("escape", "first-call", "outside", "memory", "hang", "crash")


def windows_tree(src: str, dst: str, tree: str = "_layer_checkpoint_dependencies") -> None:
    """src (a Keras 3 .keras file) as tf.keras 2.13-2.15 wrote such files on Windows: each
    object's group at the root, named with backslashes (`tree\\lstm\\cell`), its `vars` below it."""
    import io
    import zipfile

    import h5py

    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    buf = io.BytesIO(members["model.weights.h5"])
    with h5py.File(buf, "r+") as f:
        owners = []
        f["layers"].visititems(lambda name, obj: owners.append(name) if name.endswith("vars") else None)
        for owner in owners:
            f.copy(f["layers/" + owner], f.create_group("\\".join([tree] + owner.split("/")[:-1])), "vars")
        del f["layers"]
    members["model.weights.h5"] = buf.getvalue()
    with zipfile.ZipFile(dst, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def prepare(workdir: str) -> Dict[str, dict]:
    """The seed files (copied, plus a converted .pt and the canary) in workdir."""
    import h5py

    bases = {}
    canary = os.path.join(workdir, "canary.bin")
    with open(canary, "wb") as f:
        f.write(CANARY * 64)
    canary_h5 = os.path.join(workdir, "canary.h5")
    with h5py.File(canary_h5, "w") as f:
        f["data"] = np.frombuffer(CANARY * 64, np.float32).reshape(-1)[:4096]
    for name, file, arch, npz, loader in BASES:
        path = os.path.join(workdir, file)
        if loader == "converted":
            from cudnn_rnn.keras import load_keras, save_converted

            save_converted(load_keras(os.path.join(DATA, file.replace(".pt", ".keras"))), path)
        elif loader == "windows":
            path = os.path.join(workdir, "windows_tree.keras")
            windows_tree(os.path.join(DATA, file), path)
            loader = "keras"
        else:
            shutil.copy(os.path.join(DATA, file), path)
        bases[name] = {"path": path, "arch": os.path.join(DATA, arch) if arch else None,
                       "npz": os.path.join(DATA, npz) if npz else None, "loader": loader}
    bases.update(_live_bases(workdir))
    return {"bases": bases, "canary": canary, "canary_h5": canary_h5}


def _live_bases(workdir: str) -> Dict[str, dict]:
    """Six more models written by Keras 3 itself (when it is installed), in each of its formats:
    a Bidirectional LSTM behind a masking Embedding, GRU(reset_after=False) + SimpleRNN, a
    two-input functional model, Conv1D / BatchNormalization / LayerNormalization / LSTM, a video
    model (TimeDistributed convolution and pooling, ConvLSTM2D, MaxPooling3D, GroupQueryAttention,
    Dot, recorded operations) and a signal model (Rescaling, ZeroPadding, SeparableConv1D,
    Conv1DTranspose, GroupNormalization, PReLU, Cropping, UpSampling, EinsumDense, RMSNormalization)."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError:
        return {}
    from keras import layers

    keras.utils.set_random_seed(7)
    models = {
        "bilstm": keras.Sequential([keras.Input((7,), dtype="int32"), layers.Embedding(30, 8, mask_zero=True),
                                    layers.Bidirectional(layers.LSTM(6, return_sequences=True)),
                                    layers.Bidirectional(layers.LSTM(5)), layers.Dense(3)]),
        "gru-simple": keras.Sequential([keras.Input((None, 4)), layers.GRU(6, reset_after=False, return_sequences=True),
                                        layers.SimpleRNN(5), layers.Dense(2, activation="softmax")]),
        "conv-norm": keras.Sequential([keras.Input((9, 4)), layers.Conv1D(6, 3, padding="causal"),
                                       layers.BatchNormalization(), layers.LayerNormalization(), layers.LSTM(5),
                                       layers.Dense(2)]),
    }
    a, b = keras.Input((None, 4)), keras.Input((None, 3))
    x = layers.Concatenate()([layers.LSTM(4, return_sequences=True)(a), layers.GRU(4, return_sequences=True)(b)])
    models["two-input"] = keras.Model([a, b], [layers.Dense(2)(layers.GlobalAveragePooling1D()(x)), layers.LSTM(3)(x)])
    # the layer library around recurrent layers: pooling, convolutions, shape, merging, normalisation,
    # preprocessing, attention and recorded operations
    v = keras.Input((4, 8, 6, 1))
    h = layers.TimeDistributed(layers.Conv2D(3, 3, padding="same"))(v)
    h = layers.TimeDistributed(layers.MaxPooling2D(2))(h)
    h = layers.ConvLSTM2D(2, 3, padding="same", return_sequences=True)(h)
    h = layers.MaxPooling3D((1, 2, 2), padding="same")(h)
    h = layers.TimeDistributed(layers.GlobalAveragePooling2D())(h)
    h = layers.LSTM(4, return_sequences=True)(h)
    q = layers.GroupQueryAttention(head_dim=2, num_query_heads=2, num_key_value_heads=1)(h, h)
    d = layers.Dot(axes=-1, normalize=True)([layers.GlobalMaxPooling1D()(q), layers.Dense(4)(layers.Flatten()(h))])
    models["video"] = keras.Model(v, [d, keras.ops.mean(q, axis=1)[:, 1:]])
    t = keras.Input((12, 3))
    g = layers.Rescaling(0.5, offset=0.1)(t)
    g = layers.ZeroPadding1D((1, 2))(g)
    g = layers.SeparableConv1D(4, 3, depth_multiplier=2)(g)
    g = layers.Conv1DTranspose(3, 3, strides=2, padding="same")(g)
    g = layers.GroupNormalization(groups=3)(g)
    g = layers.PReLU(shared_axes=[1])(g)
    g = layers.Cropping1D((1, 1))(g)
    g = layers.UpSampling1D(2)(g)
    g = layers.AveragePooling1D(2)(g)
    g = layers.EinsumDense("abc,cd->abd", output_shape=(None, 5), bias_axes="d")(g)
    g = layers.RMSNormalization()(g)
    models["signal"] = keras.Model(t, layers.Bidirectional(layers.GRU(3))(g))
    bases = {}
    for name, model in models.items():
        stem = os.path.join(workdir, f"live-{name}")
        model.save(stem + ".keras")
        model.save_weights(stem + ".weights.h5")
        model.save(stem + ".h5")
        for fmt, path, arch in (("keras", stem + ".keras", None), ("weights", stem + ".weights.h5", stem + ".keras"),
                                ("legacy", stem + ".h5", None)):
            bases[f"live-{name}-{fmt}"] = {"path": path, "arch": arch, "npz": None, "loader": "keras"}
    return bases


def mutant(ctx: dict, draw) -> Tuple[dict, bytes, str, bool]:
    from hypothesis import strategies as st

    ctx = dict(ctx, rng=draw(st.randoms(use_true_random=False), label="rng"))
    name = draw(st.sampled_from(sorted(ctx["bases"])), label="base")
    base = ctx["bases"][name]
    with open(base["path"], "rb") as f:
        data = f.read()
    kinds = ["bytes", "bytes", "config", "h5"]
    if data[:2] == b"PK":
        kinds += ["zip-header", "zip-member"]
    if base["loader"] == "converted":
        kinds = ["bytes", "bytes", "zip-header", "zip-member", "pt", "pt"]
    kind = draw(st.sampled_from(kinds), label="kind")
    fn = draw(st.sampled_from(MUTATIONS[kind]), label="mutation")
    try:
        new, desc, must_refuse = fn(data, draw, ctx)
    except Exception:  # noqa: BLE001 - a mutation that does not apply to this file (h5py refuses the edit)
        new, desc, must_refuse = m_flip(data, draw, ctx)
    if draw(st.integers(0, 9), label="twice") == 0:  # sometimes a second, byte-level mutation on top
        new, more, _ = m_flip(new, draw, ctx)
        desc += f"; {more}"
    return base, new, f"{name}: {fn.__name__}: {desc}", must_refuse


def fuzz(seconds: float, seed: int, max_examples: Optional[int] = None, save: Optional[str] = None,
         log=print, reasons: Optional[Dict[str, int]] = None) -> Tuple[Dict[str, int], List[str]]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed
    from hypothesis.errors import HypothesisException
    from hypothesis import strategies as st

    counts: Dict[str, int] = {}
    failures: List[str] = []
    workdir = tempfile.mkdtemp(prefix="fuzz-ckpt-")
    ctx = prepare(workdir)
    worker = [Worker()]
    deadline = time.monotonic() + seconds
    done = [0]
    peak = [0]

    def one(data):
        base, new, desc, must_refuse = mutant(ctx, data.draw)
        ext = os.path.splitext(base["path"])[1]
        path = os.path.join(workdir, f"mutant{ext}")
        with open(path, "wb") as f:
            f.write(new)
        job = dict(base, path=path, must_refuse=must_refuse)
        result = worker[0].run(job, MUTANT_TIMEOUT_S)
        if result["outcome"] in ("hang", "crash"):
            worker[0] = Worker()
        done[0] += 1
        outcome = result["outcome"]
        counts[outcome] = counts.get(outcome, 0) + 1
        peak[0] = max(peak[0], result.get("grew_mb", 0))
        if outcome == "refused" and reasons is not None:
            reason = result["detail"].split(": ", 1)[-1][:70]
            reasons[reason] = reasons.get(reason, 0) + 1
        if outcome in FAILURES:
            failures.append(f"{outcome}: {desc}: {result['detail']}")
            log(f"FAIL {failures[-1]}")
            if save:
                os.makedirs(save, exist_ok=True)
                keep = os.path.join(save, f"{len(failures):04d}-{outcome}{ext}")
                shutil.copy(path, keep)
                with open(keep + ".txt", "w") as f:
                    f.write(f"{failures[-1]}\narchitecture: {base['arch']}\n")

    chunk = 0
    try:
        while time.monotonic() < deadline and (max_examples is None or done[0] < max_examples):
            n = 50 if max_examples is None else max(1, min(50, max_examples - done[0]))
            runner = settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
                              suppress_health_check=list(HealthCheck))(hseed(seed * 100_003 + chunk)(given(st.data())(one)))
            try:
                runner()
            except HypothesisException as e:  # the generator's own bookkeeping, not a finding
                log(f"hypothesis: {type(e).__name__}")
            chunk += 1
            log(f"[{done[0]} mutants] " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                + f"; largest memory growth {peak[0]} MiB")
    finally:
        worker[0].close()
        shutil.rmtree(workdir, ignore_errors=True)
    return counts, failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--long", action="store_true", help="30 minutes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="a directory to keep the failing mutants in")
    parser.add_argument("--reasons", action="store_true", help="print the most common refusal messages")
    args = parser.parse_args(argv)
    if args.worker:
        _worker()
        return 0
    minutes = 30.0 if args.long else args.minutes
    start = time.monotonic()
    reasons: Dict[str, int] = {}
    counts, failures = fuzz(minutes * 60, args.seed, save=args.save, log=lambda s: print(s, flush=True), reasons=reasons)
    if args.reasons:
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:80]:
            print(f"{n:6d}  {reason}")
    total = sum(counts.values())
    print(f"{total} mutants in {(time.monotonic() - start) / 60:.1f} min (seed {args.seed}): "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for f in failures[:50]:
        print(f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
