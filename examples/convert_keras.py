"""The main job: a Keras model file in, a PyTorch module out, checked against Keras.

examples/sentiment.h5 is a small text classifier saved by tf.keras (legacy HDF5: Embedding with
mask_zero, Bidirectional LSTM, GRU with reset_after=False and Keras 2's hard_sigmoid gates), and
examples/sentiment_expected.npz holds the probabilities Keras computed on left-padded token
sequences (both written by tests/fixtures/make_fixtures.py). This script needs neither Keras nor
TensorFlow: it converts the file, runs it, prints the largest difference from Keras's outputs,
which backend runs each recurrent layer, and saves the converted model.
"""
import os
import sys
import time

import numpy as np
import torch

import cudnn_rnn
from cudnn_rnn.keras import load_converted, recurrent_layer, save_converted

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    source = os.path.join(HERE, "sentiment.h5")
    expected = np.load(os.path.join(HERE, "sentiment_expected.npz"))
    model = cudnn_rnn.load_keras(source)
    print(f"loaded {os.path.basename(source)} (written by Keras {model.keras_version}): "
          f"{sum(p.numel() for p in model.parameters())} parameters")

    tokens = torch.as_tensor(expected["tokens"])
    start = time.perf_counter()
    with torch.no_grad():
        probabilities = model(tokens)
    elapsed = (time.perf_counter() - start) * 1e3
    error = float(np.abs(probabilities.numpy() - expected["probabilities"]).max())
    print(f"input {tuple(tokens.shape)} -> output {tuple(probabilities.shape)} in {elapsed:.1f} ms; "
          f"max |ours - Keras| = {error:.2e}")
    mask = tokens != 0  # Embedding(mask_zero=True): every recurrent layer here sees this mask
    for name, module in model.layers.items():
        layer = recurrent_layer(module)
        if layer is not None:
            print(f"  {name:14s} backend {cudnn_rnn.explain(layer, tokens.device)}; "
                  f"on a GPU with this data: {cudnn_rnn.explain(layer, 'cuda', mask=mask)}")

    out = os.path.join(HERE, "sentiment_converted.pt")
    save_converted(model, out)
    with torch.no_grad():
        again = load_converted(out)(tokens)
    print(f"saved {os.path.basename(out)}; reloaded without the Keras file: identical = {torch.equal(again, probabilities)}")
    if error > 1e-5:
        sys.exit(f"mismatch against Keras: {error:.2e}")


if __name__ == "__main__":
    main()
