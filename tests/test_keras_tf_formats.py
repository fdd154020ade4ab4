"""tf.keras 2's TensorFlow formats (SavedModel directories, TensorFlow weights checkpoints), read
without TensorFlow: malformed and hostile ones are refused with one ConversionError naming the
file and what is wrong, and a seeded mutation run over the real fixtures (made by tf.keras 2.21
through tests/fixtures/make_fixtures.py) finds no other outcome. The fixtures' numbers are checked
against tf.keras in test_keras_fixtures.py."""
import json
import os
import random
import shutil

import numpy as np
import pytest
import torch

from cudnn_rnn.keras import ConversionError, load_keras
from cudnn_rnn.keras.files import tf_formats

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "data")
SAVED = "tfk_saved_model"                 # with traced functions: each layer's `variables` list
UNTRACED = "tfk_frame_cnn_saved_model"    # save_traces=False: weights found by the object graph
CKPT = "tfk_frame_cnn_ckpt"               # model.save_weights("ckpt")
PRE25 = "tfk_frame_cnn_saved_model_pre25"  # the metadata in saved_model.pb, as TensorFlow < 2.5 wrote it


def _copy(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(os.path.join(DATA, name), dst)
    return dst


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _metadata_file(nodes) -> bytes:
    """A SavedMetadata message: (node id, node path, metadata JSON) per node."""
    out = b""
    for node_id, path, meta in nodes:
        body = (_varint(2 << 3) + _varint(node_id) if node_id else b"") + _field(3, path.encode()) + \
            _field(5, json.dumps(meta).encode())
        out += _field(1, body)
    return out


def _root_metadata(path) -> dict:
    buf = (path / "keras_metadata.pb").read_bytes()
    return json.loads(tf_formats._metadata_nodes(buf)[0])


def test_a_subclassed_model_or_a_serving_export_is_named(tmp_path):
    """A SavedModel whose root has no model config (a subclassed model), and one with no
    keras_metadata.pb at all (Keras 3's model.export(), TensorFlow's own), say what they are."""
    saved = _copy(tmp_path, SAVED)
    meta = _root_metadata(saved)
    meta.pop("model_config")
    meta["class_name"] = "MyModel"
    (saved / "keras_metadata.pb").write_bytes(_metadata_file([(0, "root", meta)]))
    with pytest.raises(ConversionError, match=r"holds a Keras object \(MyModel\) without a model config: a subclassed"):
        load_keras(saved)
    (saved / "keras_metadata.pb").unlink()  # and saved_model.pb holds none (as TensorFlow 2.5+ writes it)
    with pytest.raises(ConversionError, match=r"is a TensorFlow SavedModel without Keras metadata .*model.export"):
        load_keras(saved)
    (saved / "saved_model.pb").unlink()
    with pytest.raises(ConversionError, match=r"is a directory; expected a Keras file: .*a SavedModel directory"):
        load_keras(saved)


def test_encoded_tuples_become_lists():
    """SavedModel metadata writes a config's tuples and shapes as {"class_name": "__tuple__",
    "items": [...]}: they reach the layers as the lists a .h5 config holds."""
    config = {"a": {"class_name": "__tuple__", "items": [None, 3, {"class_name": "__tuple__", "items": [1]}]},
              "b": [{"class_name": "TensorShape", "items": [2, 2]}], "c": {"class_name": "Dense", "items": 1, "x": 2}}
    assert tf_formats.untuple(config) == {"a": [None, 3, [1]], "b": [[2, 2]], "c": config["c"]}


def test_weights_checkpoints_need_an_architecture_and_directories_name_them(tmp_path):
    ckpt = _copy(tmp_path, CKPT)
    with pytest.raises(ConversionError, match="holds weights only; pass architecture="):
        load_keras(ckpt / "ckpt")
    with pytest.raises(ConversionError, match=r"is a directory; .*TensorFlow checkpoint: pass its prefix.*ckpt"):
        load_keras(ckpt)
    # a checkpoint for another model: the layer count is named
    with pytest.raises(ConversionError, match="the file has weights for 4 layers"):
        load_keras(ckpt / "ckpt", architecture=os.path.join(DATA, "tfk_sequential.h5"))


def _index_entries(path):
    return tf_formats.read_index((path).read_bytes())


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[:-8] + b"\0" * 8, "is not a TensorFlow checkpoint index"),
    (lambda b: b[:20], "is not a TensorFlow checkpoint index"),
    (lambda b: b"", "is not a TensorFlow checkpoint index"),
])
def test_damaged_index_is_named(tmp_path, damage, message):
    saved = _copy(tmp_path, SAVED)
    index = saved / "variables" / "variables.index"
    index.write_bytes(damage(index.read_bytes()))
    with pytest.raises(ConversionError, match=f"variables/variables.index: {message}"):
        load_keras(saved)


def test_compressed_block_is_named(tmp_path):
    saved = _copy(tmp_path, SAVED)
    index = saved / "variables" / "variables.index"
    data = bytearray(index.read_bytes())
    # the data block's trailer: the compression byte right after the first block (at offset 0)
    footer = len(data) - 48
    _, _, pos = tf_formats._block_handle(data, footer, len(data))
    offset, size, _ = tf_formats._block_handle(data, pos, len(data))
    first = next(iter(tf_formats._block(memoryview(bytes(data)), offset, size)))[1]
    block_offset, block_size, _ = tf_formats._block_handle(first, 0, len(first))
    data[block_offset + block_size] = 1  # snappy
    index.write_bytes(bytes(data))
    with pytest.raises(ConversionError, match="a block is compressed"):
        load_keras(saved)


def test_missing_or_short_data_is_named(tmp_path):
    saved = _copy(tmp_path, SAVED)
    shard = saved / "variables" / "variables.data-00000-of-00001"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(ConversionError, match="lies past the end of its data file"):
        load_keras(saved)
    shard.unlink()
    with pytest.raises(ConversionError, match="has no variables/variables.data-00000-of-00001"):
        load_keras(saved)


def test_missing_or_short_data_in_a_weights_checkpoint(tmp_path):
    ckpt = _copy(tmp_path, CKPT)
    (ckpt / "ckpt.data-00000-of-00001").unlink()
    with pytest.raises(ConversionError, match=r"ckpt: has no ckpt.data-00000-of-00001"):
        load_keras(ckpt / "ckpt", architecture=os.path.join(DATA, UNTRACED))


def _raw_entries(data: bytes):
    """(key, value bytes) of every entry of a checkpoint index, in order."""
    buf = memoryview(data)
    _, _, pos = tf_formats._block_handle(buf, len(buf) - 48, len(buf))
    offset, size, _ = tf_formats._block_handle(buf, pos, len(buf))
    out = []
    for _, handle in tf_formats._block(buf, offset, size):
        o, n, _ = tf_formats._block_handle(handle, 0, len(handle))
        out += [(k, bytes(v)) for k, v in tf_formats._block(buf, o, n)]
    return out


def _table(entries) -> bytes:
    """A LevelDB table as TensorFlow writes an index: one data block, an index block, the footer."""
    def block(items):
        body = b"".join(_varint(0) + _varint(len(k)) + _varint(len(v)) + k + v for k, v in items)
        return body + (0).to_bytes(4, "little") + (1).to_bytes(4, "little")

    data = block(entries)
    index = block([(entries[-1][0], _varint(0) + _varint(len(data)))])
    meta = block([])
    out = data + b"\0\0\0\0\0"
    index_at = len(out)
    out += index + b"\0\0\0\0\0"
    meta_at = len(out)
    out += meta + b"\0\0\0\0\0"
    handles = _varint(meta_at) + _varint(len(meta)) + _varint(index_at) + _varint(len(index))
    return out + handles.ljust(40, b"\0") + tf_formats.TABLE_MAGIC.to_bytes(8, "little")


def _entry(dtype, shape, offset, size) -> bytes:
    dims = b"".join(_field(2, _varint(1 << 3) + _varint(d)) for d in shape)
    return _varint(1 << 3) + _varint(dtype) + _field(2, dims) + _varint(4 << 3) + _varint(offset) + \
        _varint(5 << 3) + _varint(size)


@pytest.mark.parametrize("shape,message", [
    ((1 << 32, 1 << 32), "declares shape"),           # a product that wraps past 2**64 in int64
    ((3, 5, 7), "declares shape"),
    ((2,) * 9, "has more than 8 dimensions"),
])
def test_a_shape_that_lies_about_its_size(tmp_path, shape, message):
    """An entry whose shape does not match its byte count is refused before anything is read."""
    saved = _copy(tmp_path, SAVED)
    index = saved / "variables" / "variables.index"
    entries = _raw_entries(index.read_bytes())
    assert _table(entries) and tf_formats.read_index(_table(entries)) == tf_formats.read_index(index.read_bytes())
    decoded = tf_formats.read_index(index.read_bytes())
    key = next(k for k in decoded if k.endswith("kernel/.ATTRIBUTES/VARIABLE_VALUE"))
    dtype, _, _, offset, size = decoded[key]
    entries = [(k, _entry(dtype, shape, offset, size) if k.decode() == key else v) for k, v in entries]
    index.write_bytes(_table(entries))
    with pytest.raises(ConversionError, match=message):
        load_keras(saved)


def test_a_graph_that_is_not_a_string_and_a_cycle(tmp_path):
    """The object graph entry must be a string scalar; a graph whose nodes point back at their
    parents is walked once per object."""
    saved = _copy(tmp_path, UNTRACED)
    index = saved / "variables" / "variables.index"
    entries = _raw_entries(index.read_bytes())
    decoded = tf_formats.read_index(index.read_bytes())
    _, _, _, offset, size = decoded[tf_formats.GRAPH_KEY]
    bad = [(k, _entry(1, (size // 4,), offset, size // 4 * 4) if k.decode() == tf_formats.GRAPH_KEY else v)
           for k, v in entries]
    original = index.read_bytes()
    index.write_bytes(_table(bad))
    with pytest.raises(ConversionError, match="is not a string scalar"):
        load_keras(saved)
    index.write_bytes(original)
    # each object also lists itself and the root as children: the walk still ends, each variable
    # once per layer; the self-references change nothing
    graph = tf_formats._Checkpoint(str(saved / "variables" / "variables"), "x", "x", str(saved)).graph()
    names, keys, _ = tf_formats._layers(graph)
    assert sum(len(v) for v in keys.values()) == 21
    looped = [([(i, "self")] + children, attributes) for i, (children, attributes) in enumerate(graph)]
    assert tf_formats._layers(looped)[:2] == (names, keys)
    cyclic = [([(0, "back")] + children, attributes) for children, attributes in graph]
    for weights in tf_formats._layers(cyclic)[1].values():
        assert len(weights) == len(set(weights)) <= 21
    # a stateful model's kept states, found the same through such loops, each once
    stateful = os.path.join(DATA, "tfk_stateful_saved_model")
    graph = tf_formats._Checkpoint(os.path.join(stateful, "variables", "variables"), "x", "x", stateful).graph()
    states = tf_formats._layers(graph)[2]
    assert sum(len(v) for v in states.values()) == 2 + 2 + 5 + 2  # LSTM, Bidirectional GRU, 3 cells, ConvLSTM
    # (a nested model's layers, by their paths, where the metadata names them)
    from cudnn_rnn.keras.files.containers import load_json
    assert "inner/gru_1" in tf_formats.saved_model_parts(stateful, load_json)[5]
    lists = {c for children, _ in graph for c, n in children if n == "variables"}  # (layer.weights, kept in order)
    looped = [(children if i in lists else [(i, "self"), (0, "back")] + children, attributes)
              for i, (children, attributes) in enumerate(graph)]
    assert tf_formats._layers(looped)[2] == states


def test_sizes_past_the_limits_are_refused(tmp_path, monkeypatch):
    """Keys longer than a checkpoint key can be, and object graphs with more references than the
    limit, are refused before they are held in memory."""
    saved = _copy(tmp_path, UNTRACED)
    index = saved / "variables" / "variables.index"
    entries = _raw_entries(index.read_bytes())
    original = index.read_bytes()
    index.write_bytes(_table(entries + [(b"~" * 5000, entries[-1][1])]))
    with pytest.raises(ConversionError, match="a key is longer than 4096 bytes"):
        load_keras(saved)
    index.write_bytes(original)
    monkeypatch.setattr(tf_formats, "MAX_REFERENCES", 50)
    with pytest.raises(ConversionError, match="holds more than 50 references"):
        load_keras(saved)


def test_links_out_of_the_directory_are_refused(tmp_path):
    """A member of a SavedModel or of an unzipped Keras model directory that is a link to a file
    elsewhere is refused (a link cannot bring another file's bytes into the model)."""
    import zipfile

    saved = _copy(tmp_path, SAVED)
    shard = saved / "variables" / "variables.data-00000-of-00001"
    outside = tmp_path / "elsewhere.data"
    shard.rename(outside)
    shard.symlink_to(outside)
    with pytest.raises(ConversionError, match=r"variables/variables.data-00000-of-00001 lies outside .* \(a link to"):
        load_keras(saved)
    unzipped = tmp_path / "unzipped"
    with zipfile.ZipFile(os.path.join(DATA, "k3_lookup.keras")) as z:
        z.extractall(unzipped)
    vocabulary = next(unzipped.glob("assets/**/vocabulary.txt"))
    (tmp_path / "secret.txt").write_text("secret\n")
    vocabulary.unlink()
    vocabulary.symlink_to(tmp_path / "secret.txt")
    with pytest.raises(ConversionError, match=r"assets/.*vocabulary.txt lies outside"):
        load_keras(unzipped)


def test_repeated_objects_are_refused():
    """A layer whose variable list names one variable twice, a layer-K that is the model itself or
    another layer, and an index whose keys repeat (one block listed twice) are refused."""
    graph = tf_formats._Checkpoint(os.path.join(DATA, SAVED, "variables", "variables"), "x", "x",
                                   os.path.join(DATA, SAVED)).graph()
    names, keys, _ = tf_formats._layers(graph)
    layer = next(c for c, n in graph[0][0] if n.startswith("layer-") and any(
        m == "variables" and graph[v][0] for v, m in graph[c][0]))
    listed = next(v for v, m in graph[layer][0] if m == "variables")
    twice = [list(x) for x in graph]
    twice[listed] = ([(graph[listed][0][0][0], "0"), (graph[listed][0][0][0], "1")], {})
    with pytest.raises(tf_formats._Bad, match="a variable twice"):
        tf_formats._layers(twice)
    for target in (0, layer):
        again = [list(x) for x in graph]
        again[0] = (graph[0][0] + [(target, "layer-99")], {})
        with pytest.raises(tf_formats._Bad, match="layer-99 is object .*, which is the model or another layer"):
            tf_formats._layers(again)
    with open(os.path.join(DATA, SAVED, "variables", "variables.index"), "rb") as f:
        entries = _raw_entries(f.read())
    with pytest.raises(tf_formats._Bad, match="keys are out of order"):
        tf_formats.read_index(_table(entries + entries[1:]))


def _mutate(data: bytes, rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    b = bytearray(data)
    if not b:
        return bytes([rng.randrange(256)])
    if kind == 0:  # flip bits
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:  # random bytes
        i = rng.randrange(len(b))
        b[i:i + rng.randint(1, 16)] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == 2:  # truncate
        del b[rng.randrange(len(b)):]
    elif kind == 3:  # large varint-looking runs
        i = rng.randrange(len(b))
        b[i:i + 10] = b"\xff" * rng.randint(1, 12)
    else:  # splice a range elsewhere
        i, j = sorted(rng.randrange(len(b)) for _ in range(2))
        k = rng.randrange(len(b))
        b[k:k] = b[i:j][:4096]
    return bytes(b)


MUTATED = [(SAVED, "keras_metadata.pb"), (SAVED, "variables/variables.index"),
           (SAVED, "variables/variables.data-00000-of-00001"), (UNTRACED, "variables/variables.index"),
           (UNTRACED, "variables/variables.data-00000-of-00001"), (PRE25, "saved_model.pb")]


@pytest.mark.parametrize("fixture,member", MUTATED, ids=[f"{a}/{b}" for a, b in MUTATED])
def test_mutated_files_are_refused_or_load(tmp_path, fixture, member):
    """60 seeded mutants of each member: each either loads and runs on the fixture's inputs, or is
    refused with ConversionError; nothing else escapes."""
    saved = _copy(tmp_path, fixture)
    target = saved / member
    original = target.read_bytes()
    npz = np.load(os.path.join(DATA, f"{UNTRACED if fixture == PRE25 else fixture}.npz"))
    inputs = [torch.as_tensor(npz[k]) for k in sorted(k for k in npz.files if k.startswith("input_"))]
    rng = random.Random(f"{fixture}/{member}")
    outcomes = {"loaded": 0, "refused": 0}
    for _ in range(60):
        target.write_bytes(_mutate(original, rng))
        try:
            model = load_keras(saved)
        except ConversionError:
            outcomes["refused"] += 1
            continue
        with torch.no_grad():
            model(*inputs)
        outcomes["loaded"] += 1
    assert outcomes["refused"] > 0, outcomes


def test_a_checkpoint_root_with_a_counter_or_two_models():
    """A tf.train.Checkpoint root holding the model beside a step counter and the optimizer is
    read through the one child that holds layers; a root holding two models (a GAN's generator and
    discriminator) is refused naming them."""
    prefix = os.path.join(DATA, "tfk_step_ckpt", "ckpt-1")
    graph = tf_formats._Checkpoint(prefix, "x", "x", os.path.join(DATA, "tfk_step_ckpt")).graph()
    roots = [n for _, n in graph[0][0]]
    assert {"step", "model", "optimizer"} <= set(roots)
    names, _, _ = tf_formats._layers(graph)
    assert len(names) == 3  # the Input, the Bidirectional, the Dense
    model = next(c for c, n in graph[0][0] if n == "model")
    two = [list(x) for x in graph]
    two[0] = (graph[0][0] + [(model, "discriminator")], {})
    with pytest.raises(tf_formats._Bad, match=r"holds several Keras models \('model', 'discriminator'\)"):
        tf_formats._layers(two)
