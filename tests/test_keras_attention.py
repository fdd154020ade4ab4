"""Attention, AdditiveAttention and MultiHeadAttention beside recurrent encoders and decoders,
against Keras 3 itself (torch backend): random seq2seq models (encoder and decoder of different
lengths, masks from Embedding mask_zero or Masking, decoders started from the encoder's states,
every score mode and option, causal masks, returned scores, the context concatenated with the
decoder's outputs) saved in each Keras 3 format and loaded with load_keras, within 1e-5. tf.keras
2's versions of the same layers are a fixture (tfk_attention, test_keras_fixtures.py)."""
import json

import numpy as np
import pytest
import torch

from keras_oracle import keras  # noqa: F401  (sets KERAS_BACKEND=torch before importing keras)
from keras import layers

from cudnn_rnn.keras import ConversionError, load_keras

B, TV, TQ = 3, 7, 5
ATOL = RTOL = 1e-5


def _rnn(rng, units, **kw):
    kind = str(rng.choice(["LSTM", "GRU", "SimpleRNN"]))
    return getattr(layers, kind)(units, return_sequences=True, **kw), kind


def _attention(rng, dim):
    """(layer, call kwargs, whether it returns scores) of a random attention layer."""
    kind = str(rng.choice(["Attention", "AdditiveAttention", "MultiHeadAttention"]))
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
    if att_kind == "MultiHeadAttention":
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
@pytest.mark.parametrize("seed", range(32))
def test_random_attention_models_match_keras(seed, tmp_path):
    model, xs = random_model(seed)
    expected = [keras.ops.convert_to_numpy(t) for t in keras.tree.flatten(model(xs, training=False))]
    model.save(tmp_path / "m.keras")
    model.save_weights(tmp_path / "m.weights.h5")
    model.save(tmp_path / "m.h5")
    for path, arch in ((tmp_path / "m.keras", None), (tmp_path / "m.weights.h5", str(tmp_path / "m.keras")),
                       (tmp_path / "m.h5", None)):
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
    mha["config"]["attention_axes"] = [0, 1]
    with pytest.raises(ConversionError, match=r"layer 'mha'.*attention_axes=\[0, 1\]; only attention over the time"):
        load_keras(tmp_path / "w.weights.h5", architecture={"class_name": "Functional", "config": config})
