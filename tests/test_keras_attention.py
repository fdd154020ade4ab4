"""Attention, AdditiveAttention and MultiHeadAttention beside recurrent encoders and decoders,
against Keras 3 itself (torch backend): random seq2seq models (encoder and decoder of different
lengths, masks from Embedding mask_zero or Masking, decoders started from the encoder's states,
every score mode and option, causal masks, returned scores, the context concatenated with the
decoder's outputs) saved in each Keras 3 format and loaded with load_keras, within 1e-5. tf.keras
2's versions of the same layers are a fixture (tfk_attention, test_keras_fixtures.py)."""
import json
import os

import h5py
import numpy as np
import pytest
import torch

from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)
from keras import layers
from keras.src.legacy.saving import legacy_h5_format

from cudnn_rnn.keras import ConversionError, load_keras

B, TV, TQ = 3, 7, 5
ATOL = RTOL = 1e-5


def _rnn(rng, units, **kw):
    kind = str(rng.choice(["LSTM", "GRU", "SimpleRNN"]))
    return getattr(layers, kind)(units, return_sequences=True, **kw), kind


def _attention(rng, dim):
    """(layer, call kwargs, whether it returns scores) of a random attention layer."""
    kind = str(rng.choice(["Attention", "AdditiveAttention", "MultiHeadAttention", "GroupedQueryAttention"]))
    call = {}
    if rng.rand() < 0.3:
        call["use_causal_mask"] = True
    scores = bool(rng.rand() < 0.3)
    if scores:
        call["return_attention_scores"] = True
    if kind == "Attention":
        layer = layers.Attention(use_scale=bool(rng.rand() < 0.5), score_mode=str(rng.choice(["dot", "concat"])))
    elif kind == "AdditiveAttention":
        layer = layers.AdditiveAttention(use_scale=bool(rng.rand() < 0.7))
    elif kind == "GroupedQueryAttention":
        kv_heads = int(rng.randint(1, 3))
        kw = dict(head_dim=int(rng.randint(1, 5)), num_query_heads=kv_heads * int(rng.randint(1, 3)),
                  num_key_value_heads=kv_heads, use_bias=bool(rng.rand() < 0.8), use_gate=bool(rng.rand() < 0.3))
        if rng.rand() < 0.3:
            kw["dropout"] = 0.2  # inference: no dropout, but Keras's other softmax path
        if rng.rand() < 0.2:
            kw["sliding_window"] = int(rng.randint(1, 4))
        layer = layers.GroupQueryAttention(**kw)
    else:
        kw = dict(num_heads=int(rng.randint(1, 4)), key_dim=int(rng.randint(1, 5)), use_bias=bool(rng.rand() < 0.8))
        if rng.rand() < 0.4:
            kw["value_dim"] = int(rng.randint(1, 5))
        if rng.rand() < 0.3:
            kw["output_shape"] = int(rng.randint(2, 6))
        if rng.rand() < 0.3:
            kw["use_gate"] = True
        if rng.rand() < 0.3:
            kw["dropout"] = 0.2  # inference: no dropout, but Keras's other softmax path
        layer = layers.MultiHeadAttention(**kw)
    return layer, kind, call, scores


def random_model(seed):
    rng = np.random.RandomState(seed)
    units = int(rng.randint(2, 6))
    tokens = rng.rand() < 0.5
    if tokens:
        enc_in, dec_in = keras.Input((TV,), dtype="int32"), keras.Input((TQ,), dtype="int32")
        embed = layers.Embedding(12, 4, mask_zero=True)
        enc_x, dec_x = embed(enc_in), embed(dec_in)
    else:
        enc_in, dec_in = keras.Input((TV, 4)), keras.Input((TQ, 3))
        enc_x, dec_x = layers.Masking(0.0)(enc_in), layers.Masking(0.0)(dec_in)
    enc_rnn, kind = _rnn(rng, units, return_state=True)
    enc, *states = enc_rnn(enc_x)
    dec_rnn = getattr(layers, kind)(units, return_sequences=True)
    # (Keras 3 runs a decoder called with initial_state unmasked: test_keras_rnn_cells.py)
    dec = dec_rnn(dec_x, initial_state=states) if rng.rand() < 0.5 else dec_rnn(dec_x)
    layer, att_kind, call, scores = _attention(rng, units)
    if att_kind in ("MultiHeadAttention", "GroupedQueryAttention"):
        out = layer(dec, enc, **call) if rng.rand() < 0.6 else layer(query=dec, value=enc, key=enc, **call)
    else:
        out = layer([dec, enc] if rng.rand() < 0.7 else [dec, enc, enc], **call)
    context, weights = (out[0], out[1]) if scores else (out, None)
    h = layers.Concatenate()([dec, context]) if rng.rand() < 0.5 else context
    h = layers.GRU(3)(h) if rng.rand() < 0.5 else layers.TimeDistributed(layers.Dense(3, activation="tanh"))(h)
    model = keras.Model([enc_in, dec_in], [h] + ([weights] if weights is not None else []))
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    if tokens:
        xs = [rng.randint(1, 12, size=(B, TV)).astype("int32"), rng.randint(1, 12, size=(B, TQ)).astype("int32")]
    else:
        xs = [rng.uniform(-1, 1, size=(B, TV, 4)).astype("float32"), rng.uniform(-1, 1, size=(B, TQ, 3)).astype("float32")]
    for x, t in zip(xs, (TV, TQ)):  # right padding, left padding, a fully padded query row
        x[1, t - 2:] = 0
        x[2, :2] = 0
    xs[1][0] = 0
    return model, xs


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(40))
def test_random_attention_models_match_keras(seed, tmp_path):
    model, xs = random_model(seed)
    expected = [keras.ops.convert_to_numpy(t) for t in keras.tree.flatten(model(xs, training=False))]
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "m.weights.h5")
    model.save(tmp_path / "m.h5")
    with h5py.File(tmp_path / "legacy.weights.h5", "w") as f:  # Keras 2's weights-only layout, by layer order
        legacy_h5_format.save_weights_to_hdf5_group(f, model)
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.weights.h5", str(tmp_path / "m.keras")),
                       (tmp_path / "m.h5", None), (tmp_path / "legacy.weights.h5", model.to_json())):
        ours = load_keras(path, architecture=arch)
        with torch.no_grad():
            y = ours(*[torch.as_tensor(x) for x in xs])
        y = y if isinstance(y, list) else [y]
        assert len(y) == len(expected)
        for i, (a, b) in enumerate(zip(y, expected)):
            np.testing.assert_allclose(a.numpy(), b, atol=ATOL, rtol=RTOL, err_msg=f"{path.name} output {i}")


@pytest.mark.keras
def test_attention_mask_tensor_and_sliding_window(tmp_path):
    rng = np.random.RandomState(1)
    x_in, m_in = keras.Input((TV, 4)), keras.Input((TV, TV), dtype="bool")
    h = layers.LSTM(4, return_sequences=True)(layers.Masking(0.0)(x_in))
    out = layers.MultiHeadAttention(2, 3, sliding_window=2)(h, h, attention_mask=m_in)
    model = keras.Model([x_in, m_in], out)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    x = rng.uniform(-1, 1, (B, TV, 4)).astype("float32")
    x[1, 5:] = 0
    m = rng.rand(B, TV, TV) < 0.7
    expected = keras.ops.convert_to_numpy(model([x, m]))
    model.save(tmp_path / "m.keras")
    with torch.no_grad():
        y = load_keras(tmp_path / "m.keras")(torch.as_tensor(x), torch.as_tensor(m))
    np.testing.assert_allclose(y.numpy(), expected, atol=ATOL, rtol=RTOL)


@pytest.mark.keras
def test_unsupported_attention_options_are_refused_by_name(tmp_path):
    q = keras.Input((TV, 4))
    model = keras.Model(q, layers.MultiHeadAttention(2, 3, name="mha")(q, q))
    model.save_weights(tmp_path / "w.weights.h5")
    config = json.loads(model.to_json())["config"]
    mha = next(l for l in config["layers"] if l["class_name"] == "MultiHeadAttention")
    mha["config"]["attention_axes"] = [0, 1]  # (the batch axis: Keras's call fails too)
    with pytest.raises(ConversionError, match=r"layer 'mha'.*attention_axes=\(0, 1\) do not fit inputs of shape"):
        load_keras(tmp_path / "w.weights.h5", architecture={"class_name": "Functional", "config": config})


@pytest.mark.keras
@pytest.mark.parametrize("q_shape,v_shape,axes,scores", [
    ((5, 4, 6), (5, 3, 6), None, False),        # rank 4: both middle axes at once
    ((5, 4, 6), (5, 3, 6), (2,), True),         # the second; the first a batch axis
    ((5, 4, 6), (7, 4, 6), (-3,), False),       # the first, counted from the input's rank
    ((2, 3, 4, 6), (2, 5, 2, 6), (2, 3), True),  # rank 5
])
def test_multi_head_attention_over_other_axes(q_shape, v_shape, axes, scores, tmp_path):
    """MultiHeadAttention over the axes attention_axes picks of rank 4 and 5 inputs (Keras's
    einsum equations: the other axes are batch axes, one softmax over all the key's attention
    positions), its scores in Keras's layout; a mask there is refused at the call, naming it."""
    rng = np.random.RandomState(11)
    q, v = keras.Input(q_shape), keras.Input(v_shape)
    out = layers.MultiHeadAttention(2, 3, value_dim=4, attention_axes=axes, name="mha")(
        q, v, return_attention_scores=scores)
    model = keras.Model([q, v], list(out) if scores else out)
    for w in model.weights:
        w.assign(rng.uniform(-0.5, 0.5, w.shape).astype("float32"))
    model.save(tmp_path / "m.keras")
    xq, xv = rng.rand(2, *q_shape).astype("float32"), rng.rand(2, *v_shape).astype("float32")
    expected = model([xq, xv])
    converted = load_keras(tmp_path / "m.keras")
    got = converted(torch.from_numpy(xq), torch.from_numpy(xv))
    for g, e in zip(got if scores else [got], expected if scores else [expected]):
        np.testing.assert_allclose(g.detach().numpy(), keras.ops.convert_to_numpy(e), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"MultiHeadAttention over the axes .*: masks \(value\) are supported over "
                                         r"the time axis"):
        converted.layer("mha")([torch.from_numpy(xq), torch.from_numpy(xv)], [None, torch.ones(2, *v_shape[:-1]) > 0])


@pytest.mark.keras
def test_explicit_masks_scalar_weights_and_export_round_trip(tmp_path):
    """Attention called with an explicit mask list (both masks used), an LSTM called with an
    explicit mask and initial states (Keras 3 masks it: only a mask it would fill in is dropped),
    Attention's 0-d scale weights kept 0-d (save_keras writes back what Keras reloads), and the
    CLI's exports with encoder and decoder lengths each their own dynamic size."""
    import subprocess
    import sys

    import cudnn_rnn
    import onnxruntime as ort

    rng = np.random.RandomState(2)
    enc_in, dec_in = keras.Input((None, 4)), keras.Input((None, 4))  # free lengths, each its own
    m_in = keras.Input((None,), dtype="bool")
    enc, h, c = layers.LSTM(4, return_sequences=True, return_state=True)(enc_in, mask=m_in)
    dec_mask = keras.Input((None,), dtype="bool")
    dec = layers.LSTM(4, return_sequences=True)(dec_in, mask=dec_mask, initial_state=[h, c])
    att = layers.Attention(use_scale=True, score_mode="concat")([dec, enc], mask=[None, m_in])
    model = keras.Model([enc_in, dec_in, m_in, dec_mask], att)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    xe, xd = rng.uniform(-1, 1, (B, TV, 4)).astype("float32"), rng.uniform(-1, 1, (B, TQ, 4)).astype("float32")
    m = np.ones((B, TV), bool)
    m[1, 4:] = False
    md = np.ones((B, TQ), bool)
    md[2, 3:] = False
    expected = keras.ops.convert_to_numpy(model([xe, xd, m, md]))
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    with torch.no_grad():
        got = ours(*[torch.as_tensor(a) for a in (xe, xd, m, md)]).numpy()
    np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL)
    scale = [p for n, p in ours.named_parameters() if "scale" in n or "concat" in n]
    assert scale and all(p.dim() == 0 for p in scale)
    cudnn_rnn.save_keras(ours, tmp_path / "back.keras")
    back = keras.saving.load_model(tmp_path / "back.keras", compile=False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(back([xe, xd, m, md])), expected, atol=ATOL, rtol=RTOL)

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for suffix in (".pt2", ".onnx"):
        out = subprocess.run([sys.executable, "-m", "cudnn_rnn", "convert", str(tmp_path / "m.keras"),
                              str(tmp_path / f"m{suffix}")], cwd=root, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "KERAS_BACKEND": "torch"})
        assert out.returncode == 0, out.stdout + out.stderr
    te, td = 9, 3  # other lengths than the saved model's, and not equal to each other
    xe2, xd2 = rng.uniform(-1, 1, (2, te, 4)).astype("float32"), rng.uniform(-1, 1, (2, td, 4)).astype("float32")
    m2, md2 = np.ones((2, te), bool), np.ones((2, td), bool)
    m2[0, 6:] = False
    arrays = (xe2, xd2, m2, md2)
    with torch.no_grad():
        want = ours(*[torch.as_tensor(a) for a in arrays]).numpy()
    program = torch.export.load(str(tmp_path / "m.pt2"))
    with torch.no_grad():
        exported = program.module()(*[torch.as_tensor(a) for a in arrays]).numpy()
    np.testing.assert_allclose(exported, want, atol=ATOL, rtol=RTOL)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"))
    feeds = dict(zip([i.name for i in session.get_inputs()], arrays))
    np.testing.assert_allclose(session.run(None, feeds)[0], want, atol=ATOL, rtol=RTOL)


def _mha_readers(kind):
    """A model where a MultiHeadAttention and other layers read the same masked tensors."""
    q_in, v_in = keras.Input((TQ,), dtype="int32"), keras.Input((TV,), dtype="int32")
    hq = layers.LSTM(4, return_sequences=True)(layers.Embedding(12, 4, mask_zero=True)(q_in))
    hv = layers.GRU(4, return_sequences=True)(layers.Embedding(12, 4, mask_zero=True)(v_in))
    mha = layers.MultiHeadAttention(2, 3)
    if kind == "mha-then-additive":
        outs = [mha(hq, hv), layers.AdditiveAttention()([hq, hv])]
    elif kind == "additive-then-mha":
        outs = [layers.AdditiveAttention()([hq, hv]), mha(hq, hv)]
    elif kind == "mha-then-lstm":  # the LSTM reads hq after MultiHeadAttention: unmasked in Keras 3
        outs = [mha(hq, hv), layers.LSTM(4, return_sequences=True)(hq)]
    else:  # two MultiHeadAttention calls on one value, then an Attention
        outs = [mha(hq, hv), layers.MultiHeadAttention(1, 2)(hq, hv), layers.Attention()([hq, hv])]
    return keras.Model([q_in, v_in], layers.GRU(3)(layers.Concatenate()(outs)))


@pytest.mark.keras
@pytest.mark.parametrize("kind", ["mha-then-additive", "additive-then-mha", "mha-then-lstm", "two-mha-then-attention"])
def test_multi_head_attention_deletes_the_masks_it_reads(kind, tmp_path):
    """Keras 3's MultiHeadAttention deletes the Keras masks of its query, value and key, so a
    layer Keras runs after it (keras_run_order: by depth, then the order Keras reached the
    nodes) reads those tensors unmasked, one run before it masked. Outputs as Keras 3 computes
    them, .keras and legacy .h5."""
    rng = np.random.RandomState(11)
    model = _mha_readers(kind)
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype("float32") for w in model.get_weights()])
    xs = [rng.randint(1, 12, size=(B, TQ)).astype("int32"), rng.randint(1, 12, size=(B, TV)).astype("int32")]
    xs[0][1, 3:] = 0
    xs[1][2, :3] = 0
    xs[1][0, 4] = 0
    expected = keras.ops.convert_to_numpy(model(xs, training=False))
    model.save(tmp_path / "m.keras")
    model.save(tmp_path / "m.h5")
    for path in (tmp_path / "m.keras", tmp_path / "m.h5"):
        ours = load_keras(str(path))
        with torch.no_grad():
            got = ours(*[torch.from_numpy(x).long() for x in xs]).numpy()
        np.testing.assert_allclose(got, expected, atol=ATOL, rtol=RTOL, err_msg=str(path.name))


@pytest.mark.keras
def test_keras_run_order_is_keras_own(tmp_path):
    """keras_run_order (cudnn_rnn/keras/graph.py) against the order Keras 3 itself runs a
    functional graph in (Functional._nodes_by_depth, deepest first): the random models above and
    the MultiHeadAttention ones."""
    from cudnn_rnn.keras.graph.spec import keras_run_order

    models = [random_model(seed)[0] for seed in range(12)] + [_mha_readers(k) for k in
                                                              ("mha-then-additive", "two-mha-then-attention")]
    for i, model in enumerate(models):
        model.save(tmp_path / f"m{i}.keras")
        order = keras_run_order(load_keras(str(tmp_path / f"m{i}.keras")).spec)
        ours = [node for node, _ in sorted(order.items(), key=lambda e: e[1])]
        theirs = [(n.operation.name, n.operation._inbound_nodes.index(n))
                  for d in sorted(model._nodes_by_depth, reverse=True) for n in model._nodes_by_depth[d]]
        assert ours == theirs, f"model {i}"


@pytest.mark.keras
@pytest.mark.parametrize("seed", range(16))
def test_random_attention_models_train_as_keras(seed, tmp_path):
    """The gradient of a fixed projection of the outputs with respect to every trainable weight,
    against Keras's autograd (torch backend), in Keras's layout: query rows whose every key is
    masked included (Keras runs torch's fused attention there, whose backward we share)."""
    from test_keras_layer_library import _keras_layout_grads

    model, xs = random_model(seed)
    rng = np.random.RandomState(100 + seed)
    xk = [torch.as_tensor(x) for x in xs]
    outs = keras.tree.flatten(model(xk, training=False))
    projections = [torch.as_tensor(rng.uniform(-1, 1, size=tuple(o.shape)).astype("float32")) for o in outs]
    sum((o * p).sum() for o, p in zip(outs, projections)).backward()
    model.save(tmp_path / "m.keras")
    ours = load_keras(tmp_path / "m.keras")
    got = ours(*xk)
    got = got if isinstance(got, list) else [got]
    sum((o * p).sum() for o, p in zip(got, projections)).backward()
    compared = 0
    for layer in model.layers:
        if not layer.trainable_weights:
            continue
        grads = _keras_layout_grads(ours.layer(layer.name))
        assert len(grads) == len(layer.weights), layer.name
        for g, w in zip(grads, layer.weights):
            if w.trainable:
                expected = w.value.grad.numpy()
                np.testing.assert_allclose(g.numpy(), expected, rtol=1e-4,
                                           atol=1e-4 * max(1.0, float(np.abs(expected).max())), err_msg=w.path)
                compared += 1
    assert compared >= 8
