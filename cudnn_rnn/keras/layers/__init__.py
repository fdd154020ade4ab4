"""The layer library: one module per family of Keras layers, each filling the one registry
(registry.py: BUILDERS, keyed by Keras class name) with its @builder functions as it is imported.
Importing this package imports every family, so BUILDERS here is complete; the loader takes it
from here, never from registry.py.

    core            InputLayer, Identity, Dense, Embedding, Masking
    activations     the activation functions and Activation, ReLU, ELU, LeakyReLU, PReLU, Softmax
    shape           Flatten, Reshape, Permute, RepeatVector, Cropping, ZeroPadding, UpSampling
    merging         Concatenate, Add, Subtract, Multiply, Average, Maximum, Minimum, Dot
    normalization   Batch / Layer / Group / RMS / Unit normalisation
    regularization  Dropout, SpatialDropout, GaussianNoise, GaussianDropout, AlphaDropout, ...
    pooling         Max / Average, Global and Adaptive pooling, 1-D to 3-D
    convolution     Conv, ConvTranspose, DepthwiseConv, SeparableConv
    preprocessing   numeric preprocessing saved inside models (FeatureSpace's layers among them), and
                    the image augmentation layers
    text            TextVectorization and StringLookup (the strings a model takes)
    recurrent       LSTM, GRU, SimpleRNN, RNN(cell), Bidirectional (recurrent.py)
    conv_recurrent  ConvLSTM1D/2D/3D and their Bidirectional
    attention       Attention, AdditiveAttention, MultiHeadAttention
    wrappers        TimeDistributed of any of these
    ops             the Keras operations a functional graph records (not layers: build_op), with
                    ops_numpy, ops_nn and ops_math
    ops_tf          tf.keras 2's recorded TensorFlow calls (TFOpLambda, SlicingOpLambda)
    applications    the classes keras.applications defines outside keras.layers (LayerScale, ...)
    custom          the user's own classes (load_keras(..., custom_layers=...))

base.py (the one-input module, data-format helpers) and values.py (typed config reads, weight
shape checks) are what the families share.
"""
from __future__ import annotations

from . import (activations, applications, attention, audio, conv_recurrent, convolution, core, merging,  # noqa: F401
               normalization, ops, ops_tf, pooling, preprocessing, recurrent, regularization, shape, text,
               wrappers)
from .registry import BUILDERS, HOLDS_WEIGHTS

__all__ = ["BUILDERS", "HOLDS_WEIGHTS"]
