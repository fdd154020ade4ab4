"""The populated layer registry: importing the modules that hold the builders runs their
@builder decorators, so BUILDERS here maps every supported Keras class name to its builder.

registry.py defines BUILDERS and is the bottom; the builders live by concern: basic_layers.py
(Dense, Embedding, merges, normalization, ...), sequence_layers.py (Conv1D, pooling,
TimeDistributed), recurrent.py (LSTM, GRU, SimpleRNN, RNN, Bidirectional), conv_recurrent.py
(ConvLSTM1D/2D/3D) and attention_layers.py (Attention, AdditiveAttention, MultiHeadAttention). The activations they
share are in activations.py, and the Keras operations recorded in functional graphs (not layers)
in recorded_ops.py. The loader takes BUILDERS from here, never from registry.py.
"""
from __future__ import annotations

from . import attention_layers, basic_layers, conv_recurrent, recurrent, sequence_layers  # noqa: F401 - their @builder decorators fill BUILDERS
from .registry import BUILDERS

__all__ = ["BUILDERS"]
