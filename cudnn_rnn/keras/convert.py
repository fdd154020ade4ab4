"""Saving a converted model to one file that reloads without the Keras checkpoint.

The file is a torch.save of plain data (strings, lists, tensors): the Keras config and version,
the weights as read (by layer, Keras order) and the module's state_dict. It loads with
torch.load(weights_only=True), so reading it executes nothing."""
from __future__ import annotations

import json

import torch

from .errors import ConversionError

FORMAT = "cudnn_rnn.keras/1"


def save_converted(model, path) -> None:
    weights = {name: [[[torch.as_tensor(a) for a in group] for group in take] for take in takes]
               for name, takes in model.keras_weights.items()}
    torch.save({"format": FORMAT, "keras_config": json.dumps(model.keras_config),
                "keras_version": model.keras_version or "", "keras_weights": weights,
                "state_dict": model.state_dict()}, path)


def load_converted(path, dtype=torch.float32):
    """The model save_converted wrote, rebuilt and checked against its saved state_dict."""
    from . import rebuild

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a bad file
        raise ConversionError(path, f"is not a readable converted model ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConversionError(path, f"is not a cudnn_rnn converted model (expected format {FORMAT})")
    weights = {name: [[[t.numpy() for t in group] for group in take] for take in takes]
               for name, takes in data["keras_weights"].items()}
    model = rebuild(json.loads(data["keras_config"]), data["keras_version"] or None, weights, dtype, str(path))
    model.load_state_dict(data["state_dict"])
    return model
